"""The adversarial suite: every hostile program in ``hostile/`` is contained and gets the right status.

Each program states what it expects in header comments: ``# expect:`` the allowed statuses,
``# tests:`` its ground truth (default: one stdin/stdout case whose expected output is ``PWNED``, which
a program prints only when its attack worked; ``solve``: the program defines ``solve(n)`` and runs once
per ground truth of :data:`SOLVE_TRUTHS`, as ``<name>_<mode>``) and ``# score:`` the right score (default 0). Tokens
``__CANARY__``, ``__PORT__`` and ``__SECRET_NAME__`` are replaced by a host file that must stay
untouched, a host TCP/UDP port on 127.0.0.1 that must see no traffic, and the name of a secret set in
the host's environment; ``__UNIX_ABSTRACT__``/``__UNIX_PATH__`` by host unix sockets (abstract, and a
path in a world-writable folder) that must see no connection; ``__REPO__`` and ``__HOSTTMP__`` by the
repository's root and the host folder where sandboxes' host-side folders are made; ``__DEEP_NOT__``/``__DEEP_NEG__`` by thousands of unary operators (compile bombs). All programs run in one batch, two at a time (the machine has two cores).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from stepcredit.config import SandboxConfig
from stepcredit.reward.verifiers.code import sandbox as sb
from stepcredit.types import RewardResult

HOSTILE_DIR = Path(__file__).parent / "hostile"
REPO = Path(__file__).resolve().parents[2]
SOLVE_TRUTHS = {
    "assert": ({"assert_case": ["assert solve(3) == 42", "assert solve(5) == 99"]}, ""),
    "call": ({"fn_name": "solve", "inputs": [[3], [5]], "outputs": [42, 99]}, ""),
    "stdio": ({"inputs": ["3", "5"], "outputs": ["PWNED", "PWNED"]}, "\n\nprint(solve(int(input() or 0)))\n"),
}
"""The ground truths a ``# tests: solve`` program runs against, each with the lines appended to the program
(stdio reads the case from stdin): the same attack through each way a case meets the program."""


def _cases() -> list[tuple[str, str, dict[str, Any] | None, str]]:
    """(case name, program file stem, its ground truth or None to read the header, lines appended)."""
    out = []
    for path in sorted(HOSTILE_DIR.glob("*.py")):
        if re.search(r"^# tests: solve$", path.read_text(), re.MULTILINE):
            out += [(f"{path.stem}_{mode}", path.stem, gt, tail) for mode, (gt, tail) in SOLVE_TRUTHS.items()]
        else:
            out.append((path.stem, path.stem, None, ""))
    return sorted(out)


CASES = _cases()
PROGRAMS = [name for name, *_ in CASES]
SECRET_NAME = "STEPCREDIT_TEST_SECRET"

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def header(src: str, key: str) -> str | None:
    m = re.search(rf"^# {key}: (.*)$", src, re.MULTILINE)
    return m.group(1).strip() if m else None


def _ppid(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    m = re.search(r"^PPid:\s+(\d+)", status, re.MULTILINE)
    return int(m.group(1)) if m else 0


def _sandboxed(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    uid = int(re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE).group(1))  # type: ignore[union-attr]
    return sb.UID_BASE <= uid < sb.UID_BASE + sb.UID_COUNT or b"/box/runner.py" in cmdline


def _another_runs(pid: int) -> bool:
    """Whether a sandbox process belongs to another live run on this machine (another test session
    beside this one): its first ancestor outside the sandbox is neither init (an orphan that escaped
    its run, which counts against us) nor this process or one of its descendants."""
    own = os.getpid()
    while pid > 1 and _sandboxed(pid):
        pid = _ppid(pid)
    if pid <= 1:
        return False
    while pid > 1:
        if pid == own:
            return False
        pid = _ppid(pid)
    return True


def leftover_processes() -> list[str]:
    """Processes of the sandbox uids, or running our runner: none may exist between runs (those of
    another test session running beside this one are not ours to judge)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        uid = int(re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE).group(1))  # type: ignore[union-attr]
        zombie = re.search(r"^State:\s+Z", status, re.MULTILINE)
        mine = not _another_runs(int(name))
        if (
            not zombie
            and mine
            and (sb.UID_BASE <= uid < sb.UID_BASE + sb.UID_COUNT or "/box/runner.py" in cmdline)
        ):
            found.append(f"{name} uid={uid} {cmdline[:80]}")
    return found


