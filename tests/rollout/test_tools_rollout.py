"""The tool-calling rollout (``rollout.mode=tools``) with a scripted policy: turns cut at the call,
results appended as observation tokens that are attended to but never trained on, every tool failure
an observation and a metric with no sample lost, the turn limit, turns as episodes, zero gradient
through the results."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

import stepcredit.rollout.turns as rt
from stepcredit.config import (
    LossConfig,
    ModelConfig,
    ProcessConfig,
    RewardConfig,
    RolloutConfig,
    TinyModelConfig,
    ToolsConfig,
)
from stepcredit.losses import compute_policy_loss
from stepcredit.models import load_policy, token_logprobs
from stepcredit.process.segment import segment_episodes
from stepcredit.reward import build_rewarder
from stepcredit.reward.tools import AgentCallRunner
from stepcredit.rollout import ROLLOUT_MODES, RolloutRequest, ToolContext
from stepcredit.rollout.engines import Completion
from stepcredit.tools import register_tool
from stepcredit.types import Batch, Sample

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
OBJ = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
EOS = "<EOS>"


@register_tool("r_raises", description="raises", parameters=OBJ)
def r_raises(x: str) -> str:
    raise ValueError("bad " + x)


@register_tool("r_prints", description="prints megabytes", parameters=OBJ)
def r_prints(x: str) -> None:
    for _ in range(500):
        print("p" * 4096)


@register_tool("r_bytes", description="invalid utf-8", parameters=OBJ)
def r_bytes(x: str) -> bytes:
    return b"\xff\xfe"


@register_tool("r_sleeps", description="hangs", parameters=OBJ)
def r_sleeps(x: str) -> str:
    time.sleep(60)
    return "never"


NAMES = ("calculator", "r_raises", "r_prints", "r_bytes", "r_sleeps")


@pytest.fixture(scope="module")
def policy() -> tuple[Any, Any]:
    torch.manual_seed(0)
    return load_policy(SMALL, seed=0)


def scripted(monkeypatch: pytest.MonkeyPatch, tok: Any, scripts: dict[str, list[str]]) -> None:
    """Replace sampling: the row whose text holds a script's key writes that script's turn k, k = the
    results appended so far (``<EOS>`` = the eos token)."""

    class Scripted:
        def sample(
            self, model: Any, tok: Any, contexts: list[list[int]], spec: Any, *, budgets: list[int]
        ) -> list:
            out = []
            for ids, room in zip(contexts, budgets, strict=True):
                text = tok.decode(ids, skip_special_tokens=True)
                key = next(k for k in scripts if k in text)
                turn = text.count("```output") + text.count("<tool_response>")
                say = scripts[key][turn]
                got = tok(say.replace(EOS, ""), add_special_tokens=False)["input_ids"]
                got += [tok.eos_token_id] if say.endswith(EOS) else []
                out.append(Completion(got[:room]))
            return out

    monkeypatch.setattr(rt, "engine_for", lambda model: Scripted())


def sample(q: str) -> Sample:
    return Sample(prompt=({"role": "user", "content": q},), ground_truth="144", data_source="arith_tools")


def rollout(
    policy: tuple[Any, Any],
    qs: list[str],
    *,
    parser: str = "fenced",
    max_turns: int = 3,
    runner: Any = None,
    T: int = 160,
) -> tuple[Batch, dict[str, float]]:
    model, tok = policy
    cfg = RolloutConfig(
        n=1, max_new_tokens=T, tools=ToolsConfig(names=NAMES, parser=parser, max_turns=max_turns)
    )
    spec = ROLLOUT_MODES.get("tools")
    assert spec.uses_tools
    tools = None if runner is None else ToolContext(cfg.tools, runner, T)
    request = RolloutRequest([sample(q) for q in qs], cfg, lambda ids: [], tools=tools)
    return spec.fn(model, tok, request)


def test_turns_results_masks_logprobs_and_episodes(policy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = policy
    scripted(
        monkeypatch,
        tok,
        {
            "QA": ["```calculator\n12*12\n```\nJUNK after the call", "The answer is 144." + EOS],
            "QB": ["The answer is 7." + EOS],  # no call: one turn
        },
    )
    b, c = rollout(policy, ["QA", "QB"])
    assert len(b) == 2
    assert b.texts[0] == "```calculator\n12*12\n```\n```output\n144\n```\nThe answer is 144."
    assert b.texts[1] == "The answer is 7."
    assert c["tools/calls"] == 1 and c["tools/turns"] == 3 and c["tools/failed_calls"] == 0
    # the result's tokens: exactly the appended block, attended to, never in the loss mask
    obs = b.observation_BT[0]
    n_call = len(tok("```calculator\n12*12\n```", add_special_tokens=False)["input_ids"])
    n_obs = len(tok("\n```output\n144\n```\n", add_special_tokens=False)["input_ids"])
    assert obs.nonzero().flatten().tolist() == list(range(n_call, n_call + n_obs))
    assert not (b.response_mask_BT & b.observation_BT).any()
    assert b.attention_BT()[0].sum() == b.response_mask_BT[0].sum() + n_obs
    assert (b.behaviour_logp_BT[0][obs] == 0).all() and not b.observation_BT[1].any()
    # behaviour log-probs of the policy's own tokens equal a fresh pass that sees the results
    T = b.response_ids_BT.shape[1]
    logp, _ = token_logprobs(
        model,
        torch.cat([b.prompt_ids_BP, b.response_ids_BT], 1),
        torch.cat([b.prompt_mask_BP, b.attention_BT()], 1).long(),
        n_response=T,
    )
    torch.testing.assert_close(
        torch.where(b.response_mask_BT, logp, 0.0), b.behaviour_logp_BT, atol=1e-5, rtol=0
    )
    # turns are the episodes: the first ends at the call's last token, the second at the eos
    # (read from the marks the rollout recorded, not from the text)
    ids = b.response_ids_BT[0][b.attention_BT()[0]].tolist()
    marks = b.observation_BT[0][b.attention_BT()[0]].tolist()
    assert segment_episodes(ids, tok, ProcessConfig(), marks) == [n_call - 1, len(ids) - 1]
    # select and concat keep the marks
    both = Batch.concat([b.select([1]), b.select([0])])
    assert torch.equal(both.observation_BT[1, :T], b.observation_BT[0])


def test_zero_gradient_through_tool_results(policy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The loss with any advantages placed on the results' tokens has the same gradient as with none:
    # they carry zero loss weight. Counting them (the mask with the results in) changes it: the test
    # can tell.
    model, tok = policy
    scripted(monkeypatch, tok, {"QA": ["```calculator\n2*3\n```", "The answer is 6." + EOS]})
    b, _ = rollout(policy, ["QA", "QA"])
    T = b.response_ids_BT.shape[1]
    ids = torch.cat([b.prompt_ids_BP, b.response_ids_BT], 1)
    attn = torch.cat([b.prompt_mask_BP, b.attention_BT()], 1).long()
    adv = torch.linspace(-1, 1, T).expand(len(b), T).clone()

    def grad(adv_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
        model.zero_grad()
        logp, _ = token_logprobs(model, ids, attn, n_response=T)
        out = compute_policy_loss(
            LossConfig(kl_coef=0.0), logp_BT=logp, old_logp_BT=logp.detach(), adv_BT=adv_BT, mask_BT=mask_BT
        )
        out.loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone()

    g_with = grad(torch.where(b.observation_BT, 100.0, adv), b.response_mask_BT)
    g_without = grad(torch.where(b.observation_BT, 0.0, adv), b.response_mask_BT)
    torch.testing.assert_close(g_with, g_without, atol=0, rtol=0)
    g_counted = grad(torch.where(b.observation_BT, 100.0, adv), b.attention_BT())
    assert not torch.allclose(g_with, g_counted)


CALL = "```{}\nq\n```"


@pytest.mark.parametrize(
    ("tool", "kind", "shown"),
    [
        ("r_raises", "raised", "error: ValueError: bad q"),
        ("r_bytes", "invalid_utf8", "error: the result is not valid UTF-8 (? marks the bad bytes): ??"),
        ("nope", "unknown_tool", "error: unknown tool 'nope'"),
    ],
)
def test_failures_are_observations(
    policy: Any, monkeypatch: pytest.MonkeyPatch, tool: str, kind: str, shown: str
) -> None:
    _, tok = policy
    scripted(
        monkeypatch,
        tok,
        {"QA": [CALL.format(tool), "The answer is 1." + EOS], "QB": ["The answer is 2." + EOS]},
    )
    b, c = rollout(policy, ["QA", "QB"])
    assert len(b) == 2 and b.texts[1] == "The answer is 2."
    assert c[f"tools/failed_{kind}"] == 1 and c["tools/failed_calls"] == 1
    # the policy sees the error and goes on to its answer
    assert shown in b.texts[0] and b.texts[0].endswith("The answer is 1.")


def test_megabytes_of_output_are_cut(policy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, tok = policy
    scripted(monkeypatch, tok, {"QA": [CALL.format("r_prints"), "The answer is 1." + EOS]})
    b, c = rollout(policy, ["QA"], T=400)
    assert c["tools/failed_calls"] == 0 and b.texts[0].endswith("The answer is 1.")
    assert 256 <= b.observation_BT.sum() < 300  # max_result_chars = 256 characters of a char-level vocabulary


def test_malformed_json_arguments(policy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, tok = policy
    scripted(
        monkeypatch, tok, {"QA": ["<tool_call>{name: calculator}</tool_call>", "The answer is 1." + EOS]}
    )
    b, c = rollout(policy, ["QA"], parser="hermes", T=400)
    assert (
        c["tools/failed_unparseable_call"] == 1
    )  # not JSON: unparseable (JSON of the wrong shape: bad_arguments)
    assert "<tool_response>\nerror: malformed tool call" in b.texts[0] and b.texts[0].endswith(
        "The answer is 1."
    )


def test_turn_limit(policy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, tok = policy
    scripted(monkeypatch, tok, {"QA": [CALL.format("calculator").replace("q", f"{k}+1") for k in range(5)]})
    b, c = rollout(policy, ["QA"], max_turns=2)
    # two calls run; the third is past the limit: the response ends there, not executed, counted
    assert c["tools/calls"] == 2 and c["tools/turn_limit_reached"] == 1
    assert b.texts[0].count("```output") == 2 and b.texts[0].endswith("```calculator\n2+1\n```")


def test_a_hanging_tool_is_killed_in_the_reward_agent(policy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, tok = policy
    scripted(
        monkeypatch,
        tok,
        {
            "QA": [CALL.format("r_sleeps"), "The answer is 1." + EOS],
            "QB": [CALL.format("calculator").replace("q", "3*3"), "The answer is 9." + EOS],
        },
    )
    with build_rewarder(RewardConfig(timeout_s=1.0)) as rewarder:
        runner = AgentCallRunner(rewarder, offered=NAMES, max_chars=256)
        b, c = rollout(policy, ["QA", "QB"], runner=runner)
    assert c["tools/failed_timeout"] == 1 and c["tools/calls"] == 2
    assert "error: the tool timeout" in b.texts[0] and b.texts[0].endswith("The answer is 1.")
    assert "```output\n9\n```" in b.texts[1]


def test_start_up_check_imports_user_tools(tmp_path: Any) -> None:
    from stepcredit.config import Config, RolloutConfig
    from stepcredit.errors import ConfigError
    from stepcredit.rollout import check_config

    f = tmp_path / "my_tools.py"
    f.write_text(
        "from stepcredit.tools import register_tool\n"
        "@register_tool('shout', description='upper', parameters={'type': 'object', "
        "'properties': {'s': {'type': 'string'}}, 'required': ['s']})\n"
        "def shout(s):\n    return s.upper()\n"
    )

    def cfg(**tools: Any) -> Config:
        return Config(rollout=RolloutConfig(mode="tools", tools=ToolsConfig(**tools)))

    check_config(cfg(names=("shout",), modules=(str(f),)))
    # the one loader of user code imports a file once: checking again does not register 'shout' twice
    # (which the registry would refuse)
    check_config(cfg(names=("shout",), modules=(str(f),)))
    with pytest.raises(ConfigError, match=r"rollout\.tools\.names"):
        check_config(cfg(names=("nope",)))
    with pytest.raises(ConfigError, match=r"rollout\.tools\.parser"):
        check_config(cfg(parser="xml"))
    with pytest.raises(ConfigError, match=r"rollout\.tools\.modules"):
        check_config(cfg(modules=(str(tmp_path / "missing.py"),)))
