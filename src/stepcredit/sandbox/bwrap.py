"""The local code executor (``reward.sandbox.backend=local``): untrusted programs in bubblewrap, one sandbox each.

A sandbox for code rewards (data_source or ability ``code``), built on bubblewrap (the jail itself: :mod:`.jail`).

One sandbox per program (never reused; in a batch the next one starts while a program runs:
:mod:`.lifecycle`); every test case of that program runs inside it, each in a fresh child process
forked by the sandbox's runner (:mod:`.runner`) with an emptied working directory:

* **namespaces** (``bwrap --unshare-all --disable-userns --as-pid-1``): its own user, pid, network
  (loopback only, nothing routed), mount, IPC, UTS and cgroup namespaces; nested user namespaces are
  refused. The runner is pid 1: when it exits the kernel kills every process left in the namespace, and
  between cases it kills every process but itself (``kill(-1)``), so nothing outlives its case.
  bwrap's ``--die-with-parent`` takes the sandbox down if we die.
* **filesystem**: a read-only view of ``/usr`` (and, relocated to ``/opt/stepcredit-python``, the
  interpreter's own ``bin``/``lib`` when it lives elsewhere, its site-packages hidden), a fresh
  ``/proc`` and minimal ``/dev``, the runner read-only under ``/box`` (the program comes over its
  input, kept in the runner's memory), and a tmpfs capped in bytes and in files as cwd and ``/tmp``,
  a fresh one for each case (mounted by the runner; the last case's is detached); the root and ``/dev`` are remounted read-only. Nothing
  of the host's ``/home``, ``/root``, ``/etc`` or working directory is visible, and no file holds a test.
* **limits** set before any untrusted code runs: RLIMIT_CPU (per case), AS, FSIZE, NPROC (counted inside
  the run's user namespace), NOFILE, CORE; a wall-clock deadline per case that kills the case's
  processes; the anonymous resident memory and the CPU time of all the case's processes together,
  checked every 10 ms against ``memory_mb`` and ``cpu_s`` (RLIMIT_AS and RLIMIT_CPU cap each process alone); a seccomp filter that refuses memfds and
  System V IPC objects (memory in no process's address space); stdout/stderr capped (a case that
  writes more is stopped).
* **identity**: started as root, each sandbox gets its own unprivileged uid (claimed with a lock file in
  a root-only directory, so concurrent runs and processes never share one; util-linux's ``setpriv``
  sets it, with no groups, before bubblewrap starts) and every process of that uid is killed afterwards; started as a normal user, it runs as that user inside its own namespaces.
* **environment**: cleared; only ``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` (and ``LD_LIBRARY_PATH`` for a
  relocated interpreter) are set.
* **judging** happens on the host (:mod:`.judging`, :mod:`.cases`): the sandbox gets a case's stdin or requests
  such as "call ``f`` with (1, 2)", never an expected value, an assert statement or a nonce; what comes
  back is decoded strictly to plain builtin values and compared here.

Statuses: a wrong answer is ``ok`` with a lower score; a program that crashed, exceeded a limit or
wrote too much is ``error`` and one that ran past its deadline (wall or CPU) is ``timeout``; both keep
their score (fraction of cases passed). ``sandbox_error`` (NaN score) means the sandbox itself failed
(bubblewrap missing or refused, the runner never started): never the program's fault, never a pass.

Execution sits behind :class:`~.judging.Executor` (this bubblewrap :class:`Sandbox`, or a SandboxFusion
service: :mod:`.fusion`; ``reward.sandbox.backend`` picks one in :mod:`.executors`); judging
(:mod:`.judging`: :func:`~.judging.judge_report`, :func:`~.judging.verdict`) is the same whichever executes.

Test cases follow VeRL's ground-truth formats: ``{"inputs": [...], "outputs": [...]}`` (stdin/stdout),
``{"assert_case": [...]}`` (assert statements about the program) and
``{"fn_name": ..., "inputs": [...], "outputs": [...]}`` (call the function, or ``Solution().fn``).
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from stepcredit.config import SandboxConfig
from stepcredit.sandbox.cases import TestCase
from stepcredit.sandbox.dirs import remove_sandbox_dirs
from stepcredit.sandbox.jail import _default_python, bwrap_command
from stepcredit.sandbox.judging import (
    _SKIPPED,
    ERROR,
    FAILED,
    PASSED,
    SANDBOX_ERROR,
    TIMEOUT,
    CaseOutcome,
    SandboxFailure,
    _CaseEnded,
    _classify,
    _request,
    _timed,
    cpu_message,
    judge_report,
    memory_message,
    probe_executor,
    run_many,
    verdict,
)
from stepcredit.sandbox.lifecycle import Batch, Jail, finish_jail, outlived, start_jail
from stepcredit.sandbox.protocol import Op
from stepcredit.sandbox.remote import RemoteLink, reply_object
from stepcredit.sandbox.session import _Session, runner_file

STARTUP_TIMEOUT_S = 20.0
"""How long the sandbox may take to start before it counts as a sandbox failure (a loaded machine)."""
REPLY_SLACK_S = 5.0
"""How long past a case's deadline the host waits for the runner before it stops the sandbox."""


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
        remove_sandbox_dirs()  # folders of workers killed mid-program in an earlier run or this one

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
        return self._run_in(None, program, cases, stop_on_failure)

    def _run_in(
        self, batch: Batch | None, program: str, cases: Sequence[TestCase], stop_on_failure: bool
    ) -> list[CaseOutcome]:
        with self._sem:
            try:
                return self._run_program(batch, program, list(cases), stop_on_failure)
            except Exception as e:  # a bug or an OS failure on our side: never the program's fault
                return [CaseOutcome(SANDBOX_ERROR, f"sandbox failure: {type(e).__name__}: {e}")] * len(cases)

    def _start_jail(self) -> Jail:
        cfg = self.cfg
        limits = {
            "cpu_s": cfg.cpu_s or math.ceil(cfg.timeout_s) + 1,
            "memory_mb": cfg.memory_mb,
            "file_size_mb": cfg.file_size_mb,
            "max_procs": cfg.max_procs,
            "output_limit_kb": cfg.output_limit_kb,
            "tmpfs_mb": cfg.tmpfs_mb,
            "max_files": cfg.max_files,
            "timeout_s": cfg.timeout_s,
        }
        # The runner's largest report: stdout (the cap) and the answer channel (the cap + 128 KiB, see
        # runner._Case._read) as JSON, where one byte can become six ("\u0000", or "\ufffd" for a byte
        # that is not UTF-8), plus stderr's tail. A tighter bound let a program that printed ~1 MB of
        # NUL bytes end as sandbox_error (NaN, masked) instead of its failing score.
        line_cap = 12 * cfg.output_limit_kb * 1024 + (1 << 20)
        runner = runner_file(self._python)
        return start_jail(
            lambda d: self._command(d, limits), runner=runner, root=self._root, line_cap=line_cap
        )

    def _run_program(
        self, batch: Batch | None, program: str, cases: list[TestCase], stop_on_failure: bool
    ) -> list[CaseOutcome]:
        if not cases:
            return []
        if not self._bwrap:
            return [CaseOutcome(SANDBOX_ERROR, "bubblewrap (bwrap) is not installed")] * len(cases)
        jail = batch.take() if batch is not None else self._start_jail()
        if jail.session is None:
            finish_jail(jail, graceful=False)
            return [CaseOutcome(SANDBOX_ERROR, str(jail.error))] * len(cases)
        try:
            on_way = batch.start_ahead if batch is not None else None
            outcomes = self._run_cases(jail.session, program, cases, stop_on_failure, on_way)
        except BaseException:
            finish_jail(jail, graceful=False)
            raise
        # Cases sent ahead and skipped after a failure would still run: stop those by force.
        clean = all(o.status != SANDBOX_ERROR and o.message != _SKIPPED for o in outcomes)
        if clean and batch is not None:  # the program is judged: its jail goes down in the background
            return batch.finish_later(jail, outcomes)
        left = finish_jail(jail, graceful=clean)
        return outlived(left, len(cases)) if left else outcomes

    def _run_cases(
        self,
        session: _Session,
        program: str,
        cases: list[TestCase],
        stop_on_failure: bool,
        on_way: Callable[[], None] | None = None,
    ) -> list[CaseOutcome]:
        """Verdicts of the program's cases; ``on_way()`` is called once the first cases are on their
        way (a batch starts the next program's jail then, while the runner works through them)."""
        try:
            hello = session.recv(time.monotonic() + max(STARTUP_TIMEOUT_S, self.cfg.timeout_s))
        except SandboxFailure as e:
            return [CaseOutcome(SANDBOX_ERROR, str(e))] * len(cases)
        if hello.get("op") != Op.HELLO:
            why = f"sandbox runner failed: {str(hello.get('message'))[:400]}"
            return [CaseOutcome(SANDBOX_ERROR, why)] * len(cases)
        outcomes: list[CaseOutcome] = []
        sent = 0  # cases whose request went out ahead (they need no conversation with the host)
        try:
            # The runner may have started before its program was known: the program comes first.
            session.send({"op": "program", "source": program})
            for k, case in enumerate(cases):
                # Send every following case that needs no conversation at once: the runner works through
                # them while we judge, so the host is off the critical path between cases.
                while sent < len(cases) and sent >= k:
                    request = _request(cases[sent])
                    if request is None:
                        break
                    session.send(request)
                    sent += 1
                if k == 0 and on_way is not None:
                    on_way()
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
        module = case.mode.module  # not "__main__" in call mode (CaseMode.module says why)
        session.send({"op": "case", "mode": "eval", "module": module})
        first = session.recv(deadline)
        if first.get("op") != Op.READY:
            return _classify(first, case, early=True)

        def ask(request: dict[str, Any]) -> dict[str, Any]:
            session.send({"op": "req", "r": request})
            msg = session.recv(deadline)
            if msg.get("op") != Op.REPLY:
                raise _CaseEnded(msg)
            return reply_object(msg.get("r"))

        try:
            result = verdict(case, RemoteLink(ask))
        except _CaseEnded as e:
            return _classify(e.done, case, early=True)
        session.send({"op": "end"})
        done = session.recv(deadline)
        if done.get("op") != Op.DONE:
            raise SandboxFailure(f"unexpected message from the sandbox runner: {str(done)[:200]}")
        # The verdict stands unless the case broke a limit meanwhile (too much output, a leftover).
        if done.get("leftover"):
            return CaseOutcome(SANDBOX_ERROR, "processes of the case could not be killed")
        if done.get("overflow"):
            return CaseOutcome(ERROR, "output limit exceeded")
        if done.get("memory"):
            return CaseOutcome(ERROR, memory_message(done["memory"]))
        if done.get("cpu"):
            return CaseOutcome(TIMEOUT, cpu_message(done["cpu"]))
        return result

    def _command(self, host_dir: str, limits: dict[str, Any]) -> list[str]:
        runner = runner_file(self._python)[0]
        return bwrap_command(
            self._bwrap, self._python, host_dir, limits, tmpfs_mb=self.cfg.tmpfs_mb, runner=runner
        )

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
        """Verdicts of several programs' cases, ``cfg.concurrency`` sandboxes (one per program) at a time;
        the next program's sandbox starts while one runs (:class:`~.lifecycle.Batch`)."""
        total = sum(1 for _, cases in jobs if cases)  # one jail per program with cases, never more
        if total <= 1 or not self._bwrap:
            return run_many(self.run_program, jobs, self.cfg.concurrency, stop_on_failure=stop_on_failure)
        batch = Batch(self._start_jail, total=total)
        # Our own workers: they started the batch's jails, so they must outlive batch.close().
        with ThreadPoolExecutor(max_workers=self.cfg.concurrency) as pool:
            futures = [pool.submit(self._run_in, batch, p, c, stop_on_failure) for p, c in jobs]
            try:
                wait(futures)
            finally:
                batch.close()
        return [f.result() for f in futures]
