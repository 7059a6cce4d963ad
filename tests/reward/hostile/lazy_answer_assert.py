# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
# tests: {"assert_case": ["assert solve(3) == [42]", "assert list(solve(5)) == [99]"]}
# Answers with lazy objects (a generator, a map with side effects) instead of values.
def solve(x=0):
    if x == 3:
        return (i for i in [42])
    return map(lambda v: 99, range(1))
