# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error program_timeout
# tests: solve
# Ends the case early and 'successfully': os._exit(0) in solve, exec of a succeeding process, exits from threads and atexit hooks.
import atexit
import os
import sys
import threading

atexit.register(lambda: os._exit(0))
threading.Thread(target=lambda: os._exit(0), daemon=True).start()


def solve(x=0):
    sys.stdout.flush()
    if x == 5:
        os.execv(sys.executable, [sys.executable, "-c", "pass"])
    try:
        raise SystemExit(0)
    finally:
        os._exit(0)
