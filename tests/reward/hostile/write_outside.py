# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# __CANARY__ is a file on the host the program must not change.
import os

hits = 0
for path in [
    "__CANARY__",
    "/usr/pwned",
    "/pwned",
    "/box/solution.py",
    "/proc/sys/kernel/hostname",
    "/dev/pwned",
]:
    try:
        with open(path, "w") as f:
            f.write("PWNED")
        hits += 1
    except OSError:
        pass
try:
    os.remove("__CANARY__")
    hits += 1
except OSError:
    pass
if hits:
    print("PWNED")
raise SystemExit(1)
