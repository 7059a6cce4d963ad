# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
import os
import signal
import time

for pid in (os.getppid(), 1):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
time.sleep(0.2)
print("still here")
