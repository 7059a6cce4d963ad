# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_timeout
# tests: solve
# Reads stdin to its end in every mode (with nothing more to read it must see end of input or be stopped by the deadline, never hang the runner).
import sys


def solve(x=0):
    return sys.stdin.read() or 0
