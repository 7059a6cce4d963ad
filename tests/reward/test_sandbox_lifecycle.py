"""Jails started ahead of their program: one per program, never handed out twice, none left behind."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from stepcredit.config import SandboxConfig
from stepcredit.sandbox import cases as sbcases
from stepcredit.sandbox.bwrap import Sandbox
from stepcredit.sandbox.cases import CaseMode
from stepcredit.sandbox.dirs import DIR_PREFIX
from stepcredit.sandbox.judging import PASSED, _request
from stepcredit.sandbox.lifecycle import Batch, Jail, finish_jail

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def _fake_starts(tmp_path: Path) -> tuple[list[Jail], Batch]:
    started: list[Jail] = []

    def start() -> Jail:
        jail = Jail(str(tmp_path / f"jail{len(started)}"), None, -1)
        os.mkdir(jail.host_dir)
        started.append(jail)
        return jail

    return started, Batch(start, total=5, ahead=1)


def test_a_batch_starts_one_jail_per_program_and_hands_each_out_once(tmp_path: Path) -> None:
    started, batch = _fake_starts(tmp_path)
    taken = []
    for _ in range(5):
        taken.append(batch.take())
        batch.start_ahead()  # as a worker does once its program's first cases are sent
    batch.close()
    # one jail started ahead at each take while programs remain, never more than the batch's programs
    assert len(started) == 5
    assert len({id(j) for j in taken}) == 5


def test_a_jail_no_program_took_is_stopped_when_the_batch_closes(tmp_path: Path) -> None:
    started, batch = _fake_starts(tmp_path)
    taken = []
    for _ in range(2):  # the third program never came (e.g. it had no cases)
        taken.append(batch.take())
        batch.start_ahead()
    assert len(started) == 3
    for jail in taken:
        finish_jail(jail, graceful=True)
    batch.close()
    assert list(tmp_path.iterdir()) == []  # every jail's folder is gone


@needs_bwrap
def test_a_jail_serves_the_first_program_it_is_given_only() -> None:
    box = Sandbox(SandboxConfig(timeout_s=5.0))
    request = _request(sbcases.TestCase(CaseMode.STDIO, stdin="", expected=""))
    assert request is not None
    jail = box._start_jail()
    assert jail.session is not None
    try:
        assert jail.session.recv(time.monotonic() + 20)["op"] == "hello"
        jail.session.send({"op": "program", "source": "print('first')"})
        jail.session.send({"op": "program", "source": "print('second')"})
        jail.session.send(request)
        done = jail.session.recv(time.monotonic() + 20)
    finally:
        finish_jail(jail, graceful=False)
    assert done["op"] == "done" and done["out"] == "first\n"
    assert not os.path.exists(jail.host_dir)


@needs_bwrap
def test_a_batch_judges_each_program_in_its_own_jail_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="stepcredit-test-tmp-"))
    os.chmod(tmp, 0o711)  # traversable by the sandbox's uid, as the host's temporary folder is
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    try:
        box = Sandbox(SandboxConfig(timeout_s=5.0, concurrency=2))
        # each program prints its own number: a jail handed two programs would answer with the first
        jobs = [(f"print({i})", [sbcases.TestCase(CaseMode.STDIO, expected=str(i))] * 2) for i in range(6)]
        jobs.insert(3, ("print(0)", []))  # a program without cases takes no jail
        verdicts = box.check_many(jobs)
        assert [[o.status for o in outs] for outs in verdicts] == [[PASSED] * len(c) for _, c in jobs]
        assert list(tmp.glob(f"{DIR_PREFIX}*")) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
