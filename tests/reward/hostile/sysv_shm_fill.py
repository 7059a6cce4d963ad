# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# Makes System V shared memory segments, fills each and detaches it: a detached segment's pages are in
# no process's address space, so RLIMIT_AS never counts them and the loop can take the machine's memory.
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = 64 << 20
for i in range(64):  # 4 GiB
    sid = libc.shmget(0, size, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    if sid < 0:
        raise OSError(ctypes.get_errno(), "shmget refused")
    addr = libc.shmat(sid, None, 0)
    ctypes.memset(addr, 1, size)
    libc.shmdt(ctypes.c_void_p(addr))
print("PWNED")
