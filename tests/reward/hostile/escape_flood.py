# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
# tests: {"fn_name": "solve", "inputs": [[3]], "outputs": [42]}
# Fills stdout and the answer channel (fd 4) with NUL and non-UTF-8 bytes just under their caps: each byte becomes six in the runner's JSON report, which the host refused as oversized (sandbox_error, a NaN that masks the wrong answer).
import os
import sys


def solve(x=0):
    sys.stdout.buffer.write(b"\0" * (256 * 1024))
    sys.stdout.flush()
    sys.stderr.buffer.write(b"\x1b[2J\xff\xfe" * 1000)
    sys.stderr.flush()
    os.write(4, b"\xff" * (200 * 1024))
    return 0
