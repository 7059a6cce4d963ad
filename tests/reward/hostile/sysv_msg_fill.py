# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# Fills System V message queues: the messages are kernel memory that no process's address space holds, and
# an IPC namespace allows 32,000 queues of 16 KB each (500 MB) whatever RLIMIT_AS says.
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
msg = ctypes.create_string_buffer(8 + 8192)
ctypes.c_long.from_buffer(msg).value = 1
held = 0
for i in range(20000):  # 20,000 queues x 16 KB: 320 MB
    q = libc.msgget(0, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    if q < 0:
        raise OSError(ctypes.get_errno(), "msgget refused")
    for _ in range(2):
        if libc.msgsnd(q, msg, 8192, 0o4000) == 0:  # IPC_NOWAIT
            held += 8192
print("PWNED" if held > 256 << 20 else "nothing")
