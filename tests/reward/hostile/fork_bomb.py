# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error program_timeout
import os

while True:
    os.fork()
