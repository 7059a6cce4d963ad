# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# Many processes, each under RLIMIT_AS (a per-process limit), hold far more than the memory limit together.
import os
import time

for _ in range(16):
    if os.fork() == 0:
        block = bytearray(200 << 20)  # 200 MiB, under the 256 MiB address-space limit of the suite
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(10)
        os._exit(0)
time.sleep(10)
print("PWNED")
