# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# Like fork_memory, with shared anonymous mappings (mmap's default): their pages are shmem, not anonymous,
# so a watch of anonymous memory alone misses them while each process stays under RLIMIT_AS.
import mmap
import os
import time

size = 200 << 20
children = [os.fork() for _ in range(4)]  # 16 processes (each fork doubles them), each maps its own
block = mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS
chunk = b"\x01" * (1 << 20)
while block.tell() < size:  # 200 MiB touched, within RLIMIT_AS (256 MiB) in every process
    block.write(chunk)
time.sleep(1)
if all(children):  # the first process only: every fork returned a child's pid
    print("PWNED")
