# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_timeout
# Spins in many processes: RLIMIT_CPU stops each process alone after the case's CPU time, so 16 of them
# took 16 times that from the machine (and from the programs scored beside it) within the wall clock.
import os

for _ in range(4):
    os.fork()  # 16 processes
while True:
    pass
