"""How a jail starts: the runner compiled once by the jail's interpreter, bubblewrap started under the
jail's own uid with no way back to the host's root."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stepcredit.config import SandboxConfig
from stepcredit.sandbox import jail
from stepcredit.sandbox.bwrap import Sandbox
from stepcredit.sandbox.cases import TestCase as Case
from stepcredit.sandbox.jail import UID_BASE, _default_python, as_uid
from stepcredit.sandbox.judging import PASSED
from stepcredit.sandbox.session import _runner_source, runner_file


def _magic(python: str) -> bytes:
    code = "import sys, _frozen_importlib_external as e; sys.stdout.buffer.write(e.MAGIC_NUMBER)"
    return subprocess.run([python, "-I", "-S", "-c", code], capture_output=True, check=True).stdout


def test_the_runner_is_compiled_by_the_jails_interpreter_which_runs_it_as_is(tmp_path: Path) -> None:
    python = _default_python()
    name, data = runner_file(python)
    assert name == "runner.pyc"
    assert data[:4] == _magic(python)
    path = tmp_path / name
    path.write_bytes(data)
    # Without its limits as arguments the runner reports why and exits (it never gets further).
    done = subprocess.run([python, "-I", "-S", "-B", str(path)], capture_output=True, timeout=30)
    assert done.returncode == 97
    assert done.stdout.startswith(b'{"op":"failed"')


def test_an_interpreter_that_cannot_compile_the_runner_gets_its_source(tmp_path: Path) -> None:
    source = _runner_source().encode()
    assert runner_file("/bin/false") == ("runner.py", source)
    assert runner_file(str(tmp_path / "no-such-python")) == ("runner.py", source)


def test_bubblewrap_runs_as_the_jails_uid_with_no_way_back_to_root() -> None:
    argv = ["/bin/cat", "/proc/self/status"]
    if os.geteuid() != 0:  # a normal user's jails run as that user: nothing changes
        assert as_uid(argv, None) == (argv, {})
        return
    uid = UID_BASE + 4095
    cmd, extra = as_uid(argv, uid)
    status = subprocess.run(cmd, capture_output=True, check=True, timeout=30, **extra).stdout.decode()

    def field(key: str) -> list[str]:
        m = re.search(rf"^{key}:[ \t]*(.*)$", status, re.MULTILINE)
        assert m is not None, key
        return m.group(1).split()

    # real, effective, saved and filesystem ids: a saved 0 would let the process become root again
    assert field("Uid") == [str(uid)] * 4
    assert field("Gid") == [str(uid)] * 4
    assert field("Groups") == []
    assert int(field("CapPrm")[0], 16) == 0 and int(field("CapEff")[0], 16) == 0
    assert int(field("CapAmb")[0], 16) == 0


def test_without_setpriv_the_uid_is_set_by_popen_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jail, "_setpriv", lambda: None)
    argv = ["/usr/bin/bwrap", "--", "/bin/true"]
    assert jail.as_uid(argv, UID_BASE) == (
        argv,
        {"user": UID_BASE, "group": UID_BASE, "extra_groups": []},
    )


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_the_runner_hides_itself_and_not_the_programs_own_process() -> None:
    # prctl(PR_SET_DUMPABLE) through _ctypes: 0 for the runner (pid 1), 1 again in each case's child
    program = (
        "x = open('/dev/stdin').read().strip()\n"
        "try:\n    open('/proc/1/environ').read()\n    print(x, 'readable')\n"
        "except PermissionError:\n    print(x, 'hidden')\n"
    )
    outs = Sandbox(SandboxConfig()).check(program, [Case("stdio", stdin="hi\n", expected="hi hidden")])
    assert outs[0].status == PASSED, outs[0]


def test_the_jail_passes_the_limits_in_the_order_the_runner_reads_them() -> None:
    # runner.py runs alone in the jail (it imports nothing of ours), so it names the limits itself; the
    # two lists must agree, or a limit silently lands in another's place.
    import ast

    from stepcredit.sandbox import runner

    tree = ast.parse(Path(runner.__file__).read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    names = next(
        tuple(ast.literal_eval(n.value))
        for n in ast.walk(main)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "names" for t in n.targets)
    )
    tail = [
        n.targets[0].slice.value
        for n in ast.walk(main)
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Subscript)
        and isinstance(n.targets[0].value, ast.Name)
        and n.targets[0].value.id == "limits"
    ]
    assert (*names, *tail) == jail.RUNNER_LIMITS
