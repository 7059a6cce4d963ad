# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
import sys

sys.stdout.write("B" * (64 * 1024 * 1024))
