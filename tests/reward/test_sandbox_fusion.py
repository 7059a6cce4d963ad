"""SandboxFusion both ways: VeRL's own ``sandbox_fusion`` reward code scores programs against
``stepcredit serve sandbox`` (its server object on a free loopback port), and stepcredit's
``reward.sandbox.backend=sandbox_fusion`` runs against that same server with the same verdicts as the
local sandbox."""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepcredit.config import RewardConfig, SandboxConfig
from stepcredit.errors import ConfigError, UserError
from stepcredit.reward.run.health import RewardBackendError, probe_routes
from stepcredit.reward.run.rewarder import build_rewarder
from stepcredit.reward.verifiers.code import sandbox as sb
from stepcredit.sandbox.fusion import FusionSandbox
from stepcredit.sandbox.fusion_server import SandboxServer, is_loopback
from stepcredit.types import Sample, Status

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

HOSTILE_DIR = Path(__file__).parent / "hostile"


@pytest.fixture(scope="module")
def server() -> Iterator[SandboxServer]:
    srv = SandboxServer("127.0.0.1", 0, concurrency=3, max_request_bytes=256 * 1024, max_timeout_s=10)
    srv.check()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        thread.join(5)


def _verl() -> Any:
    return pytest.importorskip("verl.utils.reward_score.sandbox_fusion")  # the verl tests' venv


def _fenced(code: str) -> str:
    return f"Here it is.\n```python\n{code}```\n"


# --------------------------------------------------------------------------- VeRL's client -> server
@pytest.mark.verl
def test_verl_scores_right_and_wrong_programs(server: SandboxServer) -> None:
    vsf = _verl()
    stdio = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}
    right = _fenced("a, b = map(int, input().split())\nprint(a + b)\n")
    wrong = _fenced("a, b = map(int, input().split())\nprint(a * b)\n")
    crash = _fenced("raise ValueError('no')\n")
    assert vsf.compute_score(server.url, None, 1024, right, stdio, timeout=5)[0] == 1.0
    # 1*2 != 3 but 3*4 != 7 either: both wrong
    assert vsf.compute_score(server.url, None, 1024, wrong, stdio, timeout=5)[0] == 0.0
    score, meta = vsf.compute_score(server.url, None, 1024, crash, stdio, timeout=5)
    assert score == 0.0 and meta[0]["status"] == "runtime_error" and "ValueError" in meta[0]["stderr"]
    # VeRL's fn_name wrapper (its own code, sent as the program) and its assert_case form
    add = _fenced("def add(a, b):\n    return a + b\n")
    calls = {"fn_name": "add", "inputs": ["1\n2", "3\n4"], "outputs": ["3", "7"]}
    assert vsf.compute_score(server.url, None, 1024, add, calls, timeout=5)[0] == 1.0
    asserts = {"assert_case": ["assert add(1, 2) == 3", "assert add(1, 1) == 3"]}
    assert vsf.compute_score(server.url, None, 1024, add, asserts, timeout=5)[0] == 0.5


