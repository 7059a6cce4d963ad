# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
hog = []
while True:
    hog.append(bytearray(50 * 1024 * 1024))
