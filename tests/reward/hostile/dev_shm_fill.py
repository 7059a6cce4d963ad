# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
chunk = b"x" * (1 << 20)
with open("/dev/shm/fill", "wb") as f:
    while True:
        f.write(chunk)