class Listener:
    """A TCP and a UDP socket on the host's 127.0.0.1, and unix sockets (abstract and on a path in the
    world-writable folder ``folder``), that record any traffic."""

    def __init__(self, folder: Path) -> None:
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.tcp.settimeout(0.2)
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.udp.settimeout(0.2)
        self.unix_abstract = "\0stepcredit-hostile-" + secrets.token_hex(8)
        self.unix_path = str(folder / "host.sock")
        self.unix = []
        for addr in (self.unix_abstract, self.unix_path):
            u = socket.socket(socket.AF_UNIX)
            u.bind(addr)
            u.listen(8)
            u.settimeout(0.2)
            self.unix.append(u)
        os.chmod(self.unix_path, 0o777)
        self.hits: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for s in (self.tcp, self.udp, *self.unix):
                try:
                    if s.type == socket.SOCK_STREAM:
                        conn, addr = s.accept()
                        self.hits.append(f"{s.family.name} {addr}")
                        conn.close()
                    else:
                        _, addr = s.recvfrom(100)
                        self.hits.append(f"udp {addr}")
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for s in (self.tcp, self.udp, *self.unix):
            s.close()


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory, private_tempdir: Path) -> Any:
    canary = tmp_path_factory.mktemp("canary") / "canary.txt"
    canary_text = "canary " + secrets.token_hex(8)
    canary.write_text(canary_text)
    os.chmod(canary.parent, 0o777)  # even world-writable: the sandbox must still not reach it
    os.chmod(canary, 0o666)
    listener = Listener(canary.parent)
    old_secret = os.environ.get(SECRET_NAME)
    os.environ[SECRET_NAME] = "hunter2-" + secrets.token_hex(8)
    bystander = subprocess.Popen(["sleep", "300"])
    # other runs on the machine may have sandboxes of their own alive: only what this suite adds counts
    others = set(leftover_processes())
    usage_before = shutil.disk_usage("/tmp").used
    sources, truths, meta = [], [], {}
    for name, stem, truth, tail in CASES:
        src = (HOSTILE_DIR / f"{stem}.py").read_text() + tail
        src = src.replace("__CANARY__", str(canary)).replace("__PORT__", str(listener.port))
        src = src.replace("__SECRET_NAME__", SECRET_NAME).replace("__HOSTTMP__", str(private_tempdir))
        src = src.replace("__UNIX_ABSTRACT__", "\\0" + listener.unix_abstract[1:])
        src = src.replace("__UNIX_PATH__", listener.unix_path).replace("__REPO__", str(REPO))
        # Compile-time bombs: nesting deep enough for the compiler's RecursionError / MemoryError.
        src = src.replace("__DEEP_NOT__", "not " * 3000).replace("__DEEP_NEG__", "-" * 6000)
        tests = header(src, "tests")
        if truth is None:
            truth = json.loads(tests) if tests else {"inputs": [""], "outputs": ["PWNED"]}
        truths.append(truth)
        # The headers hold the answers: a program that reads its own source must not find them.
        body = re.sub(r"^# (expect|tests|score): .*\n", "", src, flags=re.MULTILINE)
        sources.append(f"Here is my solution.\n```python\n{body}\n```\n")
        meta[name] = (set((header(src, "expect") or "").split()), float(header(src, "score") or 0.0))
    cfg = SandboxConfig(timeout_s=2.0, memory_mb=256, tmpfs_mb=32, file_size_mb=8, output_limit_kb=256)
    try:
        results = sb.score_code_batch(sources, truths, sandbox=sb.Sandbox(cfg))
        yield {
            "results": dict(zip(PROGRAMS, results, strict=True)),
            "meta": meta,
            "canary": (canary, canary_text),
            "listener": listener,
            "bystander": bystander,
            "usage_before": usage_before,
            "others": others,
            "tmp": private_tempdir,
        }
    finally:
        listener.close()
        bystander.kill()
        bystander.wait()
        if old_secret is None:
            os.environ.pop(SECRET_NAME, None)
        else:
            os.environ[SECRET_NAME] = old_secret


