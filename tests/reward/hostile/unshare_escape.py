# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# Tries to gain capabilities in a nested user namespace, then to mount or chroot.
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0:
    print("PWNED")
if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0 and os.getuid() == 0:
    print("PWNED")
if libc.chroot(b"/tmp") == 0:
    print("PWNED")
raise SystemExit(2)
