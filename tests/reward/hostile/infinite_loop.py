# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_timeout
while True:
    pass
