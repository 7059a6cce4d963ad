# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# score: 1
# tests: {"inputs": [""], "outputs": ["done"]}
# Double-forks a daemon that keeps trying to write the canary; the answer itself is right.
import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        for _ in range(600):
            try:
                with open("__CANARY__", "w") as f:
                    f.write("PWNED")
            except OSError:
                pass
            time.sleep(0.1)
        os._exit(0)
    os._exit(0)
print("done")
