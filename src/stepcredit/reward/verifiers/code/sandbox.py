"""A local code sandbox for code rewards (data_source or ability ``code``), built on bubblewrap.

The response's last fenced Python block runs once per test case, each run in a fresh sandbox:

* **namespaces** (``bwrap --unshare-all --disable-userns``): its own user, pid, network (loopback
  only, nothing routed), mount, IPC, UTS and cgroup namespaces; nested user namespaces are refused.
  When the runner (pid 2) exits, pid 1 of the namespace exits and the kernel kills every process left
  in it: a daemon cannot outlive its run. bwrap's ``--die-with-parent`` does the same if we die.
* **filesystem**: a read-only view of ``/usr`` (and the interpreter's prefix), a fresh ``/proc`` and
  minimal ``/dev``, the program's files read-only under ``/box``, and a size-capped tmpfs as cwd and
  ``/tmp``; the root and ``/dev`` are remounted read-only. Nothing of the host's ``/home``, ``/root``,
  ``/etc`` or working directory is visible. The host-side temporary directory is removed afterwards.
* **limits** set by the runner before any untrusted code runs: RLIMIT_CPU, AS, FSIZE, NPROC (counted
  inside the run's user namespace), NOFILE, CORE; a wall-clock deadline that kills the whole process
  group and namespace; stdout/stderr capped (a run that writes more is stopped).
* **identity**: started as root, each run gets its own unprivileged uid (claimed with a lock file, so
  concurrent runs and processes never share one) and every process of that uid is killed afterwards;
  started as a normal user, it runs as that user inside its own namespaces.
* **environment**: cleared; only ``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` are set.

Statuses: a wrong answer is ``ok`` with a lower score; a program that crashed, exceeded a limit or
wrote too much is ``error`` and one that ran past its deadline (wall or CPU) is ``timeout``; both keep
their score (fraction of cases passed). ``sandbox_error`` (NaN score) means the sandbox itself failed
(bubblewrap missing or refused, the runner never started): never the program's fault, never a pass.

Test cases follow VeRL's ground-truth formats: ``{"inputs": [...], "outputs": [...]}`` (stdin/stdout),
``{"assert_case": [...]}`` (each an assert statement run after the program) and
``{"fn_name": ..., "inputs": [...], "outputs": [...]}`` (call the function, or ``Solution().fn``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stepcredit.config import SandboxConfig
from stepcredit.types import RewardResult, Sample, Status

RUNNER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
ASSERT_FAILED = 86
"""Exit code of the runner when the assert statement failed (a wrong answer, not a crash)."""
RUNNER_FAILED = 97
UID_BASE = 1_700_000
"""Unprivileged uids used for runs when stepcredit runs as root (one per concurrent run)."""
UID_COUNT = 4096
STARTUP_TIMEOUT_S = 20.0
"""How long the sandbox may take to start before it counts as a sandbox failure (a loaded machine)."""

PASSED, FAILED, TIMEOUT, ERROR, SANDBOX_ERROR = "passed", "failed", "timeout", "error", "sandbox_error"


# ------------------------------------------------------------------------------------ extraction
_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str | None:
    """The last fenced block labelled python/py/python3 (or, if none is labelled, the last unlabelled one)."""
    blocks = _FENCE_RE.findall(response)
    labelled = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if labelled:
        return labelled[-1]
    bare = [body for lang, body in blocks if not lang]
    return bare[-1] if bare else None


# ------------------------------------------------------------------------------------ test cases
@dataclass(frozen=True)
class TestCase:
    """One test case: ``stdio`` (input -> expected stdout), ``assert`` or ``call`` (fn(*args) == expected)."""

    mode: str
    stdin: str = ""
    expected: Any = None
    assert_src: str = ""
    fn_name: str = ""
    args: tuple[Any, ...] = ()


def parse_tests(ground_truth: Any) -> list[TestCase]:
    """Test cases from VeRL's ground-truth formats (a dict or its JSON string); ValueError if malformed."""
    gt = ground_truth
    if isinstance(gt, (bytes, str)):
        try:
            gt = json.loads(gt)
        except json.JSONDecodeError as e:
            raise ValueError(f"code ground truth is not valid JSON ({e})") from None
    if isinstance(gt, list) and all(isinstance(a, str) for a in gt):
        gt = {"assert_case": gt}
    if not isinstance(gt, dict):
        raise ValueError(f"code ground truth must be a mapping, got {type(gt).__name__}")
    asserts = gt.get("assert_case")
    if isinstance(asserts, list) and asserts:
        return [TestCase("assert", assert_src=str(a)) for a in asserts]
    inputs, outputs = gt.get("inputs"), gt.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError("code ground truth needs 'assert_case' or lists 'inputs' and 'outputs'")
    if len(inputs) != len(outputs):
        raise ValueError(f"code ground truth has {len(inputs)} inputs but {len(outputs)} outputs")
    if not inputs:
        raise ValueError("code ground truth has no test cases")
    fn_name = gt.get("fn_name")
    if fn_name:
        return [
            TestCase("call", fn_name=str(fn_name), args=tuple(_call_args(i)), expected=_maybe_json(o))
            for i, o in zip(inputs, outputs, strict=True)
        ]
    return [
        TestCase("stdio", stdin=_text(i), expected=_text(o)) for i, o in zip(inputs, outputs, strict=True)
    ]


