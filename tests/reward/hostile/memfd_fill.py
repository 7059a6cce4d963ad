# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# Fills memfds with write(): their pages are in no process's address space or resident set, so neither
# RLIMIT_AS nor a watch of resident memory sees them; each stays under RLIMIT_FSIZE, 256 fds hold 4 GiB.
import os

chunk = b"x" * (1 << 20)
fds = []
for i in range(250):
    fd = os.memfd_create(f"m{i}")
    fds.append(fd)
    for _ in range(16):
        os.write(fd, chunk)
print("PWNED")
