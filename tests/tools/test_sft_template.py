"""SFT in the chat template's format: where the rollout appends a tool result as the template's own
tool turn (``rollout.tools.render``), an SFT trace's result blocks (written in the convention's text,
``extra_info["solution_observations"]``) become those same tokens, still with no loss; where it
appends the convention's text, SFT is as it was."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import torch

import stepcredit.rollout.tool_render as rt
import stepcredit.rollout.turns as turn_loop
from stepcredit.config import ArithConfig, TinyModelConfig, ToolsConfig
from stepcredit.data import row_to_sample
from stepcredit.data.arith import make_tool_rows, tool_chain_of
from stepcredit.errors import DataError
from stepcredit.models import build_tiny, token_logprobs
from stepcredit.rollout.engines import Completion
from stepcredit.tools import PARSERS, hermes_template
from stepcredit.trainer.sft import sft_batch, sft_loss, sft_pairs
from stepcredit.types import Sample

SMALL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, tokenizer="bpe")
TOOLS = ToolsConfig(names=("calculator",), parser="fenced")  # the arith_tools traces' convention


@pytest.fixture(scope="module")
def policy() -> tuple[Any, Any, Any]:
    """The tiny model, its tokenizer, and the tokenizer with a Hermes template in its own turn markup."""
    model, tok = build_tiny(SMALL, seed=0)
    hermes = copy.deepcopy(tok)
    hermes.chat_template = hermes_template(turn_start="<|{role}|>", turn_end="<|end|>")
    return model, tok, hermes


def samples(n: int = 3) -> list[Sample]:
    rows = make_tool_rows(ArithConfig(min_steps=2, max_steps=3), n, seed=3, split="train")
    return [row_to_sample(r, f"t:{i}") for i, r in enumerate(rows)]


def policy_turns(s: Sample) -> list[str]:
    """The trace's own text between its result blocks: what the policy writes, turn by turn."""
    sol, at, out = s.extra_info["solution"], 0, []
    for a, b in s.extra_info["solution_observations"]:
        out.append(sol[at:a])
        at = b
    return [*out, sol[at:]]


def write_trace(monkeypatch: pytest.MonkeyPatch, turns: list[str]) -> None:
    """Sampling replaced: turn k (k = results appended so far) writes ``turns[k]``, the last with eos."""

    class Scripted:
        def sample(self, model: Any, tok: Any, contexts: list[list[int]], spec: Any, *, budgets: Any) -> list:
            out = []
            for ctx, room in zip(contexts, budgets, strict=True):
                # "<tool_response>\n" opens a result; the system turn's mention of the tag is not followed by \n
                k = tok.decode(ctx, skip_special_tokens=False).count("<tool_response>\n")
                got = list(tok(turns[k], add_special_tokens=False)["input_ids"])
                out.append(Completion((got + [tok.eos_token_id] * (k + 1 == len(turns)))[:room]))
            return out

    monkeypatch.setattr(turn_loop, "engine_for", lambda model: Scripted())


def test_sft_pair_is_the_rollout_that_writes_the_trace(
    policy: Any, monkeypatch: pytest.MonkeyPatch, tool_generate: Any
) -> None:
    model, _, tok = policy
    assert rt.check_tool_template(tok, TOOLS)  # render=auto: results are the template's tool turn
    for s, (p, r, trained) in zip(samples(), sft_pairs(tok, samples(), TOOLS), strict=True):
        # the tool rollout of a policy that writes the trace's own turns, the real calculator answering
        write_trace(monkeypatch, policy_turns(s))
        b, c = tool_generate(model, tok, [s], TOOLS, n=1, max_new_tokens=600, temperature=0.0)
        assert c["tools/calls"] == s.extra_info["steps"] and c["tools/failed_calls"] == 0
        att = b.attention_BT()[0]
        # prompt, response and the untrained tokens are the rollout's, token for token
        assert p == b.prompt_ids_BP[0][b.prompt_mask_BP[0]].tolist()
        assert r == b.response_ids_BT[0][att].tolist()
        assert [not t for t in trained] == b.observation_BT[0][att].tolist()
        # each untrained run is the template's tool turn for that result (not the ```output block):
        # the rollout's observation ids (rt._observation_ids) of the running totals, in order
        runs = [
            [i for i, _ in g]
            for t, g in itertools.groupby(zip(r, trained, strict=True), key=lambda x: x[1])
            if not t
        ]
        totals = tool_chain_of(s.prompt[0]["content"])
        fenced = PARSERS.get("fenced")
        want = [rt.observation_ids(tok, str(v), parser=fenced, tools=TOOLS, prompt=s.prompt) for v in totals]
        assert runs == want
        assert (
            tok.decode(runs[0])
            == f"<|end|><|user|><tool_response>\n{totals[0]}\n</tool_response><|end|><|assistant|>"
        )


def test_the_loss_ignores_the_template_tool_turns(policy: Any) -> None:
    model, _, tok = policy
    torch.manual_seed(0)
    pairs = sft_pairs(tok, samples(), TOOLS)
    ids, mask, loss_mask = sft_batch(pairs, tok.pad_token_id)
    obs = mask[:, -loss_mask.shape[1] :] & ~loss_mask  # attended response tokens that are not trained
    assert obs.sum() > 0 and loss_mask.sum() > 0
    logp, _ = token_logprobs(model, ids, mask.long(), n_response=loss_mask.shape[1])
    logp.retain_grad()
    loss = sft_loss(logp, loss_mask)
    loss.backward()
    assert logp.grad is not None
    # the gradient reaches every trained token's log-prob and no tool turn token's
    assert (logp.grad[obs] == 0).all() and (logp.grad[loss_mask] != 0).all()
    noisy = torch.where(obs, logp.detach() - 5.0 * torch.rand_like(logp), logp.detach())
    assert torch.equal(sft_loss(noisy, loss_mask), sft_loss(logp.detach(), loss_mask))


def test_the_convention_path_is_unchanged(policy: Any) -> None:
    _, base, hermes = policy
    rows = samples()
    before = sft_pairs(base, rows)
    # a template that cannot render tool turns: results stay the convention's text, byte for byte
    assert not rt.check_tool_template(base, TOOLS)
    assert sft_pairs(base, rows, TOOLS) == before
    # render=convention with a template that can: the same responses and marks; the prompts are the
    # rollout's, which list the offered tools where the template prints them
    conv = sft_pairs(hermes, rows, ToolsConfig(names=("calculator",), parser="fenced", render="convention"))
    assert [(r, t) for _, r, t in conv] == [(r, t) for _, r, t in sft_pairs(hermes, rows)]
    assert [p for p, _, _ in conv] == rt.render_tool_prompts(hermes, rows, ["calculator"])
    assert all("calculator" in hermes.decode(p) for p, _, _ in conv)


def test_a_span_that_is_no_result_block_is_refused_in_one_line(policy: Any) -> None:
    _, _, tok = policy
    s = samples(1)[0]
    a, b = s.extra_info["solution_observations"][0]
    bad = s.with_(extra_info={**s.extra_info, "solution_observations": [[a + 1, b]]})
    with pytest.raises(DataError, match=r"row 0 \(t:0\): solution_observations") as e:
        sft_pairs(tok, [bad], TOOLS)
    assert "\n" not in str(e.value)
    assert rt.result_of(PARSERS.get("fenced"), "\n```output\n22944\n```\n") == "22944"
    assert rt.result_of(PARSERS.get("hermes"), "\n```output\n22944\n```\n") is None