def _text(x: Any) -> str:
    if isinstance(x, list):
        return "\n".join(str(v) for v in x)
    return "" if x is None else str(x)


def _call_args(x: Any) -> list[Any]:
    # TACO stores a list of arguments; Sandbox Fusion one JSON value per line.
    if isinstance(x, list):
        return x
    if isinstance(x, str):
        return [json.loads(line) for line in x.splitlines() if line.strip()]
    return [x]


def _maybe_json(x: Any) -> Any:
    if isinstance(x, str):
        try:
            return json.loads(x)
        except json.JSONDecodeError:
            return x
    return x


def outputs_match(got: str, expected: str) -> bool:
    """Line-wise equality ignoring trailing whitespace, else token-wise with floats equal to 1e-6."""
    norm_got = [line.rstrip() for line in got.strip().splitlines()]
    norm_exp = [line.rstrip() for line in expected.strip().splitlines()]
    if norm_got == norm_exp:
        return True
    a, b = got.split(), expected.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        try:
            if not math.isclose(float(x), float(y), rel_tol=1e-6, abs_tol=1e-6):
                return False
        except ValueError:
            return False
    return True


def values_match(got: Any, expected: Any) -> bool:
    """JSON values equal up to tuple/list and 1e-6 on floats; TACO's one-item list wrapping accepted."""
    if _eq(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _eq(got, expected[0])


def _eq(a: Any, b: Any) -> bool:
    a = list(a) if isinstance(a, tuple) else a
    b = list(b) if isinstance(b, tuple) else b
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_eq(a[k], b[k]) for k in a)
    return bool(a == b)


# ------------------------------------------------------------------------------------------ runs
@dataclass
class RunResult:
    """What happened to one run of the program in the sandbox."""

    started: bool
    """The runner set the limits and reported in; False means the sandbox failed."""
    exit_code: int | None = None
    """bwrap's exit code: the program's, or 128 + signal."""
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    output_exceeded: bool = False
    message: str = ""
    """Why the sandbox failed (when not started) or a note on the run."""
    wall_s: float = 0.0
    """Time from the runner's start to the end of the run."""
    leftover: int = 0
    """Processes that had to be killed after the run ended (0 is normal)."""
    nonce: str = ""
    """The secret the runner prints after a passed assert/call case."""


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


