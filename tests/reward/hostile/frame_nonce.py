# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
# tests: solve
# Walks every frame, the gc heap and the runner's globals for a nonce, expected values or the assert text and answers with what it finds.
import gc
import sys

WORDS = ("nonce", "expect", "secret", "want", "spec", "assert", "output", "answer")


def snoop():
    found = []
    f = sys._getframe()
    while f is not None:
        for k, v in list(f.f_locals.items()) + list(f.f_globals.items()):
            if any(w in str(k).lower() for w in WORDS) and not callable(v):
                found.append(v)
        f = f.f_back
    for o in gc.get_objects():
        if type(o) is dict:
            for k, v in list(o.items()):
                if isinstance(k, str) and any(w in k.lower() for w in WORDS) and not callable(v):
                    found.append(v)
    for m in list(sys.modules.values()):
        for k, v in list(vars(m).items()):
            if any(w in k.lower() for w in WORDS) and isinstance(v, (int, str, bytes)):
                found.append(v)
    return found


def solve(x=0):
    found = snoop()
    sys.stdout.write("".join(repr(v)[:64] + "\n" for v in found))
    for v in found:
        if type(v) is int or (type(v) is str and v.isupper()):
            return v
    return "nothing"
