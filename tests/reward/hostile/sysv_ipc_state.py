# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# tests: {"inputs": ["first", "second", "third"], "outputs": ["PWNED", "PWNED", "PWNED"]}
# Keeps state from one case to the next in System V IPC objects (a message queue, a shared memory segment, a semaphore), which outlive every process of a case in the sandbox's IPC namespace; the segment's memory also escapes RLIMIT_AS once detached.
import ctypes
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
IPC_CREAT, KEY = 0o1000, 0x5EED
if sys.stdin.readline().strip() == "first":
    q = libc.msgget(KEY, IPC_CREAT | 0o600)
    msg = ctypes.create_string_buffer(ctypes.sizeof(ctypes.c_long) + 8)
    ctypes.c_long.from_buffer(msg).value = 1
    libc.msgsnd(q, msg, 8, 0)
    libc.semget(KEY, 1, IPC_CREAT | 0o600)
    size = 64 << 20
    for i in range(4):  # 256 MiB more than the address-space limit, kept after detaching
        addr = libc.shmat(libc.shmget(KEY + i, size, IPC_CREAT | 0o600), None, 0)
        if addr and addr != ctypes.c_void_p(-1).value:
            ctypes.memset(addr, 1, size)
            libc.shmdt(ctypes.c_void_p(addr))
    print("nothing")
else:
    left = [libc.msgget(KEY, 0), libc.semget(KEY, 0, 0), libc.shmget(KEY, 0, 0)]
    rows = sum(open(f"/proc/sysvipc/{k}").read().count("\n") - 1 for k in ("msg", "sem", "shm"))
    print("PWNED" if any(x >= 0 for x in left) or rows else "nothing")
