# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
import os

os.setuid(0)
print("PWNED")
