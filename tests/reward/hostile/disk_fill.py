# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# Fills its working directory (one file, then many) until a limit stops it.
chunk = b"x" * (1 << 20)
with open("fill.bin", "wb") as f:
    while True:
        f.write(chunk)
        f.flush()
