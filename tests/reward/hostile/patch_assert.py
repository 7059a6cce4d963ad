# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
# tests: {"assert_case": ["assert solve() == 42"]}
# Tries to neutralise the test by replacing builtins and raising SystemExit(0) from an atexit hook.
import atexit
import builtins
import os


def solve():
    return 0


builtins.AssertionError = type("Fake", (Exception,), {})
atexit.register(lambda: os._exit(0))
