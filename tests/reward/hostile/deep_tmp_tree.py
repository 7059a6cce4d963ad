# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# tests: {"inputs": ["first", "second", "third"], "outputs": ["PWNED", "PWNED", "PWNED"]}
# Leaves a directory tree deeper than PATH_MAX and the recursion limit in /tmp: emptying /tmp before the next case must neither crash the runner (a sandbox_error would mask the wrong answers) nor leave it behind.
import os
import sys

if sys.stdin.readline().strip() == "first":
    for _ in range(3000):
        os.mkdir("a")
        os.chdir("a")
    print("nothing")
else:
    print("PWNED" if os.listdir("/tmp") else "nothing")
