# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
# kill(-1) and a brute-force sweep of pids: only the sandbox's own processes can be reached.
import os
import signal

try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
hit = 0
for pid in range(2, 70000):
    if pid == os.getpid():
        continue
    try:
        os.kill(pid, signal.SIGKILL)
        hit += 1
    except OSError:
        pass
print("killed", hit)
