# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# tests: solve
# Compiling it raises RecursionError (__DEEP_NOT__ is replaced by thousands of unary operators): the program's fault.


def solve(x=0):
    return x


BOMB = __DEEP_NOT__(1)
