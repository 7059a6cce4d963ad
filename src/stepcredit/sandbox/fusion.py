"""Code rewards executed by a SandboxFusion-compatible service (``reward.sandbox.backend=sandbox_fusion``).

A user who runs a SandboxFusion cluster (https://github.com/bytedance/SandboxFusion) keeps it: programs
go to its ``/run_code`` endpoint, and the verdicts are still reached on this host by the same code as
the local sandbox's (:func:`.judging.judge_report`, :func:`.judging.verdict`). The service is only
asked what the program does, never told an expected value or an assert:

* a stdin/stdout case sends the program and the case's stdin; its stdout is compared here;
* a call or assert case whose calls are known in advance (``f(1, 2)``, ``Solution().f(3)``) sends a
  driver: the program, then those calls made by the sandbox runner's own functions, their answers
  written to stdout after a per-request marker and decoded here strictly (``plain.decode_plain``);
* a test that must talk to the program (references, comprehensions) is replayed: each question re-runs
  the program with every question so far and reads the last answer (at most ``MAX_ROUND_TRIPS``).

A program that forges the marker can only claim answers it could have returned anyway (as with the
local runner's answer channel); printing more answers than were asked fails the case.

The service being down, slow past ``request_timeout_s``, refusing the request or answering nonsense is
``sandbox_error`` (NaN, never a fail or a pass). A deadline per request is enforced by closing the
socket, so a service that stops answering mid-response cannot hold a reward.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import marshal
import secrets
import socket
import threading
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from stepcredit.config import SandboxConfig
from stepcredit.sandbox.cases import CaseMode, TestCase
from stepcredit.sandbox.judging import (
    _SKIPPED,
    FAILED,
    PASSED,
    SANDBOX_ERROR,
    CaseOutcome,
    SandboxFailure,
    _calls,
    _CaseEnded,
    _classify,
    judge_report,
    probe_executor,
    run_many,
    verdict,
)
from stepcredit.sandbox.remote import RemoteLink, reply_object
from stepcredit.sandbox.session import _runner_source

__all__ = ["FusionSandbox", "post_json"]

MAX_ROUND_TRIPS = 64
"""Most questions one conversational test may ask a remote program (each one re-runs it)."""
REPROBE_S = 30.0
"""How long a failed probe of the service stands before the service is probed again."""
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
"""Largest reply read from the service."""

# The driver runs the program as the local runner's child does (same namespace, same answer encoding,
# the runner's own functions), then answers the calls; only the channel differs (stdout after a marker).
_DRIVER = """\
import base64, marshal, os, sys
_R = {"__name__": "stepcredit_runner"}
exec(compile(%(runner)r, "runner.py", "exec"), _R)
_MSG = marshal.loads(base64.b64decode(%(msg)r))
sys.argv = ["solution.py"]
_ns = {"__name__": _MSG["module"], "__builtins__": __builtins__}
try:
    exec(compile(%(source)r, "solution.py", "exec"), _ns)
except SystemExit as _e:
    _R["_flush"]()
    os._exit(_R["_exit_code"](_e))
except BaseException:
    import traceback
    traceback.print_exc()
    _R["_flush"]()
    os._exit(1)
_R["_flush"]()
_fn = _R["_precomputed"] if _MSG["precomputed"] else _R["_serve"]
_handles = []
for _item in _MSG["items"]:
    _R["_write_all"](1, b"\\n" + %(mark)r + _R["_answer"](_fn, _item, _ns, [] if _MSG["precomputed"] else _handles))
os._exit(0)
"""


def _driver(program: str, *, precomputed: bool, module: str, items: list[Any], mark: bytes) -> str:
    """The driver program: ``items`` are calls known in advance (``precomputed``) or a live test's requests."""
    fields = {"precomputed": precomputed, "module": module, "items": items}
    msg = base64.b64encode(marshal.dumps(fields, 4)).decode()
    return _DRIVER % {"runner": _runner_source(), "msg": msg, "source": program, "mark": mark}


def post_json(url: str, payload: dict[str, Any], *, deadline: float) -> tuple[int, bytes]:
    """POST ``payload`` as JSON; (HTTP status, body). OSError/TimeoutError when the deadline passes:
    a timer shuts the socket down then, so no read can outlive it."""
    u = urllib.parse.urlsplit(url)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("deadline passed before the request")
    match u.scheme:
        case "https":
            cls: type[http.client.HTTPConnection] = http.client.HTTPSConnection
        case _:
            cls = http.client.HTTPConnection
    conn = cls(u.hostname or "127.0.0.1", u.port, timeout=remaining)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    body = json.dumps(payload).encode()

    def abort() -> None:
        if conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(remaining, abort)
    timer.daemon = True
    timer.start()
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = bytearray()
        while chunk := resp.read(1 << 16):
            data += chunk
            if len(data) > MAX_RESPONSE_BYTES:
                raise OSError(f"reply larger than {MAX_RESPONSE_BYTES} bytes")
        if time.monotonic() >= deadline:
            raise TimeoutError("no complete reply before the deadline")
        return resp.status, bytes(data)
    finally:
        timer.cancel()
        conn.close()


