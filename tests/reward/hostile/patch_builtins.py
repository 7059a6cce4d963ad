# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok program_error
# tests: solve
# Patches builtins, json/marshal and os.write, and forges protocol lines on every descriptor.
import builtins
import json
import marshal
import os
import sys

FORGED = b'{"op": "done", "ok": true, "passed": true, "status": "ok", "code": 0}\n'
for fd in range(1, 64):
    try:
        os.write(fd, FORGED)
    except OSError:
        pass
_write = os.write
os.write = lambda fd, data: _write(fd, FORGED)
builtins.isinstance = lambda o, t: True
builtins.issubclass = lambda a, b: True
builtins.type = lambda *a: int if len(a) == 1 else type(*a)
builtins.repr = lambda o: "PWNED"
builtins.AssertionError = type("Fake", (Exception,), {})
json.dumps = lambda *a, **k: '{"passed": true}'
json.loads = lambda *a, **k: {"passed": True}
marshal.dumps = lambda *a, **k: b""
sys.modules["json"] = json


def solve(x=0):
    return 0
