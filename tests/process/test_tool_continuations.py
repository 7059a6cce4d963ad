"""Continuation values on tool rollouts (``monte_carlo``, ``greedy_continuation`` with ``tools``): a
continuation from a prefix that ends at a call runs the call and reads its real result, goes on turn
by turn with the rollout's turn and length budgets, and turns a failing tool into an error observation.

The policy is scripted on the ``arith_tools`` format (fenced calculator calls, the real calculator,
the task's verifier): the tool path samples through the rollout engine (:func:`run_turns`), the plain
path through ``model.generate``, and both follow the same script.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest
import torch

import stepcredit.reward.tools  # noqa: F401  (registers the arith_tools verifier)
import stepcredit.rollout.turns as rt
from stepcredit.config import ProcessConfig, RewardConfig, TinyModelConfig, ToolsConfig
from stepcredit.models import build_tiny, build_tokenizer
from stepcredit.process import VALUE_ESTIMATORS, prefix_values, score_each
from stepcredit.process.segment import trace_observed
from stepcredit.process.values import PrefixRequest, ValueContext
from stepcredit.reward import build_rewarder
from stepcredit.reward.base import REWARDS
from stepcredit.reward.tools import AgentCallRunner
from stepcredit.rollout import ToolContext, engines
from stepcredit.rollout.engines import Completion
from stepcredit.rollout.tool_context import in_process_runner
from stepcredit.tools import Observation, ToolCall, register_tool
from stepcredit.types import Sample

EOS = "<EOS>"
PROMPT = "Q 48 boxes of 478?\n"
CALL = "```calculator\n 48 * 478\n```"  # 22944, the gold answer
WRONG = "```calculator\n 48 * 487\n```"  # 23376
RESULT = "\n```output\n{}\n```\n"
SAMPLE = Sample(
    prompt=({"role": "user", "content": PROMPT},), ground_truth="22944", data_source="arith_tools"
)
TOOLS = ToolsConfig(names=("calculator", "tc_raises"), parser="fenced", max_turns=3)


@register_tool(
    "tc_raises",
    description="raises",
    parameters={"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
)
def tc_raises(x: str) -> str:
    raise RuntimeError("broken " + x)


@register_tool(
    "tc_sleeps",
    description="hangs",
    parameters={"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
)
def tc_sleeps(x: str) -> str:
    time.sleep(60)
    return "never"


def copier(response: str) -> str:
    """The next turn of a policy that calls the calculator first and copies the last result into its
    answer; at a call with no result after it (no tool ran) it can only guess."""
    if m := re.search(r"```output\n(.*?)\n```\n$", response, re.DOTALL):
        return f"The answer is\n{m.group(1)}" + EOS
    if response.rstrip().endswith("```"):
        return "\nThe answer is\n0" + EOS
    return CALL


def chainer(response: str) -> str:
    """A policy that never answers: each turn adds 1 to the last result with a new call."""
    results = re.findall(r"```output\n(.*?)\n```\n", response)
    return f"```calculator\n {results[-1]} + 1\n```" if results else CALL


def failer(case: str) -> Callable[[str], str]:
    """A first call that fails in the way ``case`` names, then the answer copied from its result."""
    first = {
        "bad": "```calculator\n 48 * \n```",
        "raise": "```tc_raises\nq\n```",
        "unknown": "```nosuch\nq\n```",
        "sleep": "```tc_sleeps\nq\n```",
    }
    return lambda response: copier(response) if "```output" in response else first[case]


class Scripted(torch.nn.Module):
    """``script(response so far) -> next turn``, as the rollout engine's ``sample``, for both paths: a
    plain continuation (turns written one after the other, no tool runs) and the turn loop's (one turn
    per call, with a budget per context)."""

    def __init__(self, tok: Any, script: Callable[[str], str]) -> None:
        super().__init__()
        self.tok, self.script = tok, script
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.contexts: list[str] = []  # every context the engine sampled a turn for

    def turn(self, context: list[int]) -> list[int]:
        text = self.tok.decode(context, skip_special_tokens=True)
        self.contexts.append(text)
        say = self.script(text.split(PROMPT, 1)[1])
        ids = self.tok(say.replace(EOS, ""), add_special_tokens=False)["input_ids"]
        return list(ids) + ([self.tok.eos_token_id] if say.endswith(EOS) else [])

    def sample(
        self, model: Any, tok: Any, contexts: Sequence[Sequence[int]], spec: Any, *, budgets: Any = None
    ) -> list:
        if budgets is not None:  # the turn loop: one turn per call
            return [Completion(self.turn(list(c))[:room]) for c, room in zip(contexts, budgets, strict=True)]
        out = []  # a plain continuation: turns written one after the other, no tool runs
        for c in contexts:
            ids: list[int] = []
            while len(ids) < spec.max_tokens and self.tok.eos_token_id not in ids:
                ids += self.turn(list(c) + ids)
            out += [Completion(ids[: spec.max_tokens])] * spec.n
        return out


verify = REWARDS.get("arith_tools").fn
scored: list[str] = []


def score_one(sample: Sample, text: str) -> float:
    scored.append(text)
    return float(verify(sample.data_source, text, sample.ground_truth, {}).score)


SCORE = score_each(score_one)


@pytest.fixture
def tok() -> Any:
    scored.clear()
    return build_tokenizer()


def policy(monkeypatch: pytest.MonkeyPatch, tok: Any, script: Callable[[str], str]) -> Scripted:
    model = Scripted(tok, script)
    monkeypatch.setattr(rt, "engine_for", lambda m: model)  # the turn loop samples from the script
    engines.bind(model, model)  # type: ignore[arg-type]  # and so does every other stage
    return model


def ids(tok: Any, text: str) -> list[int]:
    return list(tok(text.replace(EOS, ""), add_special_tokens=False)["input_ids"]) + (
        [tok.eos_token_id] if text.endswith(EOS) else []
    )


def values(
    model: Any,
    tok: Any,
    responses: list[str],
    *,
    tools: ToolContext | None,
    prompt: str = PROMPT,
    **kw: Any,
) -> list[list[float]]:
    cfg = ProcessConfig(**{"value_estimator": "greedy_continuation", "mc_max_new_tokens": 200, **kw})
    got = prefix_values(
        model,
        tok,
        [SAMPLE] * len(responses),
        [ids(tok, prompt)] * len(responses),
        [ids(tok, r) for r in responses],
        cfg,
        score_fn=SCORE,
        tools=tools,
        # the result marks a rollout of these texts records (their result blocks: what it appended)
        observed=[trace_observed(ids(tok, r), tok) for r in responses],
    )
    return got.values


RIGHT = CALL + RESULT.format(22944) + "The answer is\n22944" + EOS
OFF = WRONG + RESULT.format(23376) + "The answer is\n23376" + EOS


def test_a_continuation_reads_the_real_result_only_when_tools_run(
    monkeypatch: pytest.MonkeyPatch, tok: Any
) -> None:
    model = policy(monkeypatch, tok, copier)
    turns = ToolContext.in_process(TOOLS, 200)
    # Episodes: [the call], [its result + the answer]; V_0 (prompt), V_1 (after the call), V_2 (the
    # complete response: its own reward). With tools, the continuation from the right call runs it, reads
    # 22944 and copies it: 1; from the wrong call it reads the calculator's 23376: 0; from the prompt it
    # writes the right call first: 1.
    assert values(model, tok, [RIGHT, OFF], tools=turns) == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    # every continuation is the rollout the tool-using policy writes: the call's real result appended
    assert set(scored) == {RIGHT.replace(EOS, ""), OFF.replace(EOS, "")}
    # The plain path (no tools: the estimator as before) continues the call as text and guesses: 0.
    assert values(model, tok, [RIGHT, OFF], tools=None) == [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    # monte_carlo takes the same path: K continuations per prefix, each a tool rollout
    mc = values(model, tok, [RIGHT], tools=turns, value_estimator="monte_carlo", mc_samples=3, mc_v0="sample")
    assert mc == [[1.0, 1.0, 1.0]]


def test_a_prefix_keeps_its_results_and_the_turn_limit_counts_them(
    monkeypatch: pytest.MonkeyPatch, tok: Any
) -> None:
    model = policy(monkeypatch, tok, chainer)
    turns = ToolContext.in_process(ToolsConfig(names=("calculator",), parser="fenced", max_turns=2), 400)
    two = CALL + RESULT.format(22944) + "```calculator\n 22944 + 1\n```" + RESULT.format(22945) + "Done"
    values(model, tok, [two], tools=turns)
    # V_0: calls 1 and 2 run, the third (past max_turns=2) ends the continuation unexecuted.
    # V_1 (at call 1, no result yet): the same. V_2 (at call 2, one result in the prefix, kept): call 2
    # runs, call 3 does not. V_3: the prefix is the whole (unfinished) response; its third call does not run.
    chain = CALL + RESULT.format(22944) + "```calculator\n 22944 + 1\n```" + RESULT.format(22945)
    assert scored == [chain + "```calculator\n 22945 + 1\n```"] * 3 + [two + "```calculator\n 22945 + 1\n```"]
    # the prefix's own result is never re-run: the engine saw it exactly as the response holds it
    assert all(c.count("```output") <= 2 for c in model.contexts)


def test_the_length_budget_counts_results(monkeypatch: pytest.MonkeyPatch, tok: Any) -> None:
    model = policy(monkeypatch, tok, chainer)
    lots = ToolsConfig(names=("calculator",), parser="fenced", max_turns=50)
    n_call = len(ids(tok, CALL))
    # rollout.max_new_tokens = 60 binds (mc_max_new_tokens = 200): every continuation, the prefix and its
    # results included, is 60 tokens (the char tokenizer: 60 characters)
    values(model, tok, [CALL + RESULT.format(22944) + "x"], tools=ToolContext.in_process(lots, 60))
    chain = CALL + RESULT.format(22944) + "```calculator\n 22944 + 1\n```"
    assert scored[:2] == [chain[:60]] * 2  # the second call is cut by the budget: it does not run
    # process.mc_max_new_tokens = 30 binds: 30 tokens past each prefix (V_0: 30, V_1: the call + 30)
    scored.clear()
    values(
        model,
        tok,
        [CALL + RESULT.format(22944) + "x"],
        tools=ToolContext.in_process(lots, 60),
        mc_max_new_tokens=30,
    )
    assert [len(t) for t in scored[:2]] == [30, n_call + 30]
    assert scored[1] == chain[: n_call + 30]


@pytest.mark.parametrize(
    ("case", "shown"),
    [
        ("bad", "error: "),
        ("raise", "error: RuntimeError: broken q"),
        ("unknown", "error: unknown tool 'nosuch'"),
    ],
)
def test_tool_failures_in_continuations_are_observations(
    monkeypatch: pytest.MonkeyPatch, tok: Any, case: str, shown: str
) -> None:
    model = policy(monkeypatch, tok, failer(case))
    seen: list[Observation] = []
    inner = in_process_runner(TOOLS.names, TOOLS.max_result_chars)

    def runner(calls: Sequence[ToolCall], kwargs: Sequence[Any]) -> list[Observation]:
        got = inner(calls, kwargs)
        seen.extend(got)
        return got

    # the prompt names the failure; the response ends at once (no call), so V_0 and V_1 continue
    got = values(
        model, tok, ["Hm" + EOS, "Hm."], tools=ToolContext(TOOLS, runner, 200), prompt=f"{case}|{PROMPT}"
    )
    assert got == [[0.0, 0.0], [0.0, 0.0]]  # each continuation copied an error into its answer
    assert seen and all(o.error for o in seen)  # the run's runner ran every call
    conts = [t for t in scored if "```output" in t]
    assert conts and all(f"```output\n{shown}" in t for t in conts), conts


def test_every_continuation_estimator_takes_tools() -> None:
    # the registry says which estimators see a call's result (continuations with tools, a group sampled with
    # tools on fixed traces, the forced answer after the result); of the others, exact values sample nothing, and tree values come from a tree
    # rollout (refused with tools)
    takes = {n for n in VALUE_ESTIMATORS if VALUE_ESTIMATORS.get(n).takes_tools}
    assert takes == {
        "monte_carlo",
        "greedy_continuation",
        "greedy_bisect",
        "group_prefix",
        "forced_answer_logprob",
    }
    others = [VALUE_ESTIMATORS.get(n) for n in VALUE_ESTIMATORS if n not in takes]
    assert all(not spec.generates or spec.from_outcomes for spec in others)


def test_resume_row_finds_calls_so_far_and_the_pending_call(tok: Any) -> None:
    text = CALL + RESULT.format(22944) + WRONG
    ctx = ToolContext.in_process(TOOLS, 500)

    def resume(t: str) -> rt.TurnRow:
        return rt.resume_row(tok, [1], SAMPLE, ids(tok, t), ctx, observed=trace_observed(ids(tok, t), tok))

    row = resume(text)
    assert row.calls == 1 and row.pending == ToolCall("calculator", {"expression": " 48 * 487"})
    # a call followed by more of the policy's text (a trace, not cut at the call) is not pending
    assert resume(text + " then").pending is None
    assert resume("So ").calls == 0


@pytest.mark.parametrize("strategy", ["packed", "naive"])
def test_a_forced_answer_at_a_call_is_forced_after_its_result(strategy: str) -> None:
    model, tok = build_tiny(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    cfg = ProcessConfig(value_estimator="forced_answer_logprob", strategy=strategy)
    n_call, n_obs = len(ids(tok, CALL)), len(ids(tok, RESULT.format(22944)))
    resp = ids(tok, RIGHT)
    req = PrefixRequest(
        SAMPLE,
        ids(tok, PROMPT),
        resp,
        [0, n_call, len(resp) - 1],
        "22944",
        complete=True,
        observed=trace_observed(resp, tok),  # the result's tokens, as the rollout marked them
    )
    forced = VALUE_ESTIMATORS.get("forced_answer_logprob")
    with torch.no_grad():
        got = forced(ValueContext(model, tok, [req], cfg, tools=ToolContext.in_process(TOOLS, 200)))
        plain = forced(ValueContext(model, tok, [req], cfg))
        # the reference: the same estimator without tools on prefixes that hold the call and its result
        ref = forced(
            ValueContext(model, tok, [replace(req, prefix_lens=[0, n_call + n_obs, len(resp) - 1])], cfg)
        )
    assert got == ref
    # only the prefix that ends at the call moved: the forced answer now reads 22944 there
    assert got[0][0] == plain[0][0] and got[0][2] == plain[0][2] and got[0][1] != plain[0][1]


def test_continuations_run_through_the_reward_agent(monkeypatch: pytest.MonkeyPatch, tok: Any) -> None:
    # the trainer's runner: calls are rows of the run's reward agent (kill-safe workers, deadlines)
    names = ("calculator", "tc_sleeps")
    with build_rewarder(RewardConfig(timeout_s=1.0)) as rewarder:
        turns = ToolContext(
            ToolsConfig(names=names, parser="fenced"),
            AgentCallRunner(rewarder, offered=names, max_chars=256),
            200,
        )
        assert values(policy(monkeypatch, tok, copier), tok, [RIGHT], tools=turns) == [[1.0, 1.0, 1.0]]
        # a tool that hangs is killed at the deadline: an error observation, the continuation goes on
        scored.clear()
        assert values(policy(monkeypatch, tok, failer("sleep")), tok, ["Hm."], tools=turns) == [[0.0, 0.0]]
    assert len(scored) == 2 and all("```output\nerror: the tool timeout" in t for t in scored), scored
