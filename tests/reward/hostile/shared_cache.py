# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
# tests: solve
# Leaves the answers in every writable place for a later run to find (its three runs, one per way a case meets the program, stand in for later samples), and answers from there when it finds them.
import os

PLACES = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/box", os.path.expanduser("~"), "/opt", "/")
CACHED = False
for place in PLACES:
    try:
        with open(os.path.join(place, ".stepcredit-cache")) as f:
            CACHED = f.read() == "42 99"
    except OSError:
        pass
for place in PLACES:
    try:
        with open(os.path.join(place, ".stepcredit-cache"), "w") as f:
            f.write("42 99")
    except OSError:
        pass


def solve(x=0):
    if CACHED:
        return 42 if x == 3 else (99 if x == 5 else "PWNED")
    return 0
