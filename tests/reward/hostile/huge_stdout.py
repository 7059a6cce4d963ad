# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
line = "A" * 10000
while True:
    print(line)
