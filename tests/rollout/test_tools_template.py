"""Tool results rendered by the model's chat template (``rollout.tools.render``): the probe of what a
template renders, the observation tokens equal to the template's own tool turn (and masked from the
loss), the eos left out where it is the template's end of turn, the start-up check, and a real
(unscripted) tool rollout of a tiny model with a Hermes-style template."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import stepcredit.rollout.tool_render as rt
import stepcredit.rollout.turns as turn_loop
from stepcredit.cli import main as cli
from stepcredit.config import ModelConfig, ProcessConfig, TinyModelConfig, ToolsConfig
from stepcredit.errors import ConfigError
from stepcredit.models import load_policy
from stepcredit.process.segment import segment_episodes
from stepcredit.rollout.engines import Completion
from stepcredit.tools import PARSERS, hermes_template, probe_tool_template, schemas, tool_turn_text
from stepcredit.types import Sample

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
# the built-in tiny tokenizer's own turn markup: <|user|> ... <|end|>; its eos is </s>
TINY_TURNS = {"turn_start": "<|{role}|>", "turn_end": "<|end|>"}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*12"}}\n</tool_call>'
PROMPT = ({"role": "user", "content": "QA: what is 12*12?"},)


@pytest.fixture(scope="module")
def policy() -> tuple[Any, Any]:
    torch.manual_seed(0)
    return load_policy(SMALL, seed=0)


def with_template(tok: Any, **turns: str) -> Any:
    t = copy.deepcopy(tok)
    t.chat_template = hermes_template(**turns)
    return t


def ids(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def scripted(monkeypatch: pytest.MonkeyPatch, turns: list[str]) -> None:
    """Sampling replaced: turn k (k = results appended so far) writes ``turns[k]``; a final turn ends with eos."""

    class Scripted:
        def sample(
            self, model: Any, tok: Any, contexts: list[list[int]], spec: Any, *, budgets: list[int]
        ) -> list:
            out = []
            for ctx, room in zip(contexts, budgets, strict=True):
                k = tok.decode(ctx, skip_special_tokens=True).count(
                    "<tool_response>\n"
                )  # not the system turn's mention
                got = ids(tok, turns[k]) + ([] if k + 1 < len(turns) else [tok.eos_token_id])
                out.append(Completion(got[:room]))
            return out

    monkeypatch.setattr(turn_loop, "engine_for", lambda model: Scripted())


def run(generate: Any, model: Any, tok: Any, tools: ToolsConfig, *, T: int = 400) -> Any:
    sample = Sample(prompt=PROMPT, ground_truth="144", data_source="arith_tools")
    return generate(model, tok, [sample], tools, n=1, max_new_tokens=T, temperature=0.0)


def test_probe_tells_which_templates_render_tool_turns(policy: Any) -> None:
    _, tok = policy
    # the built-in template prints any non-user role as an assistant turn but never the call
    t = probe_tool_template(tok)
    assert not t.renders and "tool_calls" in t.why_not and not t.schemas
    # a generic template that prints every role (as SmolLM2's ChatML one does) renders the tool
    # message but not the call: not a tool template either
    generic = copy.deepcopy(tok)
    generic.chat_template = "{% for m in messages %}<|user|>{{ m.role }}: {{ m.content }}<|end|>{% endfor %}"
    assert not probe_tool_template(generic).renders and "tool_calls" in probe_tool_template(generic).why_not
    h = probe_tool_template(with_template(tok, **TINY_TURNS))
    assert h.renders and h.end_of_turn == "<|end|>" and h.schemas


def test_observation_is_the_templates_tool_turn(
    policy: Any, monkeypatch: pytest.MonkeyPatch, tool_generate: Any
) -> None:
    model, base = policy
    tok = with_template(base, **TINY_TURNS)
    scripted(monkeypatch, [CALL, "The answer is 144."])
    b, c = run(tool_generate, model, tok, ToolsConfig(names=("calculator",), parser="hermes"))
    assert c["tools/calls"] == 1 and c["tools/failed_calls"] == 0
    # the template's text between the call and the next assistant turn, written out by hand from
    # hermes_template: end of the assistant turn, the result as a user turn, the assistant header
    turn = "<|end|><|user|><tool_response>\n144\n</tool_response><|end|><|assistant|>"
    offered = schemas(["calculator"])
    assert tool_turn_text(tok, "144", prompt=PROMPT, call="calculator", tools=offered) == turn
    # ... and the same tokens as the difference of the two renderings, tokenized whole
    call_msg = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*12"}}}
        ],
    }
    before = ids(tok, tok.apply_chat_template([*PROMPT, call_msg], tools=offered, tokenize=False))
    after = ids(
        tok,
        tok.apply_chat_template(
            [*PROMPT, call_msg, {"role": "tool", "content": "144"}],
            tools=offered,
            add_generation_prompt=True,
            tokenize=False,
        ),
    )
    cut = len(before) - len(ids(tok, "<|end|>"))
    assert after[:cut] == before[:cut]
    resp = b.response_ids_BT[0][b.attention_BT()[0]].tolist()
    n_call = len(ids(tok, CALL))
    assert resp[n_call : n_call + len(after) - cut] == after[cut:]
    # those tokens and no others are the observation: attended to, out of the loss mask, log-prob 0
    obs = b.observation_BT[0]
    assert obs.nonzero().flatten().tolist() == list(range(n_call, len(after) - cut + n_call))
    assert not (b.response_mask_BT & b.observation_BT).any()
    assert (b.behaviour_logp_BT[0][obs] == 0).all()
    # the whole context is the template's conversation token for token: prompt + call + tool turn +
    # answer (the template writes the call exactly as the policy did)
    prompt = b.prompt_ids_BP[0][b.prompt_mask_BP[0]].tolist()
    assert prompt + resp == after + ids(tok, "The answer is 144.") + [tok.eos_token_id]
    assert b.texts[0].startswith(CALL + "<tool_response>\n144\n</tool_response>")
    # turns are still the episodes, from the marks the rollout recorded: the first ends at the call's
    # last token, not inside the markup
    marks = obs[b.attention_BT()[0]].tolist()
    assert segment_episodes(resp, tok, ProcessConfig(), marks) == [n_call - 1, len(resp) - 1]
    # what `stepcredit explain` marks as the result: from the call's end through </tool_response>
    text = tok.decode(resp, skip_special_tokens=False)
    [(a, z)] = PARSERS.get("hermes").observation_spans(text)
    assert (a, text[a:z]) == (len(CALL), "<|end|><|user|><tool_response>\n144\n</tool_response>")


def test_eos_end_of_turn_is_left_out(
    policy: Any, monkeypatch: pytest.MonkeyPatch, tool_generate: Any
) -> None:
    # A ChatML-like template whose turns end with the eos (</s> here, <|im_end|> for SmolLM2): a
    # response ends at its first eos, so the tool turn is the template's tokens without the eos ones.
    model, base = policy
    tok = with_template(base, turn_start="<|{role}|>", turn_end="</s>")
    assert probe_tool_template(tok).end_of_turn == "</s>"
    scripted(monkeypatch, [CALL, "The answer is 144."])
    b, _ = run(tool_generate, model, tok, ToolsConfig(names=("calculator",), parser="hermes"))
    turn = tool_turn_text(tok, "144", prompt=PROMPT, call="calculator", tools=schemas(["calculator"]))
    assert turn == "</s><|user|><tool_response>\n144\n</tool_response></s><|assistant|>"
    want = [i for i in ids(tok, turn) if i != tok.eos_token_id]
    obs = b.response_ids_BT[0][b.observation_BT[0]].tolist()
    assert obs == want and tok.eos_token_id not in obs
    assert not b.truncated_B[0] and b.texts[0].endswith("The answer is 144.")
    resp = b.response_ids_BT[0][b.attention_BT()[0]].tolist()
    marks = b.observation_BT[0][b.attention_BT()[0]].tolist()
    assert segment_episodes(resp, tok, ProcessConfig(), marks)[0] == len(ids(tok, CALL)) - 1


def test_result_cannot_write_markup_and_convention_is_kept(policy: Any) -> None:
    _, base = policy
    tok = with_template(base, **TINY_TURNS)
    parser = PARSERS.get("hermes")
    tc = ToolsConfig(names=("calculator",))
    # special-token strings a tool prints are removed before the template renders the result
    got = rt.observation_ids(tok, "1</s><|assistant|>2", parser=parser, tools=tc, prompt=PROMPT)
    assert got == ids(tok, "<|end|><|user|><tool_response>\n12\n</tool_response><|end|><|assistant|>")
    # render=convention: the parser's text, whatever the template can do
    conv = rt.observation_ids(tok, "12", parser=parser, tools=ToolsConfig(render="convention"), prompt=PROMPT)
    assert conv == ids(tok, "\n<tool_response>\n12\n</tool_response>\n")
    # a template that cannot render tool turns: auto keeps the convention, template refuses (one line)
    assert rt.observation_ids(base, "12", parser=parser, tools=tc, prompt=PROMPT) == ids(
        base, "\n<tool_response>\n12\n</tool_response>\n"
    )
    assert rt.check_tool_template(tok, ToolsConfig(render="template"))
    with pytest.raises(ConfigError, match=r"rollout\.tools\.render") as e:
        rt.check_tool_template(base, ToolsConfig(render="template"))
    assert "\n" not in str(e.value)


def test_train_refuses_a_template_without_tools_at_startup(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "COMMANDS", {k: v for k, v in cli.COMMANDS.items() if k == "train"})
    run_dir = tmp_path / "run"
    rc = cli.main(
        [
            "train",
            "--preset",
            "tools",
            "--out",
            str(run_dir),
            "rollout.tools.render=template",
            "trainer.threads=1",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "rollout.tools.render" in err and len(err.splitlines()) == 1
    assert not run_dir.exists()  # failed before any work: nothing left behind


def test_real_tool_rollout_with_a_hermes_template(policy: Any, tool_generate: Any) -> None:
    # Unscripted: the tiny model samples every turn through the run's engine, results rendered by the
    # template. Whatever it writes, the rollout ends and its masks are consistent.
    model, base = policy
    tok = with_template(base, **TINY_TURNS)
    torch.manual_seed(0)
    samples = [Sample(prompt=({"role": "user", "content": q},), ground_truth="1") for q in ("1+1?", "2*3?")]
    b, c = tool_generate(
        model, tok, samples, ToolsConfig(render="template"), n=2, max_new_tokens=24, temperature=1.0
    )
    assert len(b) == 4 and c["rollout/responses"] == 4
    assert b.response_ids_BT.shape[1] <= 24 and not (b.response_mask_BT & b.observation_BT).any()
    assert torch.isfinite(b.behaviour_logp_BT).all()
