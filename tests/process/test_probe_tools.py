"""``stepcredit probe`` and ``stepcredit explain`` value fixed traces as training does when the config's
rollouts call tools (``rollout.mode=tools``, ``--preset tools``): a continuation from a prefix that ends
at a calculator call runs the call in the reward agent and reads its real result.

The policy is the scripted one of ``test_tool_continuations.py`` (the ``arith_tools`` format, the real
calculator): from a right call it copies the call's result into its answer, and at a call with no
result after it (no tool ran) it can only guess a wrong answer.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import stepcredit.process.continuation as continuation
import stepcredit.trainer.setup as setup
from stepcredit.cli.main import main
from stepcredit.models import build_tokenizer
from stepcredit.reward.tools import AgentCallRunner


def _tool_continuations() -> ModuleType:
    """The helpers of ``test_tool_continuations.py`` (the scripted policy), imported once under the name
    pytest gives that file, so its tools register once whichever file is collected first."""
    name = "tests.process.test_tool_continuations"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).with_name("test_tool_continuations.py")
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


tc = _tool_continuations()
ANSWERED = tc.CALL + tc.RESULT.format(22944)  # the call and the calculator's real result


def scripted(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[Any]]:
    """The copier policy as the model every command loads, and the runners its tool continuations got."""
    tok = build_tokenizer()
    model = tc.policy(monkeypatch, tok, tc.copier)  # the turn loop samples from the script
    # the one model set-up hands every command this model, bound to itself as its engine
    monkeypatch.setattr(setup, "policy", lambda cfg: contextlib.nullcontext((model, tok)))
    runners: list[Any] = []
    run_turns = continuation.run_turns

    def spy(model: Any, tok: Any, rows: Any, tools: Any, **kw: Any) -> Any:
        runners.append(tools.runner)
        return run_turns(model, tok, rows, tools, **kw)

    monkeypatch.setattr(continuation, "run_turns", spy)
    return model, runners


def last_json(out: str) -> dict[str, Any]:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["tools", "flat"])
def test_probe_continues_a_call_with_its_real_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    model, runners = scripted(monkeypatch)
    # A clean arith_tools trace whose answer turn restates the product as an equation, the step the
    # probe makes wrong (22944 -> 22944 + d, carried into the answer). Its turns (episodes): [the call],
    # [the result, the equation, the answer]; the wrong step is in the second.
    solution = ANSWERED + "48 * 478 = 22944, so\nThe answer is\n22944"
    row = {
        "data_source": "arith_tools",
        "prompt": [{"role": "user", "content": tc.PROMPT}],
        "reward_model": {"style": "rule", "ground_truth": "22944"},
        "extra_info": {"solution": solution},
    }
    data = tmp_path / "traces.jsonl"
    data.write_text(json.dumps(row) + "\n")
    argv = ["probe", "--model", "tiny", "--data", str(data), "--preset", "tools", "--n", "1"]
    argv += ["--estimators", "greedy_continuation", "--json", "trainer.threads=1"]
    argv += ["process.mc_max_new_tokens=200", f"rollout.mode={mode}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    got = last_json(out)["estimators"]["greedy_continuation"]
    answered = [c for c in model.contexts if c.endswith(ANSWERED)]
    if mode == "tools":
        # V_1, the value of the prefix that ends at the (right) call: its continuation ran the call in the
        # reward agent, read 22944 and copied it, so V_1 = 1 (the wrong step's "V before"); V_2 is the
        # corrupted trace's own reward, 0. Clean [1, 1, 1], corrupted [1, 1, 0]: U at the wrong step
        # -1 < 0, and it is the only minimum.
        assert got["v_before"] == 1.0 and got["v_after"] == 0.0
        assert got["lower"] == 1.0 and got["argmin"] == 1.0
        assert answered  # a continuation's context held the call and the calculator's result
        assert runners and all(isinstance(r, AgentCallRunner) for r in runners)
        assert "continuations call tools: calculator (fenced)" in out
    else:
        # without tools the continuation from the call goes on as text, no result, a guess: V_1 = 0.
        # Clean [0, 0, 1], corrupted [0, 0, 0]: U at the wrong step 0 < 1, but it ties with the first.
        assert got["v_before"] == 0.0 and got["v_after"] == 0.0
        assert got["lower"] == 1.0 and got["argmin"] == 0.5
        assert not answered and not runners


@pytest.mark.parametrize("mode", ["tools", "flat"])
def test_explain_values_a_trace_that_ends_at_a_call_with_its_result(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    model, runners = scripted(monkeypatch)
    argv = ["explain", "--model", "tiny", "--prompt", tc.PROMPT, "--response", tc.CALL, "--answer", "22944"]
    argv += ["--preset", "tools", "--json", "process.value_estimator=greedy_continuation"]
    argv += ["process.mc_max_new_tokens=200", f"rollout.mode={mode}"]
    assert main(argv) == 0
    got = last_json(capsys.readouterr().out)
    # the response is the call alone (not finished): V after it is its continuation's score
    answered = [c for c in model.contexts if c.endswith(ANSWERED)]
    if mode == "tools":
        # the call runs (through the reward agent), its result is appended, the policy copies it: 1
        assert got["episodes"][-1]["value"] == 1.0 and got["v0"] == 1.0
        assert answered and runners and all(isinstance(r, AgentCallRunner) for r in runners)
    else:
        # no tool runs: the policy guesses after the call: 0
        assert got["episodes"][-1]["value"] == 0.0 and got["v0"] == 0.0
        assert not answered and not runners


def test_probe_refuses_grown_trees_with_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted(monkeypatch)
    argv = ["probe", "--model", "tiny", "--data", "arith", "--preset", "tools", "--grow-trees"]
    assert main([*argv, "--estimators", "tree", "--n", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--grow-trees" in err and "rollout.mode=tools" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(("preset", "want"), [("tools", 0.0), ("process", 1.0)])
def test_explain_scores_the_outcome_with_the_tasks_reward(
    capsys: pytest.CaptureFixture[str], preset: str, want: float
) -> None:
    # "68 * 692" is 47056 to the math verifier (arith); the tool task's reward wants the computed number
    argv = [
        "explain",
        "--model",
        "tiny",
        "--prompt",
        "Oli has 68 boxes with 692 eggs each. How many eggs now?",
    ]
    argv += ["--response", "The answer is 68 * 692", "--answer", "47056", "--preset", preset, "--json"]
    argv += ["process.value_estimator=forced_answer_logprob", "rollout.mode=flat"]
    assert main(argv) == 0
    assert last_json(capsys.readouterr().out)["outcome"] == want
