"""The host's side of a sandbox runner session: messages to and from :mod:`.runner` over its pipes, with deadlines."""

from __future__ import annotations

import contextlib
import functools
import json
import marshal
import os
import selectors
import signal
import subprocess
import time
from typing import Any

from stepcredit.sandbox.jail import as_uid
from stepcredit.sandbox.judging import SandboxFailure, _tail

RUNNER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
RUNNER_FAILED = 97
"""Exit code of the runner (or of a case's child) when its own setup failed."""


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

    def end_input(self) -> bool:
        """Close the runner's input, so that it exits after its last case; False (and nothing done)
        while messages to it are still queued."""
        if self._outbuf or self.proc.stdin is None:
            return False
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        return True

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


@functools.lru_cache(maxsize=1)
def _runner_source() -> str:
    with open(RUNNER_PATH, encoding="utf-8") as f:
        return f.read()


NOBODY = 65534
"""The uid that compiles the runner when we are root (no file or process of ours belongs to it)."""
RUNNER_IN_JAIL = "/box/runner.py"
"""The runner's name inside a jail (its code objects' file name)."""
_COMPILE_RUNNER = (
    "import marshal, sys, _frozen_importlib_external as e\n"
    "code = compile(sys.stdin.buffer.read(), sys.argv[1], 'exec')\n"
    "sys.stdout.buffer.write(e.MAGIC_NUMBER + bytes(12) + marshal.dumps(code))\n"
)


def compile_pyc(python: str, source: bytes, filename: str) -> bytes | None:
    """``source`` compiled by the interpreter ``python`` into a ``.pyc`` file's bytes (which that
    interpreter runs as a script without compiling), or None if it could not. Started as root, the
    interpreter runs as ``nobody`` (jails' interpreters never run as root outside their jail)."""
    argv, extra = as_uid(
        [python, "-I", "-S", "-B", "-c", _COMPILE_RUNNER, filename], NOBODY if os.geteuid() == 0 else None
    )
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            argv,
            **extra,
            input=source,
            capture_output=True,
            timeout=60,
            env={},
            cwd="/",
        )
        # A pyc starts with the interpreter's magic number, which ends in b"\r\n" (importlib's rule).
        if done.returncode == 0 and done.stdout[2:4] == b"\r\n" and len(done.stdout) > 16:
            return done.stdout
    return None


@functools.lru_cache(maxsize=8)
def runner_file(python: str) -> tuple[str, bytes]:
    """The runner as a jail's interpreter ``python`` starts it fastest: ``("runner.pyc", ...)``, compiled
    once by that interpreter (every jail would otherwise compile ~600 lines at its start), or
    ``("runner.py", source)`` should that fail."""
    source = _runner_source().encode("utf-8")
    pyc = compile_pyc(python, source, RUNNER_IN_JAIL)
    return ("runner.pyc", pyc) if pyc is not None else ("runner.py", source)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # bwrap leads its own process group; with --die-with-parent its death takes the namespace down.
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)
