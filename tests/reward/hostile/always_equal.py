# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
# tests: solve
# Answers with objects that equal everything: a plain class, an int subclass, a fake __class__, nested in a list.
import sys


class Anything:
    __class__ = property(lambda self: int)

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __bool__(self):
        return True

    def __hash__(self):
        return 0

    def __repr__(self):
        return "PWNED"

    __str__ = __repr__


class EqInt(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__

    def __str__(self):
        return "PWNED"


class EqStr(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def solve(x=0):
    if x == 3:
        return Anything()
    return [EqInt(0), EqStr("x")] if x == 5 else EqInt(0)


sys.stdout = Anything()
