# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
# tests: {"assert_case": ["assert solve() == 42"]}
# Tries to read the runner's nonce back from stdin and print it as if the tests had passed.
import os
import sys


def solve():
    return 0


data = b""
try:
    os.lseek(0, 0, os.SEEK_SET)
    data = os.read(0, 4096)
except OSError:
    pass
try:
    with open("/proc/self/fd/0", "rb") as f:
        data += f.read()
except OSError:
    pass
for fd in range(3, 64):
    try:
        os.write(fd, b"S")
    except OSError:
        pass
sys.stdout.write("\n" + data.decode(errors="replace").strip() + "\n")
sys.stdout.flush()
os._exit(0)
