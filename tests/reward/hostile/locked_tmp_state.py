# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# tests: {"inputs": ["first", "second"], "outputs": ["PWNED", "PWNED"]}
# Keeps state from one case to the next in a directory it made unreadable (chmod 000), which the runner's cleaning of /tmp skipped.
import os
import sys

if sys.stdin.readline().strip() == "first":
    os.makedirs("/tmp/d/e")
    with open("/tmp/d/e/state", "w") as f:
        f.write("PWNED")
    os.chmod("/tmp/d/e", 0)
    os.chmod("/tmp/d", 0)
    print("nothing")
else:
    try:
        os.chmod("/tmp/d", 0o700)
        os.chmod("/tmp/d/e", 0o700)
        print(open("/tmp/d/e/state").read())
    except OSError:
        print("nothing")
