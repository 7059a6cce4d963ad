# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
i = 0
while True:
    with open(f"f{i}.txt", "w") as f:
        f.write("x" * 4096)
    i += 1
