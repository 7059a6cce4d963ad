"""A local code sandbox for code rewards (data_source or ability ``code``), built on bubblewrap.

One sandbox per program; every test case of that program runs inside it, each in a fresh child
process forked by the sandbox's runner (:mod:`.runner`) with an emptied working directory:

* **namespaces** (``bwrap --unshare-all --disable-userns --as-pid-1``): its own user, pid, network
  (loopback only, nothing routed), mount, IPC, UTS and cgroup namespaces; nested user namespaces are
  refused. The runner is pid 1: when it exits the kernel kills every process left in the namespace, and
  between cases it kills every process but itself (``kill(-1)``), so nothing outlives its case.
  bwrap's ``--die-with-parent`` takes the sandbox down if we die.
* **filesystem**: a read-only view of ``/usr`` (and, relocated to ``/opt/stepcredit-python``, the
  interpreter's own ``bin``/``lib`` when it lives elsewhere, its site-packages hidden), a fresh
  ``/proc`` and minimal ``/dev``, the program's source read-only under ``/box``, and a size-capped tmpfs
  as cwd and ``/tmp``, emptied before each case; the root and ``/dev`` are remounted read-only. Nothing
  of the host's ``/home``, ``/root``, ``/etc`` or working directory is visible, and no file holds a test.
* **limits** set before any untrusted code runs: RLIMIT_CPU (per case), AS, FSIZE, NPROC (counted inside
  the run's user namespace), NOFILE, CORE; a wall-clock deadline per case that kills the case's
  processes; stdout/stderr capped (a case that writes more is stopped).
* **identity**: started as root, each sandbox gets its own unprivileged uid (claimed with a lock file in
  a root-only directory, so concurrent runs and processes never share one) and every process of that
  uid is killed afterwards; started as a normal user, it runs as that user inside its own namespaces.
* **environment**: cleared; only ``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` (and ``LD_LIBRARY_PATH`` for a
  relocated interpreter) are set.
* **judging** happens here, on the host (:mod:`.cases`): the sandbox gets a case's stdin or requests
  such as "call ``f`` with (1, 2)", never an expected value, an assert statement or a nonce; what comes
  back is decoded strictly to plain builtin values and compared here.

Statuses: a wrong answer is ``ok`` with a lower score; a program that crashed, exceeded a limit or
wrote too much is ``error`` and one that ran past its deadline (wall or CPU) is ``timeout``; both keep
their score (fraction of cases passed). ``sandbox_error`` (NaN score) means the sandbox itself failed
(bubblewrap missing or refused, the runner never started): never the program's fault, never a pass.

Execution sits behind :class:`Executor` (this bubblewrap :class:`Sandbox`, or a SandboxFusion service:
:mod:`.fusion`, ``reward.sandbox.backend``); judging (:func:`judge_report`, :func:`verdict`) is the same
whichever executes.

Test cases follow VeRL's ground-truth formats: ``{"inputs": [...], "outputs": [...]}`` (stdin/stdout),
``{"assert_case": [...]}`` (assert statements about the program) and
``{"fn_name": ..., "inputs": [...], "outputs": [...]}`` (call the function, or ``Solution().fn``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import marshal
import math
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from stepcredit.config import SandboxConfig
from stepcredit.reward.verifiers.code.cases import (
    AssertFailed,
    Call,
    NeedsConversation,
    NotPlain,
    PrecomputedLink,
    ProgramRaised,
    Remote,
    RemoteLink,
    TestCase,
    evaluate_assert,
    extract_code,
    outputs_match,
    parse_tests,
    values_match,
)
from stepcredit.types import RewardResult, Sample, Status

__all__ = [
    "CaseOutcome",
    "CodeScorer",
    "Executor",
    "Sandbox",
    "TestCase",
    "aggregate",
    "extract_code",
    "get_sandbox",
    "judge_report",
    "make_executor",
    "outputs_match",
    "parse_tests",
    "score_code",
    "score_code_batch",
    "values_match",
]

RUNNER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
RUNNER_FAILED = 97
"""Exit code of the runner (or of a case's child) when its own setup failed."""
UID_BASE = 1_700_000
"""Unprivileged uids used for runs when stepcredit runs as root (one per concurrent sandbox)."""
UID_COUNT = 4096
STARTUP_TIMEOUT_S = 20.0
"""How long the sandbox may take to start before it counts as a sandbox failure (a loaded machine)."""
REPLY_SLACK_S = 5.0
"""How long past a case's deadline the host waits for the runner before it stops the sandbox."""
PYTHON_MOUNT = "/opt/stepcredit-python"
"""Where an interpreter from outside ``/usr`` appears inside the sandbox (its host path stays hidden)."""

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


class _Session:
    """One running sandbox: the bwrap process and the line protocol with its runner (host side)."""

    def __init__(self, proc: subprocess.Popen[bytes], line_cap: int) -> None:
        self.proc = proc
        self.line_cap = line_cap
        assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
        self._out = proc.stdout.fileno()
        self._err = proc.stderr.fileno()
        self._in = proc.stdin.fileno()
        os.set_blocking(self._in, False)
        self._outbuf = bytearray()
        self._buf = bytearray()
        self.stderr = bytearray()
        self._sel = selectors.DefaultSelector()
        for fd in (self._out, self._err):
            os.set_blocking(fd, False)
            self._sel.register(fd, selectors.EVENT_READ)

    def send(self, msg: dict[str, Any]) -> None:
        """Queue a message; it is written while we wait for replies (so neither side blocks the other)."""
        frame = marshal.dumps(msg)  # plain data we made; the runner trusts the host
        self._outbuf += len(frame).to_bytes(4, "big") + frame
        self._flush_out()

    def _flush_out(self) -> None:
        while self._outbuf:
            try:
                n = os.write(self._in, self._outbuf[: 1 << 16])
            except BlockingIOError:
                break
            except OSError as e:
                raise SandboxFailure(f"the sandbox runner is gone ({e})") from None
            del self._outbuf[:n]
        registered = self._in in self._sel.get_map()
        if self._outbuf and not registered:
            self._sel.register(self._in, selectors.EVENT_WRITE)
        elif not self._outbuf and registered:
            self._sel.unregister(self._in)

    def recv(self, deadline: float) -> dict[str, Any]:
        """The runner's next message; SandboxFailure if it dies, says nonsense or misses ``deadline``."""
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[: i + 1]
                try:
                    msg = json.loads(line)
                except (json.JSONDecodeError, RecursionError, UnicodeDecodeError):
                    raise SandboxFailure(
                        f"unreadable message from the sandbox runner: {line[:200]!r}"
                    ) from None
                if type(msg) is not dict:
                    raise SandboxFailure("unreadable message from the sandbox runner")
                return msg
            if len(self._buf) > self.line_cap:
                raise SandboxFailure("the sandbox runner sent an oversized message")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxFailure("the sandbox runner stopped answering")
            if self._out not in self._sel.get_map():
                raise SandboxFailure(self._exit_message())
            for key, _ in self._sel.select(min(remaining, 1.0)):
                fd = int(key.fd)
                if fd == self._in:
                    self._flush_out()
                    continue
                try:
                    data = os.read(fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    self._sel.unregister(fd)
                    if fd == self._out:  # the runner is gone: nothing more will come
                        raise SandboxFailure(self._exit_message())
                    continue
                if fd == self._out:
                    self._buf += data
                elif len(self.stderr) < 64 * 1024:
                    self.stderr += data

    def _exit_message(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        code = self.proc.returncode
        return f"the sandbox exited ({code}): {_tail(bytes(self.stderr), 400).strip()}"

    def close(self, *, graceful: bool) -> bool:
        """Stop the sandbox; True when it ended by itself (then nothing of it can be left, see below)."""
        clean = False
        if graceful and not self._outbuf:
            # End of input: the runner exits. The kernel then kills the rest of its pid namespace and
            # only lets pid 1 finish exiting once the namespace is empty (zap_pid_ns_processes), so
            # when bwrap reports its child's clean exit no process of the sandbox is left anywhere.
            with contextlib.suppress(Exception):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                clean = self.proc.wait(timeout=2) == 0
        _kill_group(self.proc)
        self._sel.close()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(Exception):
                if f is not None:
                    f.close()
        return clean


class Executor(Protocol):
    """What runs programs for code rewards: the local :class:`Sandbox` or a SandboxFusion service
    (:class:`~stepcredit.reward.verifiers.code.fusion.FusionSandbox`). It returns one
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


def make_executor(cfg: SandboxConfig) -> Executor:
    """The executor ``cfg.backend`` names: ``local`` (bubblewrap here) or ``sandbox_fusion`` (``cfg.url``)."""
    if cfg.backend == "sandbox_fusion":
        from stepcredit.reward.verifiers.code.fusion import FusionSandbox

        return FusionSandbox(cfg)
    return Sandbox(cfg)


class Sandbox:
    """Runs untrusted Python in bubblewrap with limits; thread-safe, at most ``cfg.concurrency`` at once."""

    def __init__(self, cfg: SandboxConfig | None = None, *, bwrap: str | None = None) -> None:
        self.cfg = cfg or SandboxConfig()
        self._sem = threading.BoundedSemaphore(self.cfg.concurrency)
        self._bwrap = bwrap if bwrap is not None else (shutil.which("bwrap") or "")
        self._python = self.cfg.python or _default_python()
        self._probe_lock = threading.Lock()
        self._probe: str | None = None
        self._probed = False
        self._root = os.geteuid() == 0

    # ------------------------------------------------------------------------------ availability
    def unavailable(self) -> str | None:
        """None when known-good programs pass in the sandbox, else why not (checked once, then cached)."""
        with self._probe_lock:
            if not self._probed:
                self._probe = self._check_works()
                self._probed = True
            return self._probe

    def _check_works(self) -> str | None:
        if not self._bwrap:
            return "bubblewrap (bwrap) is not installed: run `make setup` or `apt-get install bubblewrap`"
        if not os.path.exists(self._python):
            return f"sandbox interpreter {self._python} does not exist (reward.sandbox.python)"
        return probe_executor(self)

    # ------------------------------------------------------------------------------------- run
    def run_program(
        self, program: str, cases: Sequence[TestCase], *, stop_on_failure: bool = False
    ) -> list[CaseOutcome]:
        """Verdicts of ``cases``, all run in one sandbox (blocks for a concurrency slot)."""
        with self._sem:
            try:
                return self._run_program(program, list(cases), stop_on_failure)
            except Exception as e:  # a bug or an OS failure on our side: never the program's fault
                return [CaseOutcome(SANDBOX_ERROR, f"sandbox failure: {type(e).__name__}: {e}")] * len(cases)

    def _run_program(self, program: str, cases: list[TestCase], stop_on_failure: bool) -> list[CaseOutcome]:
        if not cases:
            return []
        if not self._bwrap:
            return [CaseOutcome(SANDBOX_ERROR, "bubblewrap (bwrap) is not installed")] * len(cases)
        cfg = self.cfg
        limits = {
            "cpu_s": cfg.cpu_s or math.ceil(cfg.timeout_s) + 1,
            "memory_mb": cfg.memory_mb,
            "file_size_mb": cfg.file_size_mb,
            "max_procs": cfg.max_procs,
            "output_limit_kb": cfg.output_limit_kb,
            "timeout_s": cfg.timeout_s,
        }
        host_dir = tempfile.mkdtemp(prefix="stepcredit-sbx-")
        # Traversable (not listable) so that bwrap, started as the run's uid, can bind the files in.
        os.chmod(host_dir, 0o711)
        outcomes: list[CaseOutcome] = []
        try:
            for name, text in (("solution.py", program), ("runner.py", _runner_source())):
                path = os.path.join(host_dir, name)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                os.chmod(path, 0o444)
            with _claim_uid(self._root) as uid:
                cmd = self._command(host_dir, limits)
                as_uid: dict[str, Any] = (
                    {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
                )
                try:
                    proc = subprocess.Popen(
                        cmd,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        start_new_session=True,
                        cwd="/",
                        env={"PATH": "/usr/bin:/bin"},
                        **as_uid,
                    )
                except OSError as e:
                    return [CaseOutcome(SANDBOX_ERROR, f"cannot start bubblewrap: {e}")] * len(cases)
                session = _Session(proc, line_cap=4 * cfg.output_limit_kb * 1024 + (1 << 20))
                clean = False
                try:
                    outcomes = self._run_cases(session, cases, stop_on_failure)
                    # Cases sent ahead and skipped after a failure would still run: stop those by force.
                    clean = all(o.status != SANDBOX_ERROR and o.message != _SKIPPED for o in outcomes)
                finally:
                    clean = session.close(graceful=clean)
                    # The uid's own sweep is the safety net for a sandbox we had to kill.
                    left = _sweep_uid(uid) if uid is not None and not clean else 0
                if left:
                    msg = f"{left} processes outlived the sandbox and were killed"
                    outcomes = [CaseOutcome(SANDBOX_ERROR, msg)] * len(cases)
                return outcomes
        finally:
            shutil.rmtree(host_dir, ignore_errors=True)

    def _run_cases(
        self, session: _Session, cases: list[TestCase], stop_on_failure: bool
    ) -> list[CaseOutcome]:
        try:
            hello = session.recv(time.monotonic() + max(STARTUP_TIMEOUT_S, self.cfg.timeout_s))
        except SandboxFailure as e:
            return [CaseOutcome(SANDBOX_ERROR, str(e))] * len(cases)
        if hello.get("op") != "hello":
            why = f"sandbox runner failed: {str(hello.get('message'))[:400]}"
            return [CaseOutcome(SANDBOX_ERROR, why)] * len(cases)
        outcomes: list[CaseOutcome] = []
        sent = 0  # cases whose request went out ahead (they need no conversation with the host)
        try:
            for k, case in enumerate(cases):
                # Send every following case that needs no conversation at once: the runner works through
                # them while we judge, so the host is off the critical path between cases.
                while sent < len(cases) and sent >= k:
                    request = _request(cases[sent])
                    if request is None:
                        break
                    session.send(request)
                    sent += 1
                t0 = time.monotonic()
                deadline = t0 + self.cfg.timeout_s + REPLY_SLACK_S
                if k < sent:
                    converse = functools.partial(self._converse, session, case)
                    out = judge_report(case, session.recv(deadline), converse)
                else:
                    out = self._converse(session, case)
                    sent = k + 1
                outcomes.append(_timed(out, t0))
                if stop_on_failure and out.status != PASSED:
                    skipped = CaseOutcome(FAILED, _SKIPPED)
                    return outcomes + [skipped] * (len(cases) - k - 1)
        except SandboxFailure as e:
            return outcomes + [CaseOutcome(SANDBOX_ERROR, str(e))] * (len(cases) - len(outcomes))
        return outcomes

    def _converse(self, session: _Session, case: TestCase) -> CaseOutcome:
        """A case whose test talks with the program while it runs (handles, comprehensions...)."""
        deadline = time.monotonic() + self.cfg.timeout_s + REPLY_SLACK_S
        module = "__main__" if case.mode == "assert" else "solution"
        # __name__ is not "__main__" in call mode: a LeetCode-style solution's own demo under
        # `if __name__ == "__main__"` must not run (and block on stdin) when we only call its function.
        session.send({"op": "case", "mode": "eval", "module": module})
        first = session.recv(deadline)
        if first.get("op") != "ready":
            return _classify(first, case, early=True)

        def ask(request: dict[str, Any]) -> dict[str, Any]:
            session.send({"op": "req", "r": request})
            msg = session.recv(deadline)
            if msg.get("op") != "reply":
                raise _CaseEnded(msg)
            raw = msg.get("r")
            try:
                reply = json.loads(raw) if isinstance(raw, str) else None
            except (json.JSONDecodeError, RecursionError):
                reply = None
            if type(reply) is not dict:
                raise NotPlain("an unreadable answer from the program")
            return reply

        try:
            result = verdict(case, RemoteLink(ask))
        except _CaseEnded as e:
            return _classify(e.done, case, early=True)
        session.send({"op": "end"})
        done = session.recv(deadline)
        if done.get("op") != "done":
            raise SandboxFailure(f"unexpected message from the sandbox runner: {str(done)[:200]}")
        # The verdict stands unless the case broke a limit meanwhile (too much output, a leftover).
        if done.get("leftover"):
            return CaseOutcome(SANDBOX_ERROR, "processes of the case could not be killed")
        if done.get("overflow"):
            return CaseOutcome(ERROR, "output limit exceeded")
        return result

    def _command(self, host_dir: str, limits: dict[str, Any]) -> list[str]:
        cfg = self.cfg
        cmd = [self._bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
        cmd += ["--as-pid-1", "--new-session", "--hostname", "sandbox", "--cap-drop", "ALL"]
        cmd += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                cmd += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                cmd += ["--ro-bind", top, top]
        python, mounts, env_extra = _python_mounts(self._python)
        cmd += mounts
        cmd += ["--proc", "/proc", "--dev", "/dev"]
        cmd += ["--size", str(cfg.tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        for name in ("solution.py", "runner.py"):
            cmd += ["--ro-bind", os.path.join(host_dir, name), f"/box/{name}"]
        cmd += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
        for k, v in {**env, **env_extra}.items():
            cmd += ["--setenv", k, v]
        order = ("cpu_s", "memory_mb", "file_size_mb", "max_procs", "output_limit_kb", "timeout_s")
        cmd += ["--", python, "-I", "-S", "-B", "/box/runner.py", *(str(limits[k]) for k in order)]
        return cmd

    # --------------------------------------------------------------------------------- verdicts
    def judge(self, program: str, case: TestCase) -> CaseOutcome:
        """Run one case in its own sandbox and classify it: passed, failed, timeout, error or sandbox_error."""
        return self.run_program(program, [case])[0]

    def check(
        self, program: str, cases: Sequence[TestCase], *, stop_on_failure: bool = False
    ) -> list[CaseOutcome]:
        """Verdicts of all cases (cases after the first non-pass are skipped when ``stop_on_failure``)."""
        return self.run_program(program, cases, stop_on_failure=stop_on_failure)

    def check_many(
        self, jobs: Sequence[tuple[str, Sequence[TestCase]]], *, stop_on_failure: bool = False
    ) -> list[list[CaseOutcome]]:
        """Verdicts of several programs' cases, ``cfg.concurrency`` sandboxes (one per program) at a time."""
        return run_many(self.run_program, jobs, self.cfg.concurrency, stop_on_failure=stop_on_failure)


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
    if case.mode == "stdio":
        out = _classify(done, case, early=False)
        out.detail = done
        return out
    calls = _calls(case)
    replies = done.get("replies")
    clean = done.get("op") == "done" and done.get("exit") == 0 and not done.get("sig")
    clean = clean and not (done.get("timeout") or done.get("overflow") or done.get("leftover"))
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
        if case.mode == "assert":
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
    if case.mode == "call":
        return (("auto", case.fn_name, tuple(case.args), {}),)
    assert case.plan is not None and case.plan.calls is not None
    return case.plan.calls


def _request(case: TestCase) -> dict[str, Any] | None:
    """The runner's request for a case that needs no conversation, or None."""
    if case.mode == "stdio":
        return {"op": "case", "mode": "stdio", "stdin": case.stdin}
    if case.mode == "call" or (case.plan is not None and case.plan.calls is not None):
        module = "solution" if case.mode == "call" else "__main__"
        return {"op": "case", "mode": "calls", "module": module, "calls": list(_calls(case))}
    return None


def _timed(out: CaseOutcome, t0: float) -> CaseOutcome:
    out.latency_s = time.monotonic() - t0
    return out


def _classify(done: dict[str, Any], case: TestCase, *, early: bool) -> CaseOutcome:
    """The verdict from the runner's ``done`` report; ``early``: the case ended before its test finished."""
    if done.get("op") != "done":
        raise SandboxFailure(f"unexpected message from the sandbox runner: {str(done)[:200]}")
    if done.get("leftover"):
        return CaseOutcome(SANDBOX_ERROR, "processes of the case could not be killed")
    err = _tail(str(done.get("err", ""))).strip()
    if done.get("timeout"):
        return CaseOutcome(TIMEOUT, "wall-clock limit exceeded")
    if done.get("overflow"):
        return CaseOutcome(ERROR, "output limit exceeded")
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
    if case.mode != "stdio":
        if early:
            return CaseOutcome(FAILED, "the program exited before the test ran")
        return CaseOutcome(PASSED)
    got = str(done.get("out", ""))
    ok = outputs_match(got, str(case.expected))
    return CaseOutcome(PASSED if ok else FAILED, "" if ok else f"wrong output: {got[:200]!r}")


# ------------------------------------------------------------------------------------- helpers
@functools.lru_cache(maxsize=1)
def _runner_source() -> str:
    with open(RUNNER_PATH, encoding="utf-8") as f:
        return f.read()


def _base_python() -> str:
    exe = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(exe)


def _default_python() -> str:
    """The host's base interpreter if an unprivileged uid can reach it, else the system's python3."""
    base = _base_python()
    if os.geteuid() != 0 or _world_reachable(base):
        return base
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand):
            return os.path.realpath(cand)
    return base


def _world_reachable(path: str) -> bool:
    # The run's uid is nobody's: every directory on the way needs o+x (e.g. /root is usually 0700).
    p = os.path.realpath(path)
    while True:
        parent = os.path.dirname(p)
        if parent == p:
            return True
        try:
            if not os.stat(parent).st_mode & 0o001:
                return False
        except OSError:
            return False
        p = parent


def _python_mounts(python: str) -> tuple[str, list[str], dict[str, str]]:
    """The interpreter's path inside the sandbox, the bwrap mounts it needs, and extra environment.

    An interpreter under /usr needs nothing more. Any other (pyenv, conda, a build under /home) is
    relocated to PYTHON_MOUNT: only its executable and its ``lib`` directory, with site-packages and
    dist-packages hidden, so nothing else of /home (or wherever it lives) is visible.
    """
    real = os.path.realpath(python)
    if real.startswith("/usr/"):
        return real, [], {}
    prefix = os.path.dirname(os.path.dirname(real))
    mounts = ["--ro-bind", real, f"{PYTHON_MOUNT}/bin/python3"]
    lib = os.path.join(prefix, "lib")
    if os.path.isdir(lib):
        mounts += ["--ro-bind", lib, f"{PYTHON_MOUNT}/lib"]
        for std in sorted(os.listdir(lib)):
            for pkgs in ("site-packages", "dist-packages"):
                if std.startswith("python") and os.path.isdir(os.path.join(lib, std, pkgs)):
                    mounts += ["--tmpfs", f"{PYTHON_MOUNT}/lib/{std}/{pkgs}"]
    # A shared libpython is found through the build's RUNPATH (its host path): point the loader here.
    return f"{PYTHON_MOUNT}/bin/python3", mounts, {"LD_LIBRARY_PATH": f"{PYTHON_MOUNT}/lib"}


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # bwrap leads its own process group; with --die-with-parent its death takes the namespace down.
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)


def _uid_lock_dir() -> str:
    """A directory only we can write: a world-writable /tmp with a predictable name would let any local
    user pre-create it (or a symlink) and hand two runs the same uid."""
    base = "/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else tempfile.gettempdir()
    path = os.path.join(base, f"stepcredit-sandbox-uids-{os.geteuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise RuntimeError(
            f"{path} is not a private directory of ours (owner {st.st_uid}, mode {st.st_mode:o})"
        )
    return path


@contextlib.contextmanager
def _claim_uid(root: bool) -> Iterator[int | None]:
    """As root, an unprivileged uid nobody else uses for the run (an flock on a per-uid file)."""
    if not root:
        yield None
        return
    lock_dir = _uid_lock_dir()
    start = (os.getpid() * 64 + threading.get_ident()) % UID_COUNT
    for i in range(UID_COUNT):
        uid = UID_BASE + (start + i) % UID_COUNT
        fd = os.open(os.path.join(lock_dir, str(uid)), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            # No sweep here: a previous owner's runs died with it (bwrap's --die-with-parent), and the
            # sweep after each run catches anything else.
            yield uid
        finally:
            os.close(fd)
        return
    raise RuntimeError(f"no free sandbox uid in {UID_BASE}..{UID_BASE + UID_COUNT}")


def uid_processes(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid``."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = f.read()
        except OSError:
            continue
        m = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
        zombie = re.search(r"^State:\s+Z", status, re.MULTILINE)
        if m and int(m.group(1)) == uid and not zombie:
            pids.append(int(name))
    return pids


def _sweep_uid(uid: int) -> int:
    """Kill every process of ``uid``; return how many could not be killed within ~2 s (0 is normal).

    After a run the namespace is already going down (its pid 1 is dead), so anything found here is
    normally a process in the middle of dying; the uid belongs to this run alone, so killing is safe.
    """
    for _ in range(200):
        pids = uid_processes(uid)
        if not pids:
            return 0
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return len(uid_processes(uid))


# ------------------------------------------------------------------------------------- scoring
@functools.lru_cache(maxsize=8)
def get_sandbox(cfg: SandboxConfig) -> Executor:
    """One shared executor per configuration in this process (its concurrency bound is per process)."""
    return make_executor(cfg)


def aggregate(outcomes: Sequence[CaseOutcome], *, scoring: str) -> RewardResult:
    """Turn case verdicts into one reward; any sandbox failure makes the whole result ``sandbox_error``."""
    info: dict[str, Any] = {"cases": [o.to_json() for o in outcomes]}
    bad = [o for o in outcomes if o.status == SANDBOX_ERROR]
    if bad:
        return RewardResult.failure(Status.SANDBOX_ERROR, bad[0].message, **info)
    n_pass = sum(o.status == PASSED for o in outcomes)
    if scoring == "all":
        score = 1.0 if outcomes and n_pass == len(outcomes) else 0.0
    else:
        score = n_pass / len(outcomes) if outcomes else 0.0
    statuses = {o.status for o in outcomes}
    # the program's own failures have their own statuses: ``timeout``/``error`` mean the reward failed
    status = (
        Status.PROGRAM_TIMEOUT
        if TIMEOUT in statuses
        else Status.PROGRAM_ERROR
        if ERROR in statuses
        else Status.OK
    )
    info["passed"] = n_pass
    info["total"] = len(outcomes)
    first = next((o for o in outcomes if o.status in (TIMEOUT, ERROR)), None)
    if first is not None:
        info["message"] = first.message
    # A program that crashed or hung is the model's fault: a real (low) score, not a masked failure.
    return RewardResult(score=score, status=status, info=info, verdict=True)


def score_code(
    solution_str: str,
    ground_truth: Any,
    *,
    cfg: SandboxConfig | None = None,
    sandbox: Executor | None = None,
) -> RewardResult:
    """Reward of one response: run its last fenced Python block against the ground truth's test cases."""
    return score_code_batch([solution_str], [ground_truth], cfg=cfg, sandbox=sandbox)[0]


def score_code_batch(
    solutions: Sequence[str],
    ground_truths: Sequence[Any],
    *,
    cfg: SandboxConfig | None = None,
    sandbox: Executor | None = None,
) -> list[RewardResult]:
    """Rewards of many responses, their test cases run ``cfg.concurrency`` at a time."""
    sb = sandbox or get_sandbox(cfg or SandboxConfig())
    cfg = sb.cfg
    t0 = time.monotonic()
    results: list[RewardResult | None] = [None] * len(solutions)
    jobs: list[tuple[str, list[TestCase]]] = []
    where: list[int] = []
    for i, (text, gt) in enumerate(zip(solutions, ground_truths, strict=True)):
        code = extract_code(text)
        if code is None:
            results[i] = RewardResult(0.0, Status.UNPARSEABLE, info={"message": "no fenced Python block"})
            continue
        try:
            cases = parse_tests(gt)
        except ValueError as e:
            results[i] = RewardResult.failure(Status.ERROR, str(e))
            continue
        if cfg.max_cases:
            cases = cases[: cfg.max_cases]
        jobs.append((code, cases))
        where.append(i)
    if jobs:
        why = sb.unavailable()
        if why is not None:
            for i in where:
                results[i] = RewardResult.failure(Status.SANDBOX_ERROR, why)
        else:
            verdicts = sb.check_many(jobs, stop_on_failure=cfg.scoring == "all")
            for i, (code, _), outs in zip(where, jobs, verdicts, strict=True):
                res = aggregate(outs, scoring=cfg.scoring)
                res.extracted = code
                results[i] = res
    elapsed = time.monotonic() - t0
    final = []
    for r in results:
        assert r is not None
        r.source = r.source or "code"
        r.latency_s = r.latency_s or elapsed
        final.append(r)
    return final


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> RewardResult:
    """VeRL's signature: the code reward with the default (or ``cfg=``) sandbox settings."""
    return score_code(solution_str, ground_truth, cfg=kwargs.get("cfg"))


def score_samples(
    samples: list[Sample], responses: list[str], cfg: SandboxConfig | None = None
) -> list[RewardResult]:
    """Batch form for the rewarder: ``(samples, responses) -> results``."""
    return score_code_batch(responses, [s.ground_truth for s in samples], cfg=cfg)


# ------------------------------------------------------------------------------------ routing
class CodeScorer:
    """The rewarder's scorer for code rows: one executor (``cfg.backend``), its concurrency bound shared by
    the whole batch."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.sandbox = make_executor(cfg)

    def score_batch(self, samples: list[Sample], responses: list[str]) -> list[RewardResult]:
        try:
            return score_code_batch(responses, [s.ground_truth for s in samples], sandbox=self.sandbox)
        except Exception as e:  # a bug of ours must not be scored as the model's fault, nor crash a run
            return [
                RewardResult.failure(Status.SANDBOX_ERROR, f"{type(e).__name__}: {e}", source="code")
            ] * len(samples)

    @staticmethod
    def probe() -> tuple[Any, str, float]:
        """A known-good program for the start-up check (``reward.run.health``): ground truth, response
        and the score it must get. Two assert cases, each in its own child."""
        gt = {"assert_case": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]}
        return gt, "```python\ndef add(a, b):\n    return a + b\n```\n", 1.0


def _register() -> None:
    from stepcredit.reward.base import register_scorer

    # VeRL's code data sources (verl.utils.reward_score.default_compute_score) plus our own "code".
    @register_scorer(
        "code",
        "codecontests",
        "apps",
        "codeforces",
        "taco",
        "primeintellect",
        "livecodebench",
        "ability:code",
    )
    def make_code_scorer(cfg: Any) -> CodeScorer:
        return CodeScorer(cfg.sandbox)


_register()
