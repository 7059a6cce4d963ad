# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: error timeout
import os

while True:
    os.fork()
