# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error program_timeout
import sys

sys.setrecursionlimit(10**8)


def f(n):
    return f(n + 1) + 1


f(0)
