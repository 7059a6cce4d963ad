"""The first code that runs inside the sandbox: set the limits, say "started", then run one test case.

This file is copied into each sandbox and run by the sandbox's interpreter as
``python -I -S -B runner.py SPEC_PATH MARKER_FD``; it must import nothing outside the standard library
and stay valid on any Python >= 3.8 (the sandbox's interpreter need not be the host's).

Protocol with :mod:`stepcredit.reward.verifiers.code.sandbox`:

* ``MARKER_FD`` receives ``S`` once the limits are in place (the host then starts the wall clock) or
  ``E<message>`` when the runner itself failed; it is closed before any untrusted code runs, so the
  program cannot forge it. No ``S`` means the sandbox failed, never the program.
* ``stdio`` mode: the program runs as ``__main__`` with the case's input on stdin; the host compares
  stdout.
* ``assert`` and ``call`` modes: stdin's first line is a per-run nonce the program never sees in a file.
  After the assert statement passed (or the function returned), the runner writes the nonce on its own
  last line of stdout and exits at once, so a program that calls ``sys.exit(0)`` or ``os._exit(0)``
  before the tests ran is not a pass. ``call`` appends the JSON of the return value after the nonce.
  Exit code ``ASSERT_FAILED`` means the assert statement itself failed (a wrong answer, not a crash).
"""

import contextlib
import json
import os
import resource
import signal
import sys

ASSERT_FAILED = 86
RUNNER_FAILED = 97
# Bound now: the program may replace builtins.AssertionError before the test runs.
_ASSERTION_ERROR = AssertionError


def _limits(spec):
    mb = 1024 * 1024
    pairs = [
        (resource.RLIMIT_CPU, spec["cpu_s"], spec["cpu_s"] + 1),
        (resource.RLIMIT_AS, spec["memory_mb"] * mb, spec["memory_mb"] * mb),
        (resource.RLIMIT_FSIZE, spec["file_size_mb"] * mb, spec["file_size_mb"] * mb),
        (resource.RLIMIT_NPROC, spec["max_procs"], spec["max_procs"]),
        (resource.RLIMIT_NOFILE, 256, 256),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    for res, soft, hard in pairs:
        resource.setrlimit(res, (soft, hard))
    # Writing past RLIMIT_FSIZE then raises OSError(EFBIG) in the program instead of killing it silently.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _compile(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return compile(f.read(), "solution.py", "exec")


def _finish(nonce, payload=b""):
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os.write(1, b"\n" + nonce + payload + b"\n")
    os._exit(0)


def main():
    spec_path, marker_fd = sys.argv[1], int(sys.argv[2])
    try:
        with open(spec_path, encoding="utf-8") as f:
            spec = json.load(f)
        _limits(spec)
        program = _compile(spec["program"])
        test = compile(spec["assert"], "test_case", "exec") if spec["mode"] == "assert" else None
    except SyntaxError:
        # The model's code does not compile: report "started" so the host blames the program.
        os.write(marker_fd, b"S")
        os.close(marker_fd)
        raise
    except BaseException as e:
        os.write(marker_fd, f"E{type(e).__name__}: {e}".encode("utf-8", "replace")[:2000])
        os.close(marker_fd)
        os._exit(RUNNER_FAILED)
    os.write(marker_fd, b"S")
    os.close(marker_fd)
    mode = spec["mode"]
    if mode == "stdio":
        sys.argv = ["solution.py"]
        exec(program, {"__name__": "__main__", "__builtins__": __builtins__})
        return
    nonce = sys.stdin.readline().strip().encode("ascii")
    ns: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    if mode == "assert":
        exec(program, ns)
        assert test is not None
        try:
            exec(test, ns)
        except _ASSERTION_ERROR:
            sys.stderr.write("test case failed: " + spec["assert"][:500] + "\n")
            sys.stderr.flush()
            os._exit(ASSERT_FAILED)
        _finish(nonce)
    elif mode == "call":
        # __name__ is not "__main__": a LeetCode-style solution's own `if __name__ == "__main__"` demo
        # must not run (and block on stdin) when we only call its function.
        ns["__name__"] = "solution"
        exec(program, ns)
        name = spec["fn_name"]
        if name in ns:
            fn = ns[name]
        elif "Solution" in ns:
            fn = getattr(ns["Solution"](), name)
        else:
            sys.stderr.write(f"function {name!r} not found\n")
            sys.stderr.flush()
            os._exit(1)
        result = fn(*spec["args"])
        try:
            text = json.dumps(result)
        except (TypeError, ValueError):
            text = json.dumps(repr(result))
        _finish(nonce, text.encode("utf-8"))


if __name__ == "__main__":
    main()