def test_at_least_twenty_hostile_programs() -> None:
    assert len(PROGRAMS) >= 20


@pytest.mark.parametrize("name", PROGRAMS)
def test_hostile_program_is_contained(suite: Any, name: str) -> None:
    res: RewardResult = suite["results"][name]
    statuses, score = suite["meta"][name]
    assert statuses, f"{name} has no '# expect:' header"
    assert res.status.value in statuses, (name, res.status, res.info)
    assert res.score == score, (name, res.score, res.info)


def test_host_is_unaffected(suite: Any) -> None:
    canary, text = suite["canary"]
    assert canary.read_text() == text
    assert suite["listener"].hits == []
    assert suite["bystander"].poll() is None, "a host process was killed"
    # Disk fills went to the sandbox's own tmpfs, not the host's disk (allow unrelated churn).
    assert shutil.disk_usage("/tmp").used - suite["usage_before"] < 64 * 1024 * 1024
    left = list(suite["tmp"].glob("stepcredit-sbx-*"))  # the suite's own temporary folder
    assert not left, f"host-side sandbox directories were left behind: {left}"


def test_no_process_left_behind(suite: Any) -> None:
    assert set(leftover_processes()) - suite["others"] == set()


def test_secret_never_reaches_the_sandbox(suite: Any) -> None:
    res = suite["results"]["read_secrets"]
    assert res.info["cases"][0]["status"] == "failed"
    assert "nothing" in res.info["cases"][0]["message"]


@pytest.mark.parametrize(
    "payload",
    [
        "b'\\0' * (1000 * 1024)",  # each NUL is six bytes ("\u0000") in the runner's JSON report
        "b'\\xff' * (1000 * 1024)",  # each byte that is not UTF-8 is six ("\ufffd")
        "b'\\x1b[2K\\rPWNED\\0\\xff\\n'",  # terminal escapes and NUL around the expected answer
    ],
)
def test_escaped_output_under_the_default_cap_is_the_programs_failure(payload: str) -> None:
    # At the default output cap (1 MiB) the runner's report of ~1 MB of such bytes used to exceed the
    # host's limit on one message: sandbox_error, a NaN the failure policy masks, instead of a 0.
    code = f"import sys\nsys.stdout.buffer.write({payload})\n"
    box = sb.Sandbox(SandboxConfig(timeout_s=2.0, memory_mb=256))
    res = sb.score_code(f"```python\n{code}\n```", {"inputs": [""], "outputs": ["PWNED"]}, sandbox=box)
    assert (res.status.value, res.score) == ("ok", 0.0), res.info


def test_a_case_may_have_max_files_entries_in_tmp_whatever_their_kind() -> None:
    # A tmpfs capped in bytes only let a program make millions of empty files or directories (kernel
    # memory that no limit counts, and seconds of clean-up before the next case): each case's /tmp is
    # now capped in inodes (nr_inodes), and hard links count as entries too (tmpfs charges each one).
    code = (
        "import os, sys\n"
        "kind = sys.stdin.readline().strip()\n"
        "os.close(os.open('target', os.O_CREAT | os.O_WRONLY))\n"
        "make = {'file': lambda n: os.close(os.open(n, os.O_CREAT | os.O_WRONLY)), 'dir': os.mkdir,\n"
        "        'symlink': lambda n: os.symlink('target', n), 'link': lambda n: os.link('target', n),\n"
        "        'fifo': os.mkfifo, 'deep': lambda n: (os.mkdir(n), os.chdir(n))}[kind]\n"
        "made = 0\n"
        "try:\n"
        "    while made < 1000:\n"
        "        make(f'n{made}')\n"
        "        made += 1\n"
        "except OSError as e:\n"
        "    print(made, e.errno)\n"
    )
    kinds = ["file", "dir", "symlink", "link", "fifo", "deep"]
    box = sb.Sandbox(SandboxConfig(timeout_s=5.0, memory_mb=256, max_files=50))
    truth = {"inputs": kinds, "outputs": ["49 28"] * len(kinds)}  # 'target' is one of the 50; ENOSPC
    res = sb.score_code(f"```python\n{code}\n```", truth, sandbox=box)
    assert (res.status.value, res.score) == ("ok", 1.0), res.info