def _tail(b: bytes, n: int = 600) -> str:
    return b[-n:].decode("utf-8", "replace")


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
        """None when a trivial program runs in the sandbox, else why not (checked once, then cached)."""
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
        r = self.run("print(6 * 7)", TestCase("stdio"))
        if not r.started:
            return f"the sandbox does not start: {r.message}"
        if r.exit_code != 0 or r.stdout.strip() != b"42":
            return f"the sandbox's probe program failed (exit {r.exit_code}): {_tail(r.stderr)}"
        return None

    # ------------------------------------------------------------------------------------- run
    def run(self, program: str, case: TestCase) -> RunResult:
        """Run ``program`` on one test case in a fresh sandbox (blocks for a concurrency slot)."""
        with self._sem:
            try:
                return self._run(program, case)
            except Exception as e:  # a bug or an OS failure on our side: never the program's fault
                return RunResult(started=False, message=f"sandbox failure: {type(e).__name__}: {e}")

    def _run(self, program: str, case: TestCase) -> RunResult:
        cfg = self.cfg
        if not self._bwrap:
            return RunResult(started=False, message="bubblewrap (bwrap) is not installed")
        cpu_s = cfg.cpu_s or math.ceil(cfg.timeout_s) + 1
        host_dir = tempfile.mkdtemp(prefix="stepcredit-sbx-")
        # Traversable (not listable) so that bwrap, started as the run's uid, can bind the files in.
        os.chmod(host_dir, 0o711)
        marker_r = marker_w = stdin_r = -1
        try:
            files = {"solution.py": program, "runner.py": _runner_source()}
            spec = {
                "program": "/box/solution.py",
                "mode": case.mode,
                "assert": case.assert_src,
                "fn_name": case.fn_name,
                "args": list(case.args),
                "cpu_s": cpu_s,
                "memory_mb": cfg.memory_mb,
                "file_size_mb": cfg.file_size_mb,
                "max_procs": cfg.max_procs,
            }
            files["spec.json"] = json.dumps(spec)
            for name, text in files.items():
                path = os.path.join(host_dir, name)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                os.chmod(path, 0o644)
            marker_r, marker_w = os.pipe()
            nonce = ""
            if case.mode == "stdio":
                with tempfile.TemporaryFile(dir=host_dir) as stdin_file:
                    stdin_file.write(case.stdin.encode("utf-8"))
                    stdin_file.seek(0)
                    stdin_r = os.dup(stdin_file.fileno())
            else:
                # A pipe, not a file: once the runner has read the nonce the program cannot seek back to it.
                nonce = secrets.token_hex(16)
                stdin_r, w = os.pipe()
                os.write(w, (nonce + "\n").encode())
                os.close(w)
            with _claim_uid(self._root) as uid:
                cmd = self._command(host_dir, files, marker_w)
                as_uid: dict[str, Any] = (
                    {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
                )
                t0 = time.monotonic()
                try:
                    proc = subprocess.Popen(
                        cmd,
                        stdin=stdin_r,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        pass_fds=(marker_w,),
                        start_new_session=True,
                        cwd="/",
                        env={"PATH": "/usr/bin:/bin"},
                        **as_uid,
                    )
                except OSError as e:
                    return RunResult(started=False, message=f"cannot start bubblewrap: {e}")
                os.close(marker_w)
                marker_w = -1
                os.close(stdin_r)
                stdin_r = -1
                try:
                    res = self._collect(proc, marker_r, t0)
                finally:
                    _kill_group(proc)
                    res_left = _sweep_uid(uid) if uid is not None else 0
                res.leftover = res_left
                res.nonce = nonce
                return res
        finally:
            for fd in (marker_r, marker_w, stdin_r):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            shutil.rmtree(host_dir, ignore_errors=True)

    def _command(self, host_dir: str, files: dict[str, str], marker_fd: int) -> list[str]:
        cfg = self.cfg
        cmd = [self._bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
        cmd += ["--new-session", "--hostname", "sandbox", "--cap-drop", "ALL"]
        cmd += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                cmd += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                cmd += ["--ro-bind", top, top]
        for extra in _python_dirs(self._python):
            cmd += ["--ro-bind", extra, extra]
        cmd += ["--proc", "/proc", "--dev", "/dev"]
        cmd += ["--size", str(cfg.tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        for name in files:
            cmd += ["--ro-bind", os.path.join(host_dir, name), f"/box/{name}"]
        cmd += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
        for k, v in env.items():
            cmd += ["--setenv", k, v]
        cmd += ["--", self._python, "-I", "-S", "-B", "/box/runner.py", "/box/spec.json", str(marker_fd)]
        return cmd

    def _collect(self, proc: subprocess.Popen[bytes], marker_r: int, t0: float) -> RunResult:
        cfg = self.cfg
        cap = cfg.output_limit_kb * 1024
        assert proc.stdout is not None and proc.stderr is not None
        bufs: dict[int, bytearray] = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        marker = bytearray()
        sel = selectors.DefaultSelector()
        for fd in (*bufs, marker_r):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        started_at: float | None = None
        deadline = t0 + max(STARTUP_TIMEOUT_S, cfg.timeout_s)
        res = RunResult(started=False)
        try:
            while sel.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                for key, _ in sel.select(min(remaining, 1.0)):
                    fd = int(key.fd)
                    try:
                        data = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not data:
                        sel.unregister(fd)
                        continue
                    if fd == marker_r:
                        marker += data
                        if started_at is None and marker.startswith(b"S"):
                            started_at = time.monotonic()
                            deadline = started_at + cfg.timeout_s
                        continue
                    bufs[fd] += data
                    if len(bufs[fd]) > cap:
                        res.output_exceeded = True
                        del bufs[fd][cap:]
                        return self._finish(res, proc, bufs, marker, started_at)
            if sel.get_map():  # the deadline passed with pipes still open
                res.timed_out = started_at is not None
                return self._finish(res, proc, bufs, marker, started_at)
            # All pipes closed: the namespace is gone or about to be; wait for bwrap to report.
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 0.5)
            except subprocess.TimeoutExpired:
                res.timed_out = started_at is not None
            return self._finish(res, proc, bufs, marker, started_at)
        finally:
            sel.close()

    def _finish(
        self,
        res: RunResult,
        proc: subprocess.Popen[bytes],
        bufs: dict[int, bytearray],
        marker: bytearray,
        started_at: float | None,
    ) -> RunResult:
        assert proc.stdout is not None and proc.stderr is not None
        _kill_group(proc)
        res.exit_code = proc.returncode
        res.stdout = bytes(bufs[proc.stdout.fileno()])
        res.stderr = bytes(bufs[proc.stderr.fileno()])
        res.started = started_at is not None
        res.wall_s = time.monotonic() - started_at if started_at is not None else 0.0
        if not res.started:
            if marker.startswith(b"E"):
                res.message = "sandbox runner failed: " + marker[1:].decode("utf-8", "replace")
            elif proc.returncode is None or proc.returncode < 0:
                res.message = (
                    f"the sandbox did not start within {max(STARTUP_TIMEOUT_S, self.cfg.timeout_s):g}s"
                )
            else:
                res.message = f"bubblewrap exited {proc.returncode}: {_tail(res.stderr, 400).strip()}"
        return res

    # --------------------------------------------------------------------------------- verdicts
    def judge(self, program: str, case: TestCase) -> CaseOutcome:
        """Run one case and classify it: passed, failed, timeout, error or sandbox_error."""
        r = self.run(program, case)
        out = _classify(r, case)
        out.latency_s = r.wall_s
        return out

    def check(
        self, program: str, cases: Sequence[TestCase], *, stop_on_failure: bool = False
    ) -> list[CaseOutcome]:
        """Verdicts of all cases (cases after the first non-pass are skipped when ``stop_on_failure``)."""
        return self.check_many([(program, list(cases))], stop_on_failure=stop_on_failure)[0]

    def check_many(
        self, jobs: Sequence[tuple[str, Sequence[TestCase]]], *, stop_on_failure: bool = False
    ) -> list[list[CaseOutcome]]:
        """Verdicts of several programs' cases, run ``cfg.concurrency`` at a time (in order per program)."""
        results: list[list[CaseOutcome | None]] = [[None] * len(cases) for _, cases in jobs]
        failed = [False] * len(jobs)

        def one(j: int, k: int) -> None:
            if stop_on_failure and failed[j]:
                results[j][k] = CaseOutcome(FAILED, "skipped after an earlier failure")
                return
            out = self.judge(jobs[j][0], jobs[j][1][k])
            results[j][k] = out
            if out.status != PASSED:
                failed[j] = True

        def program(j: int) -> None:
            for k in range(len(jobs[j][1])):
                one(j, k)

        with ThreadPoolExecutor(max_workers=self.cfg.concurrency) as pool:
            if stop_on_failure:  # a program's cases in order, so that the first failure skips the rest
                futures = [pool.submit(program, j) for j in range(len(jobs))]
            else:
                futures = [
                    pool.submit(one, j, k) for j, (_, cases) in enumerate(jobs) for k in range(len(cases))
                ]
            for f in futures:
                f.result()
        return [
            [o if o is not None else CaseOutcome(SANDBOX_ERROR, "not run") for o in row] for row in results
        ]


def _classify(r: RunResult, case: TestCase) -> CaseOutcome:
    if not r.started:
        return CaseOutcome(SANDBOX_ERROR, r.message)
    if r.leftover:
        return CaseOutcome(SANDBOX_ERROR, f"{r.leftover} processes outlived the run and were killed")
    err = _tail(r.stderr).strip()
    if r.timed_out:
        return CaseOutcome(TIMEOUT, "wall-clock limit exceeded")
    if r.output_exceeded:
        return CaseOutcome(ERROR, "output limit exceeded")
    code = r.exit_code
    if code == 128 + signal.SIGXCPU:
        return CaseOutcome(TIMEOUT, "CPU-time limit exceeded")
    if code == RUNNER_FAILED:
        return CaseOutcome(ERROR, f"exit {code}: {err}")
    if case.mode == "assert" and code == ASSERT_FAILED:
        return CaseOutcome(FAILED, "assertion failed")
    if code != 0:
        sig = ""
        with contextlib.suppress(ValueError, TypeError):
            sig = f" (signal {signal.Signals(code - 128).name})" if code and code > 128 else ""
        return CaseOutcome(ERROR, f"exit {code}{sig}: {err}"[:800])
    if case.mode == "stdio":
        got = r.stdout.decode("utf-8", "replace")
        ok = outputs_match(got, str(case.expected))
        return CaseOutcome(PASSED if ok else FAILED, "" if ok else f"wrong output: {got[:200]!r}")
    # assert / call: the nonce must be the start of the last line the runner wrote.
    lines = r.stdout.rstrip(b"\n").rsplit(b"\n", 1)
    last = lines[-1].decode("utf-8", "replace") if lines else ""
    nonce = r.nonce
    if not nonce or not last.startswith(nonce):
        return CaseOutcome(FAILED, "the program exited before the test ran")
    if case.mode == "assert":
        return CaseOutcome(PASSED)
    try:
        value = json.loads(last[len(nonce) :])
    except json.JSONDecodeError:
        return CaseOutcome(ERROR, "unreadable return value")
    ok = values_match(value, case.expected)
    return CaseOutcome(PASSED if ok else FAILED, "" if ok else f"returned {str(value)[:200]}")


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


def _python_dirs(python: str) -> list[str]:
    """Directories to mount so that ``python`` and its standard library work (beyond /usr)."""
    real = os.path.realpath(python)
    prefix = os.path.dirname(os.path.dirname(real))
    dirs = []
    for d in {prefix, os.path.realpath(sys.base_prefix)} if real == _base_python() else {prefix}:
        if d and d != "/" and not d.startswith("/usr/") and d != "/usr" and os.path.isdir(d):
            dirs.append(d)
    return sorted(dirs)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # bwrap leads its own process group; with --die-with-parent its death takes the namespace down.
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)


_UID_LOCK_DIR = os.path.join(tempfile.gettempdir(), "stepcredit-sandbox-uids")


@contextlib.contextmanager
def _claim_uid(root: bool) -> Iterator[int | None]:
    """As root, an unprivileged uid nobody else uses for the run (an flock on a per-uid file)."""
    if not root:
        yield None
        return
    os.makedirs(_UID_LOCK_DIR, mode=0o700, exist_ok=True)
    start = (os.getpid() * 64 + threading.get_ident()) % UID_COUNT
    for i in range(UID_COUNT):
        uid = UID_BASE + (start + i) % UID_COUNT
        fd = os.open(os.path.join(_UID_LOCK_DIR, str(uid)), os.O_CREAT | os.O_RDWR, 0o600)
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
def get_sandbox(cfg: SandboxConfig) -> Sandbox:
    """One shared sandbox per configuration in this process (its concurrency bound is per process)."""
    return Sandbox(cfg)


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
    status = Status.TIMEOUT if TIMEOUT in statuses else Status.ERROR if ERROR in statuses else Status.OK
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
    sandbox: Sandbox | None = None,
) -> RewardResult:
    """Reward of one response: run its last fenced Python block against the ground truth's test cases."""
    return score_code_batch([solution_str], [ground_truth], cfg=cfg, sandbox=sandbox)[0]


def score_code_batch(
    solutions: Sequence[str],
    ground_truths: Sequence[Any],
    *,
    cfg: SandboxConfig | None = None,
    sandbox: Sandbox | None = None,
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
    """The rewarder's scorer for code rows: one sandbox, its concurrency bound shared by the whole batch."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.sandbox = Sandbox(cfg)

    def score_batch(self, samples: list[Sample], responses: list[str]) -> list[RewardResult]:
        try:
            return score_code_batch(responses, [s.ground_truth for s in samples], sandbox=self.sandbox)
        except Exception as e:  # a bug of ours must not be scored as the model's fault, nor crash a run
            return [
                RewardResult.failure(Status.SANDBOX_ERROR, f"{type(e).__name__}: {e}", source="code")
            ] * len(samples)


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
