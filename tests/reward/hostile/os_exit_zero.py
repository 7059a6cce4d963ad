# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# tests: {"assert_case": ["assert solve() == 42", "assert solve() > 100"]}
import os


def solve():
    return 0


os._exit(0)
