# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: error
# tests: {"inputs": ["3", "5"], "outputs": ["PWNED", "PWNED"]}
# Compiling it raises MemoryError (__DEEP_NEG__ is replaced by thousands of unary operators): the program's fault.


def solve(x=0):
    return x


BOMB = __DEEP_NEG__(1)

print(solve(int(input() or 0)))
