# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error program_timeout
# Keeps forking, swallowing every failure, so only the deadline ends it.
import os

while True:
    try:
        os.fork()
    except OSError:
        pass
