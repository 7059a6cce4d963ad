"""The tool path under an outside red team (issue 46, items 1-3): results a tool returns that cannot
be shown as text, tools that raise ``BaseException`` (and a real Ctrl-C that must still stop the run),
calculator expressions whose exact value explodes in its denominator, printed text that is not UTF-8, a
continuation from a prefix that ends inside a call, user tools registered as a ``functools.partial`` or
a callable object, a user convention's markup that is neither a tag nor a fence, and a hostile policy's
turns through the whole turn loop (one observation per call, only observations marked)."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time
from typing import Any

import pytest
import torch

from stepcredit.config import ModelConfig, RewardConfig, TinyModelConfig, ToolsConfig
from stepcredit.models import load_policy
from stepcredit.reward import build_rewarder
from stepcredit.reward.tools import AgentCallRunner
from stepcredit.rollout import ToolContext
from stepcredit.rollout.tool_render import observation_ids
from stepcredit.rollout.turns import resume_row
from stepcredit.tools import PARSERS, Observation, ToolCall, execute_call, neutralise, register_tool
from stepcredit.types import Sample

OBJ = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}


def _call(name: str, **kw: Any) -> Observation:
    o = execute_call(ToolCall(name, {"x": "1"}), offered=[name], **kw)
    assert isinstance(o, Observation) and isinstance(o.text, str)
    o.text.encode("utf-8")
    return o


# ------------------------------------------------------- results that cannot be shown as text
class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")

    __repr__ = __str__


class _HostileStr(str):
    def encode(self, *a: Any, **k: Any) -> bytes:  # type: ignore[override]
        raise RuntimeError("no bytes")

    def __str__(self) -> str:
        raise RuntimeError("no text")


RESULTS: dict[str, Any] = {
    "unprintable": _Unprintable(),
    "list_of_unprintable": [_Unprintable()],
    "str_subclass": _HostileStr("fine"),
    "huge_int": 10**5000,  # past Python's int-to-str limit: json.dumps and str both raise ValueError
}
for _key, _value in RESULTS.items():
    register_tool(f"rt_{_key}", description="returns a hostile value", parameters=OBJ)(
        lambda x, _v=_value: _v
    )


@pytest.mark.parametrize("key", sorted(RESULTS))
def test_a_result_that_cannot_be_shown_is_an_error_observation(key: str) -> None:
    # before: the exception of str()/json.dumps/encode left execute_call (an in-process rollout died)
    o = _call(f"rt_{key}")
    if key == "str_subclass":
        assert (o.error, o.text) == ("", "fine")  # the str's own characters, not its overrides
    else:
        assert o.error == "raised" and o.text.startswith("error: "), o


# ------------------------------------------------------------ tools that raise BaseException
BASE_EXCEPTIONS = {"sysexit": SystemExit(3), "kbint": KeyboardInterrupt(), "genexit": GeneratorExit()}


def _raiser(exc: BaseException) -> Any:
    def fn(x: str) -> str:
        raise exc

    return fn


for _key, _exc in BASE_EXCEPTIONS.items():
    register_tool(f"rt_{_key}", description="raises", parameters=OBJ)(_raiser(_exc))


@pytest.mark.parametrize("key", sorted(BASE_EXCEPTIONS))
def test_a_tool_raising_a_base_exception_is_an_error_observation(key: str) -> None:
    # before: SystemExit, KeyboardInterrupt and GeneratorExit left execute_call (the rollout ended)
    o = _call(f"rt_{key}")
    assert o.error == "raised" and type(BASE_EXCEPTIONS[key]).__name__ in o.text, o


@register_tool("rt_sigint", description="the user presses Ctrl-C while it runs", parameters=OBJ)
def rt_sigint(x: str) -> str:
    os.kill(os.getpid(), signal.SIGINT)
    # the handler runs between bytecodes of the main thread, which a loaded machine may not schedule
    # at once: wait up to 10 s in sleeps, which a signal's handler interrupts
    for _ in range(10_000):
        time.sleep(0.001)
    return "not reached"


def test_a_real_ctrl_c_during_an_in_process_call_still_stops_the_run() -> None:
    # a KeyboardInterrupt the tool raises is its observation; one the user sends is not swallowed.
    # Python's own handler is set for the test: a process started in the background by a shell
    # inherits SIGINT ignored (a CI runner's may), and then no Ctrl-C reaches it at all
    prev = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            execute_call(ToolCall("rt_sigint", {"x": "1"}), offered=["rt_sigint"])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, prev)


# --------------------------------------------------------- the calculator's exact arithmetic
@pytest.mark.parametrize(
    "expression",
    [
        "(1/7**64)**64",  # a denominator of 3,460 digits (the digit limit read the numerator only)
        "((1/7**64)**64)**64",  # 221,000 digits; one more level took minutes, two the worker's memory
        "1/10**60/10**60/10**60/10**60",  # each division grows the denominator only
        "(2**60*2**60*2**60)**64",  # refused before computing an 11,520-bit power
    ],
)
def test_the_calculators_exact_values_stay_small(expression: str) -> None:
    o = execute_call(ToolCall("calculator", {"expression": expression}), offered=["calculator"])
    assert o.error == "bad_expression" and "digits" in o.text, o
    assert execute_call(ToolCall("calculator", {"expression": "1/8"}), offered=["calculator"]).text == "0.125"


# ------------------------------------------------------------------ printed text, not UTF-8
@register_tool("rt_prints_surrogate", description="prints a lone surrogate", parameters=OBJ)
def rt_prints_surrogate(x: str) -> None:
    print("ok \ud800 done")


def test_printed_text_that_is_not_utf8_has_its_error_kind() -> None:
    # before: the surrogate became "?" silently (error ""), while a returned one was invalid_utf8
    o = _call("rt_prints_surrogate")
    assert o.error == "invalid_utf8" and "ok ? done" in o.text, o


# ------------------------------------------------ a continuation from inside an unfinished call
SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
SAMPLE = Sample(prompt=({"role": "user", "content": "q"},), ground_truth="42", data_source="arith_tools")


@pytest.fixture(scope="module")
def tok() -> Any:
    torch.manual_seed(0)
    return load_policy(SMALL, seed=0)[1]


@pytest.mark.parametrize(
    ("parser", "prefix"),
    [
        ("hermes", 'Let me compute. <tool_call>{"name": "calculator", "argum'),
        ("fenced", "Let me compute.\n```calculator\n6*"),
    ],
)
def test_a_continuation_from_inside_a_call_lets_the_policy_finish_it(
    tok: Any, parser: str, prefix: str
) -> None:
    # before: the half-written call was "pending" and ran at once as unparseable_call, so every
    # continuation from such a prefix (a response without results is segmented by its text) read an
    # error the policy never caused
    tools = ToolContext.in_process(ToolsConfig(names=("calculator",), parser=parser), 400)
    ids = list(tok(prefix, add_special_tokens=False)["input_ids"])
    row = resume_row(tok, [1, 2], SAMPLE, ids, tools, observed=[False] * len(ids))
    assert row.pending is None and not row.done
    # a complete call that ends the prefix is still run first, as before
    whole = {
        "hermes": '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>',
        "fenced": "```calculator\n6*7\n```",
    }[parser]
    ids = list(tok(whole, add_special_tokens=False)["input_ids"])
    row = resume_row(tok, [1, 2], SAMPLE, ids, tools, observed=[False] * len(ids))
    assert row.pending is not None and row.pending.arguments == {"expression": "6*7"}


# ------------------------------------------------- user tools that are not plain functions
def _echo(x: str, pre: str) -> str:
    return pre + x


class _Echo:
    def __call__(self, x: str) -> str:
        return "inst " + x


register_tool("rt_partial", description="a partial", parameters=OBJ)(functools.partial(_echo, pre="par "))
register_tool("rt_instance", description="a callable object", parameters=OBJ)(_Echo())


def test_user_tools_that_are_not_plain_functions_run_on_the_agents_workers() -> None:
    # before: AgentCallRunner raised TypeError from inspect.getsourcefile at the trainer's start
    with build_rewarder(RewardConfig(timeout_s=20.0)) as rewarder:
        runner = AgentCallRunner(rewarder, offered=["rt_partial", "rt_instance"], max_chars=64)
        got = runner([ToolCall("rt_partial", {"x": "a"}), ToolCall("rt_instance", {"x": "b"})], [None, None])
        # a tool raising SystemExit on a worker is the tool's error, not a crashed worker
        runner2 = AgentCallRunner(rewarder, offered=["rt_sysexit"], max_chars=64)
        (exited,) = runner2([ToolCall("rt_sysexit", {"x": "1"})], [None])
    assert [(o.error, o.text) for o in got] == [("", "par a"), ("", "inst b")]
    assert exited.error == "raised" and "SystemExit" in exited.text, exited


# ------------------------------------------- a user convention whose markup is not a tag or a fence
@pytest.mark.parametrize("markup", ["[TOOL_CALLS]", ">>>", "<<function>>"])
def test_a_user_conventions_markup_is_neutralised_whatever_it_looks_like(
    tok: Any, monkeypatch: pytest.MonkeyPatch, markup: str
) -> None:
    # before: only markup starting with "<" or holding backticks was rewritten ("[TOOL_CALLS]", Mistral's,
    # reached the observation as it was printed), though every registered convention's is promised
    hermes = PARSERS.get("hermes")
    monkeypatch.setitem(PARSERS._items, "rt_user", dataclasses.replace(hermes, markup=(markup,)))
    forged = f"1{markup}{markup[:-1]}"
    out = neutralise(forged)
    assert markup not in out and neutralise(out) == out, out
    tc = ToolsConfig(names=("calculator",), parser="hermes", render="convention")
    ids = observation_ids(tok, forged, parser=hermes, tools=tc, prompt=SAMPLE.prompt)
    assert markup not in tok.decode(ids, skip_special_tokens=True)


# --------------------------------------------- a hostile policy's turns through the whole loop
HC = '<tool_call>{"name": "%s", "arguments": %s}</tool_call>'
HOSTILE_TURNS = {
    # several calls in one turn: the turn ends at the first, the rest is never sampled or run
    "QA": ([HC % ("calculator", '{"expression": "1+1"}') * 6], ["", "", "", ""]),
    "QB": ([HC % ("__class__", "{}"), HC % ("../calculator", "{}"), "done"], ["unknown_tool"] * 2),
    "QC": (["<TOOL_CALL>x</TOOL_CALL> < tool_call >{}</ tool_call > no call"], []),
    "QD": (["The answer is 2. " + HC % ("calculator", '{"expression": "2"}'), "ok"], [""]),
    "QE": ([HC % ("calculator", '"{\\"expression\\": \\"NaN\\"}"'), "ok"], ["bad_expression"]),
    "QF": ([HC % ("calculator", '{"expression": "1", "expression": 1e400}'), "ok"], ["bad_arguments"]),
    # the tiny vocabulary has no NUL (decoded as nothing): "{\r\n}" has no name
    "QG": (["<tool_call>\x00{\r\n}</tool_call>", "ok"], ["bad_arguments"]),
}


def test_every_call_of_a_hostile_policy_gets_one_observation_and_only_they_are_masked(
    tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stepcredit.rollout.turns as turn_loop
    from stepcredit.rollout.engines import Completion
    from stepcredit.rollout.turns import TurnRow, observation_runs, run_turns

    model = load_policy(SMALL, seed=0)[0]

    class Scripted:
        def sample(self, model: Any, tok: Any, ctxs: Any, spec: Any, *, budgets: Any) -> list:
            out = []
            for c, room in zip(ctxs, budgets, strict=True):
                text = tok.decode(list(c), skip_special_tokens=True)
                turns = HOSTILE_TURNS[text[:2]][0]
                say = turns[min(text.count("<tool_response>"), len(turns) - 1)]
                ids = [*tok(say, add_special_tokens=False)["input_ids"], tok.eos_token_id]
                out.append(Completion(ids[:room]))
            return out

    monkeypatch.setattr(turn_loop, "engine_for", lambda model: Scripted())
    ran: list[ToolCall] = []
    inner = ToolContext.in_process(ToolsConfig(names=("calculator",), max_turns=4), 3000)

    def runner(calls: Any, kwargs: Any) -> list[Observation]:
        ran.extend(calls)
        return inner.runner(calls, kwargs)

    rows = [TurnRow(list(tok(q, add_special_tokens=False)["input_ids"]), SAMPLE, 3000) for q in HOSTILE_TURNS]
    run_turns(model, tok, rows, inner.with_runner(runner), temperature=0.0)
    assert len(ran) == sum(r.calls for r in rows)
    for q, r in zip(HOSTILE_TURNS, rows, strict=True):
        assert r.done and r.outcomes == HOSTILE_TURNS[q][1], (q, r.outcomes)
        runs = observation_runs(r.obs)
        assert len(runs) == r.calls == len(r.outcomes)  # one observation per call run, nothing else
        for a, b in runs:  # each observation is the convention's result block, whole
            block = tok.decode(r.ids[a:b], skip_special_tokens=True)
            assert block.startswith("\n<tool_response>\n") and block.endswith("</tool_response>\n")
        policy_text = tok.decode([t for t, o in zip(r.ids, r.obs, strict=True) if not o])
        assert "<tool_response>" not in policy_text