class FusionSandbox:
    """An :class:`~.judging.Executor` that runs programs on a SandboxFusion service at ``cfg.url``:
    at most ``cfg.concurrency`` requests in flight, each bounded by ``cfg.request_timeout_s``."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.url = cfg.url
        self._sem = threading.BoundedSemaphore(cfg.concurrency)
        self._probe_lock = threading.Lock()
        self._probe: str | None = None
        self._probed_at: float | None = None

    # ------------------------------------------------------------------------------ availability
    def unavailable(self) -> str | None:
        """None when the known-good probe program passes on the service, else why not. A pass is kept; a
        failure is kept ``REPROBE_S`` seconds, then the service is asked again (it may be back)."""
        with self._probe_lock:
            now = time.monotonic()
            stale = self._probe is not None and now - (self._probed_at or now) > REPROBE_S
            if self._probed_at is None or stale:
                why = probe_executor(self)
                self._probe = None if why is None else f"SandboxFusion service at {self.url}: {why}"
                self._probed_at = now
            return self._probe

    # ------------------------------------------------------------------------------------- run
    def check_many(
        self, jobs: Sequence[tuple[str, Sequence[TestCase]]], *, stop_on_failure: bool = False
    ) -> list[list[CaseOutcome]]:
        """Verdicts of several programs' cases; the requests share the ``cfg.concurrency`` bound."""
        return run_many(self.run_program, jobs, self.cfg.concurrency, stop_on_failure=stop_on_failure)

    def run_program(
        self, program: str, cases: Sequence[TestCase], *, stop_on_failure: bool = False
    ) -> list[CaseOutcome]:
        """Verdicts of ``cases`` (one request per case, in order); a service failure is sandbox_error."""
        outcomes: list[CaseOutcome] = []
        for k, case in enumerate(cases):
            t0 = time.monotonic()
            try:
                out = self._judge(program, case)
            except SandboxFailure as e:
                return outcomes + [CaseOutcome(SANDBOX_ERROR, str(e))] * (len(cases) - k)
            except Exception as e:  # a bug of ours: never the program's fault
                msg = f"sandbox failure: {type(e).__name__}: {e}"
                return outcomes + [CaseOutcome(SANDBOX_ERROR, msg)] * (len(cases) - k)
            out.latency_s = time.monotonic() - t0
            outcomes.append(out)
            if stop_on_failure and out.status != PASSED:
                return outcomes + [CaseOutcome(FAILED, _SKIPPED)] * (len(cases) - k - 1)
        return outcomes

    def _judge(self, program: str, case: TestCase) -> CaseOutcome:
        if case.mode is CaseMode.STDIO:
            return judge_report(case, self._capped(self.execute(program, case.stdin)), None)
        if case.mode is CaseMode.CALL or (case.plan is not None and case.plan.calls is not None):
            done = self._driven(program, precomputed=True, module=case.mode.module, items=list(_calls(case)))
            return judge_report(case, done, lambda: self._replay(program, case))
        return self._replay(program, case)

    def _driven(self, program: str, *, precomputed: bool, module: str, items: list[Any]) -> dict[str, Any]:
        mark = b"\x1e" + secrets.token_hex(8).encode() + b":"
        done = self.execute(
            _driver(program, precomputed=precomputed, module=module, items=items, mark=mark), ""
        )
        marker = mark.decode()
        lines = str(done["out"]).split("\n")
        done["replies"] = [line[len(marker) :] for line in lines if line.startswith(marker)]
        done["out"] = "\n".join(line for line in lines if not line.startswith(marker))
        return self._capped(done, answers=sum(len(r.encode()) + 1 for r in done["replies"]))

    def _replay(self, program: str, case: TestCase) -> CaseOutcome:
        """A test that talks to the program: every question re-runs it with the questions so far."""
        module = case.mode.module
        asked: list[dict[str, Any]] = []

        def ask(request: dict[str, Any]) -> dict[str, Any]:
            if len(asked) >= MAX_ROUND_TRIPS:
                raise SandboxFailure(
                    f"the test asks the program more than {MAX_ROUND_TRIPS} questions, too many for a "
                    "remote sandbox (use reward.sandbox.backend=local)"
                )
            asked.append(request)
            done = self._driven(program, precomputed=False, module=module, items=asked)
            replies = done["replies"]
            clean = done.get("exit") == 0 and not done.get("sig") and not done.get("timeout")
            if not clean or len(replies) < len(asked):
                raise _CaseEnded(done)
            if len(replies) > len(asked):
                raise _CaseEnded({**done, "exit": None, "sig": None, "forged": True})
            return reply_object(replies[-1])

        try:
            return verdict(case, RemoteLink(ask))
        except _CaseEnded as e:
            if e.done.get("forged"):
                return CaseOutcome(FAILED, "the program wrote on the sandbox's answer channel")
            return _classify(e.done, case, early=True)

    # ------------------------------------------------------------------------------------ wire
    def execute(self, code: str, stdin: str) -> dict[str, Any]:
        """Run ``code`` on the service; the runner-style report (``exit``, ``sig``, ``timeout``, ``out``,
        ``err``) that :func:`~.judging.judge_report` reads. SandboxFailure when the service fails."""
        cfg = self.cfg
        payload = {
            "code": code,
            "language": "python",
            "stdin": stdin,
            "compile_timeout": cfg.timeout_s,
            "run_timeout": cfg.timeout_s,
            "memory_limit_MB": cfg.memory_mb,
            "files": {},
            "fetch_files": [],
        }
        deadline = time.monotonic() + (cfg.request_timeout_s or cfg.timeout_s + 10.0)
        with self._sem:
            reply = self._post(payload, deadline)
        return report_from_reply(reply)

    def _capped(self, report: dict[str, Any], answers: int = 0) -> dict[str, Any]:
        # The output caps are ours to apply, whatever the service allows: the same verdict as locally
        # (the runner's answer channel may hold 64 KiB more than the cap).
        cap = self.cfg.output_limit_kb * 1024
        over = len(report["out"].encode()) > cap or len(report["err"].encode()) > cap
        if over or answers > cap + 65536:
            report.update(overflow=True, exit=None, sig=None)
        return report

    def _post(self, payload: dict[str, Any], deadline: float) -> dict[str, Any]:
        last = ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                pause = min(0.2 * 2 ** (attempt - 1), deadline - time.monotonic())
                if pause <= 0:
                    break
                time.sleep(pause)
            try:
                status, body = post_json(self.url, payload, deadline=deadline)
            except (OSError, http.client.HTTPException) as e:
                if time.monotonic() >= deadline:
                    raise SandboxFailure(
                        f"SandboxFusion service at {self.url} gave no reply within "
                        f"{self.cfg.request_timeout_s or self.cfg.timeout_s + 10.0:g} s"
                    ) from None
                last = f"{type(e).__name__}: {e}"
                continue
            if status == 429 or status >= 500:
                last = f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
                continue
            if status != 200:
                raise SandboxFailure(
                    f"SandboxFusion service at {self.url} refused the request: HTTP {status} "
                    f"{body[:200].decode('utf-8', 'replace')}"
                )
            try:
                reply = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise SandboxFailure(
                    f"SandboxFusion service at {self.url} sent a reply that is not JSON"
                ) from None
            if type(reply) is not dict:
                raise SandboxFailure(f"SandboxFusion service at {self.url} sent a malformed reply")
            return reply
        raise SandboxFailure(f"SandboxFusion service at {self.url} failed: {last}")


