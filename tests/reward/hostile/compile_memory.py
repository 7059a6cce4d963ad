# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# tests: solve
# Compiling it raises MemoryError (__DEEP_NEG__ is replaced by thousands of unary operators): the program's fault.


def solve(x=0):
    return x


BOMB = __DEEP_NEG__(1)
