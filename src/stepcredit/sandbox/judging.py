"""Judging test cases on the host, the same whichever executor ran the program (the local sandbox, SandboxFusion)."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from stepcredit.config import SandboxConfig
from stepcredit.sandbox.asserts import AssertFailed, evaluate_assert
from stepcredit.sandbox.cases import CaseMode, TestCase, outputs_match, parse_tests, values_match
from stepcredit.sandbox.plain import NotPlain
from stepcredit.sandbox.protocol import Op
from stepcredit.sandbox.remote import (
    Call,
    NeedsConversation,
    PrecomputedLink,
    ProgramRaised,
    Remote,
    RemoteLink,
)

PASSED, FAILED, TIMEOUT, ERROR, SANDBOX_ERROR = "passed", "failed", "timeout", "error", "sandbox_error"
_SKIPPED = "skipped after an earlier failure"


@dataclass
class CaseOutcome:
    """The verdict on one test case."""

    status: str
    """passed, failed, timeout, error or sandbox_error."""
    message: str = ""
    latency_s: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, "latency_s": round(self.latency_s, 4)}


class SandboxFailure(Exception):
    """The sandbox (not the program) failed: bubblewrap refused, the runner died or stopped answering."""


class _CaseEnded(Exception):
    """The case's processes finished (exited, crashed, timed out) while the host waited for an answer."""

    def __init__(self, done: dict[str, Any]) -> None:
        super().__init__("case ended")
        self.done = done


def _tail(b: bytes | str, n: int = 600) -> str:
    return (b.decode("utf-8", "replace") if isinstance(b, bytes) else b)[-n:]


class Executor(Protocol):
    """What runs programs for code rewards: the local :class:`Sandbox` or a SandboxFusion service
    (:class:`~stepcredit.sandbox.fusion.FusionSandbox`). It returns one
    :class:`CaseOutcome` per case, judged on the host by :func:`judge_report` / :func:`verdict`."""

    cfg: SandboxConfig

    def unavailable(self) -> str | None:
        """None when known-good programs pass (checked once), else why not."""
        ...

    def run_program(
        self, program: str, cases: Sequence[TestCase], *, stop_on_failure: bool = False
    ) -> list[CaseOutcome]:
        """Verdicts of ``cases`` of one program."""
        ...

    def check_many(
        self, jobs: Sequence[tuple[str, Sequence[TestCase]]], *, stop_on_failure: bool = False
    ) -> list[list[CaseOutcome]]:
        """Verdicts of several programs' cases, ``cfg.concurrency`` at a time."""
        ...


def probe_executor(executor: Executor) -> str | None:
    """Run one known-good program through both ways a case is judged (stdout, and calls from the host);
    None when it passes, else why not."""
    program = "def f(x):\n    return [x, x * 2]\nprint(6 * 7)\n"
    cases = parse_tests({"inputs": [""], "outputs": ["42"]}) + parse_tests(["assert f(3) == [3, 6]"])
    outs = executor.run_program(program, cases)
    bad = next((o for o in outs if o.status != PASSED), None)
    if bad is None:
        return None
    if bad.status == SANDBOX_ERROR:
        return f"the sandbox does not start: {bad.message}"
    return f"the sandbox's probe program failed ({bad.status}): {bad.message}"


def run_many(
    run_program: Callable[..., list[CaseOutcome]],
    jobs: Sequence[tuple[str, Sequence[TestCase]]],
    concurrency: int,
    *,
    stop_on_failure: bool,
) -> list[list[CaseOutcome]]:
    """``run_program(program, cases)`` for every job, ``concurrency`` at a time (any executor's
    ``check_many``: the local sandbox and a SandboxFusion service alike)."""
    if len(jobs) == 1:
        return [run_program(jobs[0][0], jobs[0][1], stop_on_failure=stop_on_failure)]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(run_program, p, c, stop_on_failure=stop_on_failure) for p, c in jobs]
        return [f.result() for f in futures]


def judge_report(
    case: TestCase, done: dict[str, Any], converse: Callable[[], CaseOutcome] | None
) -> CaseOutcome:
    """The verdict on a case that needed no conversation, from the executor's report ``done``.

    ``done`` is the runner's report (exit code or signal, timeout, overflow, stdout, stderr tail and the
    answers to the case's calls); every executor (the local sandbox, a SandboxFusion service) produces
    one, so judging is the same whichever ran the program. ``converse`` asks the program live when the
    test wants more than the calls known in advance. A stdio case's outcome carries ``done`` as detail.
    """
    if case.mode is CaseMode.STDIO:
        out = _classify(done, case, early=False)
        out.detail = done
        return out
    calls = _calls(case)
    replies = done.get("replies")
    clean = done.get("op") == Op.DONE and done.get("exit") == 0 and not done.get("sig")
    broke = ("timeout", "overflow", "memory", "cpu", "leftover")  # a limit, or processes left behind
    clean = clean and not any(done.get(k) for k in broke)
    if not clean or not isinstance(replies, list) or len(replies) < len(calls):
        return _classify(done, case, early=True)
    if len(replies) > len(calls):
        return CaseOutcome(FAILED, "the program wrote on the sandbox's answer channel")
    parsed = []
    for raw in replies:
        try:
            parsed.append(json.loads(raw) if isinstance(raw, str) else None)
        except (json.JSONDecodeError, RecursionError):
            parsed.append(None)
    try:
        return verdict(case, PrecomputedLink(calls, parsed))
    except NeedsConversation:  # the test wanted more than the calls known in advance: ask live
        if converse is None:
            raise
        return converse()


