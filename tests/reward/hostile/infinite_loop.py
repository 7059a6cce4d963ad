# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: timeout
while True:
    pass