def report_from_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """The runner-style report of a SandboxFusion ``/run_code`` reply (SandboxFailure if it has none).

    ``TimeLimitExceeded`` is a timeout; ``Finished`` carries the exit code (negative: killed by that
    signal, as Python's subprocess reports it); ``SandboxError`` or a run that could not start
    (``Error``) is the service's failure, not the program's.
    """
    status = reply.get("status")
    run = reply.get("run_result")
    compiled = reply.get("compile_result")
    match status:
        case "SandboxError":
            raise SandboxFailure(f"the service reported SandboxError: {str(reply.get('message', ''))[:300]}")
    report: dict[str, Any] = {"op": "done", "exit": None, "sig": None, "timeout": False, "overflow": False}
    report.update({"out": "", "err": "", "replies": [], "leftover": 0})
    if isinstance(compiled, dict) and compiled.get("status") not in (None, "Finished"):
        report.update(exit=1, err=str(compiled.get("stderr") or "compile error"))
        return report
    if not isinstance(run, dict):
        raise SandboxFailure(f"the service's reply has no run_result (status {status!r})")
    report["out"] = str(run.get("stdout") or "")
    report["err"] = str(run.get("stderr") or "")
    report["wall"] = run.get("execution_time")
    run_status = run.get("status")
    code = run.get("return_code")
    match run_status:
        case "TimeLimitExceeded":
            report["timeout"] = True
            return report
        case "Finished" if type(code) is int:
            pass
        case _:
            raise SandboxFailure(f"the service could not run the program (run status {run_status!r})")
    if code < 0:
        report["sig"] = -code
    else:
        report["exit"] = code
    return report
