# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# Like fork_memory, with shared anonymous mappings (mmap's default): their pages are shmem, not anonymous,
# so a watch of anonymous memory alone misses them while each process stays under RLIMIT_AS.
import mmap
import os
import time

for _ in range(16):
    if os.fork() == 0:
        block = mmap.mmap(-1, 200 << 20)  # MAP_SHARED | MAP_ANONYMOUS
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(10)
        os._exit(0)
time.sleep(10)
print("PWNED")
