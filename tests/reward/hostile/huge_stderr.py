# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
import sys

line = "E" * 10000
while True:
    sys.stderr.write(line)
