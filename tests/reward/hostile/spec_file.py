# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
# tests: solve
# Reads every file it can reach in the sandbox (spec, runner, /proc of pid 1) for expected values.
import glob
import re
import sys


def snoop():
    found = []
    pats = (
        "/box/*",
        "/box/**/*",
        "/tmp/*",
        "/*.json",
        "/run/**/*",
        "/proc/1/cmdline",
        "/proc/1/environ",
        "/proc/1/mem",
        "/proc/1/maps",
        "/proc/self/environ",
        "/dev/shm/*",
    )
    for pat in pats:
        for p in glob.glob(pat, recursive=True):
            try:
                with open(p, "rb") as f:
                    found.append(f.read(1 << 20))
            except OSError:
                pass
    return found


def solve(x=0):
    for data in snoop():
        for m in re.findall(rb"solve\(%d\) *== *(\w+)" % x, data):
            return int(m) if m.isdigit() else m.decode()
        if b"PW" + b"NED" in data:
            return "PW" + "NED"
    return "nothing"
