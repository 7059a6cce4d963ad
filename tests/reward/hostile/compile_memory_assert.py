# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: error
# tests: {"assert_case": ["assert solve(3) == 42", "assert solve(5) == 99"]}
# Compiling it raises MemoryError (__DEEP_NEG__ is replaced by thousands of unary operators): the program's fault.


def solve(x=0):
    return x


BOMB = __DEEP_NEG__(1)
