# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_timeout
import time

time.sleep(3600)
print("PWNED")