class _Listener:
    """A TCP socket on the host's 127.0.0.1 that records any connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.hits: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, addr = self.sock.accept()
                self.hits.append(str(addr))
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.mark.verl
def test_hostile_programs_stay_contained(
    server: SandboxServer, tmp_path: Path, private_tempdir: Path
) -> None:
    vsf = _verl()
    canary = tmp_path / "canary.txt"
    text = "canary " + secrets.token_hex(8)
    canary.write_text(text)
    os.chmod(tmp_path, 0o777)
    os.chmod(canary, 0o666)
    listener = _Listener()
    os.environ["STEPCREDIT_TEST_SECRET"] = "hunter2-" + secrets.token_hex(8)
    try:
        results = {}
        for name in ("write_outside", "network_connect", "read_secrets", "fork_bomb"):
            src = (HOSTILE_DIR / f"{name}.py").read_text()
            src = src.replace("__CANARY__", str(canary)).replace("__PORT__", str(listener.port))
            src = src.replace("__SECRET_NAME__", "STEPCREDIT_TEST_SECRET")
            res, meta = vsf.utils.check_correctness(
                server.url, {"inputs": [""], "outputs": ["PWNED"]}, src, timeout=2
            )
            results[name] = (res[0], meta[0])
    finally:
        listener.close()
        os.environ.pop("STEPCREDIT_TEST_SECRET", None)
    for name, (res, meta) in results.items():
        assert res is not True, (name, meta)
        assert "PWNED" not in (meta["stdout"] or ""), (name, meta)
    assert results["read_secrets"][1]["stdout"].strip() == "nothing"
    assert results["write_outside"][0] == -2 and results["network_connect"][0] == -2
    assert results["fork_bomb"][0] in (-2, -3)
    assert canary.read_text() == text
    assert listener.hits == []
    left = list(private_tempdir.glob("stepcredit-sbx-*"))  # this module's own temporary folder
    assert not left, f"host-side sandbox directories were left behind: {left}"


@pytest.mark.verl
def test_hung_program_times_out_without_blocking_others(server: SandboxServer) -> None:
    vsf = _verl()
    hung: dict[str, Any] = {}

    def run_hung() -> None:
        res, meta = vsf.utils.check_correctness(
            server.url, {"inputs": [""], "outputs": ["1"]}, "while True:\n    pass\n", timeout=4
        )
        hung["res"], hung["meta"], hung["t"] = res[0], meta[0], time.monotonic()

    t0 = time.monotonic()
    thread = threading.Thread(target=run_hung)
    thread.start()
    time.sleep(0.3)
    quick = [
        vsf.utils.check_correctness(server.url, {"inputs": ["5\n"], "outputs": ["25"]}, p, timeout=4)[0][0]
        for p in ("x = int(input())\nprint(x * x)\n", "print(1)\n")
    ]
    t_quick = time.monotonic()
    thread.join(30)
    assert quick == [True, False]
    assert hung["res"] == -3 and hung["meta"]["run_status"] == "TimeLimitExceeded"
    assert t_quick < hung["t"], "the quick programs waited for the hung one"
    assert hung["t"] - t0 >= 4.0


def _post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_server_limits_and_refusals(server: SandboxServer) -> None:
    big = json.dumps({"code": "print(1)\n" + "#" * (300 * 1024), "language": "python"}).encode()
    status, reply = _post(server.url, big)
    assert status == 413 and reply["status"] == "SandboxError"
    status, reply = _post(server.url, json.dumps({"code": "x", "language": "cpp"}).encode())
    assert status == 200 and reply["status"] == "SandboxError" and "Python only" in reply["message"]
    assert _post(server.url, b"not json")[0] == 400
    assert _post(server.url.replace("/run_code", "/nope"), b"{}")[0] == 404
    # the request's memory limit is honoured (up to the server's cap): 300 MB does not fit in 128
    hog = {
        "code": "x = bytearray(300 * 1024 * 1024)\nprint('ok')\n",
        "memory_limit_MB": 128,
        "run_timeout": 5,
    }
    status, reply = _post(server.url, json.dumps(hog).encode())
    assert reply["status"] == "Failed" and "MemoryError" in reply["run_result"]["stderr"]
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    with pytest.raises(UserError, match="--allow-remote"):
        SandboxServer("0.0.0.0", 0)


def test_cli_refuses_a_public_host_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from stepcredit.cli.main import main

    assert main(["serve", "sandbox", "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-remote" in err and err.startswith("stepcredit serve: error:")


# --------------------------------------------------------------------- our backend -> the server
PROGRAMS = [
    # (response, ground truth): stdio, fn_name (TACO and Sandbox Fusion forms), asserts known in
    # advance, a conversational assert (replayed), LeetCode classes, crash, wrong, hang, no code
    ("a, b = map(int, input().split())\nprint(a + b)\n", {"inputs": ["1 2", "3 4"], "outputs": ["3", "7"]}),
    ("a, b = map(int, input().split())\nprint(a - b)\n", {"inputs": ["1 2", "3 0"], "outputs": ["3", "3"]}),
    (
        "def add(a, b):\n    return a + b\n",
        {"fn_name": "add", "inputs": [[1, 2], "3\n4"], "outputs": [3, "7"]},
    ),
    (
        "class Solution:\n    def twice(self, x):\n        return [x, x]\n",
        {"fn_name": "twice", "inputs": [[2]], "outputs": [[2, 2]]},
    ),
    (
        "def f(x):\n    return x * 2\n",
        ["assert f(2) == 4", "assert f(3) == 7", "assert [f(i) for i in range(3)] == [0, 2, 4]"],
    ),
    (
        "class Stack:\n    def __init__(self):\n        self.s = []\n    def push(self, x):\n        self.s.append(x)\n"
        "    def top(self):\n        return self.s[-1]\n",
        ["s = Stack()\ns.push(4)\ns.push(5)\nassert s.top() == 5"],
    ),
    ("def f(x):\n    raise KeyError(x)\n", ["assert f(1) == 1"]),
    ("import sys\nsys.exit(3)\n", {"inputs": [""], "outputs": [""]}),
    ("while True:\n    pass\n", {"inputs": ["1"], "outputs": ["1"]}),
    ("print('x' * 5000)\n", {"inputs": [""], "outputs": ["x"]}),
    (None, {"inputs": [""], "outputs": ["1"]}),
]


def _samples() -> tuple[list[Sample], list[str]]:
    samples = [
        Sample(prompt=(), ground_truth=gt, data_source="code", uid=f"p{i}")
        for i, (_, gt) in enumerate(PROGRAMS)
    ]
    responses = [_fenced(code) if code is not None else "no code here" for code, _ in PROGRAMS]
    return samples, responses


def _key(r: Any) -> tuple[Any, ...]:
    return (r.score, r.status, [c["status"] for c in r.info.get("cases", [])])


def test_backend_scores_equal_the_local_sandbox(server: SandboxServer) -> None:
    limits = {"timeout_s": 2.0, "output_limit_kb": 4}
    local = build_rewarder(RewardConfig(sandbox=SandboxConfig(**limits)))
    remote_cfg = SandboxConfig(**limits, backend="sandbox_fusion", url=server.url)
    remote = build_rewarder(RewardConfig(sandbox=remote_cfg))
    samples, responses = _samples()
    before = server.served
    with local, remote:
        a = remote.score_batch(samples, responses)
        b = local.score_batch(samples, responses)
        probe = probe_routes(remote, samples[:1])  # the start-up check goes through the service
    assert [_key(r) for r in a] == [_key(r) for r in b]
    assert [r.score for r in a] == [1.0, 0.5, 1.0, 1.0, 2 / 3, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert {r.status for r in a} >= {
        Status.OK,
        Status.PROGRAM_ERROR,
        Status.PROGRAM_TIMEOUT,
        Status.UNPARSEABLE,
    }
    assert all(r.source == "code" for r in a)
    assert probe["code"].score == 1.0
    assert server.served > before + 10  # the programs did go to the server


def test_backend_extra_answers_fail_as_locally(
    server: SandboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A program that knows the answer marker (here: a fixed one) and prints an extra answer fails the
    # case, as one writing on the local runner's answer channel does; it can never pass a wrong f.
    from stepcredit.sandbox import fusion

    monkeypatch.setattr(fusion.secrets, "token_hex", lambda n: "f" * (2 * n))
    forger = "print('\\n\\x1e' + 'f' * 16 + ':{\"v\": 4}')\ndef f(x):\n    return 5\n"
    cfg = SandboxConfig(backend="sandbox_fusion", url=server.url)
    res = sb.score_code(_fenced(forger), ["assert f(2) == 4"], sandbox=FusionSandbox(cfg))
    assert res.score == 0.0 and res.info["cases"][0]["status"] == "failed"
    assert "answer channel" in res.info["cases"][0]["message"]


def test_service_down_or_silent_is_a_sandbox_error_not_a_zero() -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now
    cfg = SandboxConfig(backend="sandbox_fusion", url=f"http://127.0.0.1:{port}/run_code", retries=1)
    res = sb.score_code(_fenced("print(1)\n"), {"inputs": [""], "outputs": ["1"]}, sandbox=FusionSandbox(cfg))
    assert res.status == Status.SANDBOX_ERROR and math.isnan(res.score)
    assert str(port) in res.info["message"]
    # a service that accepts and never answers: the request's deadline really stops the wait
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/run_code"
    try:
        ex = FusionSandbox(SandboxConfig(backend="sandbox_fusion", url=url, request_timeout_s=1.0))
        t0 = time.monotonic()
        outs = ex.run_program("print(1)\n", sb.parse_tests({"inputs": [""], "outputs": ["1"]}))
        # the service never answers: only the 1 s deadline ends the wait (10x its quiet time)
        assert time.monotonic() - t0 < 10.0
        assert outs[0].status == sb.SANDBOX_ERROR and "no reply within 1 s" in outs[0].message
    finally:
        silent.close()
    # the start-up check names the route and the service
    rw = build_rewarder(RewardConfig(sandbox=cfg))
    with rw, pytest.raises(RewardBackendError, match=re.escape(f"127.0.0.1:{port}")):
        probe_routes(
            rw, [Sample(prompt=(), ground_truth={"inputs": [""], "outputs": ["1"]}, data_source="code")]
        )


def test_a_failed_probe_is_retried_later(server: SandboxServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepcredit.sandbox import fusion

    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{dead.getsockname()[1]}/run_code"
    dead.close()
    ex = FusionSandbox(SandboxConfig(backend="sandbox_fusion", url=url, retries=0))
    assert "SandboxFusion service at" in (ex.unavailable() or "")
    ex.url = server.url  # the service comes back (here: at another address)
    assert ex.unavailable() is not None  # a failure stands for a while...
    monkeypatch.setattr(fusion, "REPROBE_S", 0.0)
    time.sleep(0.01)
    assert ex.unavailable() is None  # ...then the service is asked again


def test_backend_config_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"reward\.sandbox\.url"):
        SandboxConfig(backend="sandbox_fusion")
    with pytest.raises(ConfigError, match=r"reward\.sandbox\.backend"):
        SandboxConfig(backend="docker")


# ------------------------------------------------------------------------- a training run through it
@pytest.mark.slow
def test_multidomain_train_run_through_the_server(
    server: SandboxServer, tmp_path: Path, tiny_train: list[str]
) -> None:
    from stepcredit.cli.main import main

    tiny = [*tiny_train, "data.train_size=32", "sft.steps=2", "trainer.steps=2", "trainer.val_every=0"]
    tiny.append("trainer.save_every=0")
    # The wiring: the start-up probe goes through the service and the code domain's metrics come out
    # with no sandbox_error. (A model this small writes no fenced code yet, so equal scores on executed
    # programs are checked through the Rewarder above, not here.)
    fusion = ["reward.sandbox.backend=sandbox_fusion", f"reward.sandbox.url={server.url}"]
    before = server.served
    out = tmp_path / "run"
    assert main(["train", "--preset", "multidomain", "--out", str(out), *tiny, *fusion]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "code/reward/mean" in r]
    assert len(steps) >= 2
    for r in steps:
        assert isinstance(r["code/reward/mean"], float) and r["code/count"] > 0
        assert not r.get("code/status/sandbox_error")
    assert server.served > before