def verdict(case: TestCase, link: RemoteLink) -> CaseOutcome:
    """Judge an assert or call case on the host, asking the program through ``link``."""
    try:
        if case.mode is CaseMode.ASSERT:
            assert case.plan is not None
            evaluate_assert(case.plan, link)
            return CaseOutcome(PASSED)
        value = link.auto(case.fn_name, case.args)
        if type(value) is Remote:
            raise NotPlain(f"{case.fn_name}(...) did not return a plain builtin value")
        ok = values_match(value, case.expected)
        return CaseOutcome(PASSED if ok else FAILED, "" if ok else f"returned {str(value)[:200]}")
    except (_CaseEnded, NeedsConversation):
        raise
    except AssertFailed:
        return CaseOutcome(FAILED, "assertion failed")
    except NotPlain as e:
        return CaseOutcome(FAILED, str(e)[:300])
    except ProgramRaised as e:
        return CaseOutcome(ERROR, str(e)[:800])
    except Exception as e:  # the test raised on the program's (plain) values: TypeError, NameError...
        return CaseOutcome(ERROR, f"the test raised {type(e).__name__}: {str(e)[:300]}")


def _calls(case: TestCase) -> tuple[Call, ...]:
    if case.mode is CaseMode.CALL:
        return (("auto", case.fn_name, tuple(case.args), {}),)
    assert case.plan is not None and case.plan.calls is not None
    return case.plan.calls


def _request(case: TestCase) -> dict[str, Any] | None:
    """The runner's request for a case that needs no conversation, or None."""
    if case.mode is CaseMode.STDIO:
        return {"op": "case", "mode": "stdio", "stdin": case.stdin}
    if case.mode is CaseMode.CALL or (case.plan is not None and case.plan.calls is not None):
        return {"op": "case", "mode": "calls", "module": case.mode.module, "calls": list(_calls(case))}
    return None


def _timed(out: CaseOutcome, t0: float) -> CaseOutcome:
    out.latency_s = time.monotonic() - t0
    return out


def memory_message(held: Any) -> str:
    """The verdict's message when the runner stopped a case whose processes held too much memory together."""
    mib = held / (1 << 20) if isinstance(held, (int, float)) else float("nan")
    return f"memory limit exceeded: the program's processes held {mib:.0f} MiB together"


def cpu_message(spent: Any) -> str:
    """The verdict's message when the runner stopped a case whose processes spent too much CPU time together."""
    s = float(spent) if isinstance(spent, (int, float)) else float("nan")
    return f"CPU-time limit exceeded: the program's processes spent {s:.1f} s together"


def _classify(done: dict[str, Any], case: TestCase, *, early: bool) -> CaseOutcome:
    """The verdict from the runner's ``done`` report; ``early``: the case ended before its test finished."""
    if done.get("op") != Op.DONE:
        raise SandboxFailure(f"unexpected message from the sandbox runner: {str(done)[:200]}")
    if done.get("leftover"):
        return CaseOutcome(SANDBOX_ERROR, "processes of the case could not be killed")
    err = _tail(str(done.get("err", ""))).strip()
    if done.get("timeout"):
        return CaseOutcome(TIMEOUT, "wall-clock limit exceeded")
    if done.get("overflow"):
        return CaseOutcome(ERROR, "output limit exceeded")
    if done.get("memory"):
        return CaseOutcome(ERROR, memory_message(done["memory"]))
    if done.get("cpu"):
        return CaseOutcome(TIMEOUT, cpu_message(done["cpu"]))
    sig, code = done.get("sig"), done.get("exit")
    if sig == signal.SIGXCPU:
        return CaseOutcome(TIMEOUT, "CPU-time limit exceeded")
    if sig:
        name = ""
        with contextlib.suppress(ValueError, TypeError):
            name = f" {signal.Signals(sig).name}"
        return CaseOutcome(ERROR, f"killed by signal {sig}{name}: {err}"[:800])
    if code != 0:
        return CaseOutcome(ERROR, f"exit {code}: {err}"[:800])
    if case.mode is not CaseMode.STDIO:
        if early:
            return CaseOutcome(FAILED, "the program exited before the test ran")
        return CaseOutcome(PASSED)
    got = str(done.get("out", ""))
    ok = outputs_match(got, str(case.expected))
    return CaseOutcome(PASSED if ok else FAILED, "" if ok else f"wrong output: {got[:200]!r}")
