# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
# tests: {"fn_name": "solve", "inputs": [[3], [5]], "outputs": [[42], {"a": 99}]}
# Answers with containers that contain themselves, to hang or crash the encoder of answers.
def solve(x=0):
    if x == 3:
        a = []
        a.append(a)
        return a
    d = {}
    d["a"] = d
    return d
