# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error program_timeout
# tests: {"inputs": ["first", "second"], "outputs": ["PWNED", "PWNED"]}
# Leaves a detached child behind in the first case to write into the next case's output and files.
import os
import sys
import time

line = sys.stdin.readline().strip()
if line == "first":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            for _ in range(100):
                time.sleep(0.02)
                for path in ("/tmp/state", "/dev/shm/state"):
                    try:
                        with open(path, "w") as f:
                            f.write("PWNED")
                    except OSError:
                        pass
        os._exit(0)
    print("nothing")
else:
    for path in ("/tmp/state", "/dev/shm/state"):
        try:
            print(open(path).read())
            break
        except OSError:
            pass
    else:
        print("nothing")
