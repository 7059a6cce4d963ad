# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# tests: {"inputs": ["first", "second"], "outputs": ["PWNED", "PWNED"]}
# Makes empty files, directories, symlinks, hard links and fifos as fast as it can (a byte-capped /tmp let it make millions: kernel memory no limit counts, and seconds of clean-up before the next case); the next case must find an empty /tmp, and no case may hold a capability, gain one by an exec, or mount anything.
import os
import sys
import time

made, t0 = 0, time.monotonic()
if sys.stdin.readline().strip() == "first":
    os.close(os.open("target", os.O_CREAT | os.O_WRONLY))
    kinds = (
        lambda n: os.close(os.open(n, os.O_CREAT | os.O_WRONLY)),
        os.mkdir,
        lambda n: os.symlink("target", n),
        lambda n: os.link("target", n),
        os.mkfifo,
    )
    try:
        while time.monotonic() - t0 < 1.0:
            kinds[made % len(kinds)](f"n{made}")
            made += 1
    except OSError:
        pass
status = open("/proc/self/status").read()
caps = [line.split()[1] for line in status.splitlines() if line.startswith(("CapEff", "CapPrm", "CapAmb"))]
mounted = False
try:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    mounted = libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, b"nr_inodes=0") == 0
except Exception:
    pass
no_new_privs = "NoNewPrivs:\t1" in status  # no exec may gain a capability back
bad = made > 10_000 or (made == 0 and os.listdir("/tmp")) or any(int(c, 16) for c in caps) or mounted
bad = bad or not no_new_privs
print("PWNED" if bad else "nothing")
