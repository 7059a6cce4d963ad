# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: timeout
import time

time.sleep(3600)
print("PWNED")
