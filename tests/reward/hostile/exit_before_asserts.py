# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# tests: {"assert_case": ["assert solve() == 42"]}
import sys


def solve():
    return 0


sys.exit(0)
