"""End to end: a broken reward backend stops a run with one line (exit 2) instead of training silently.

Both tests need the trainer's wiring of ``stepcredit.reward.run.health`` (``probe_routes`` after the
rewarder is built and before SFT; ``CircuitBreaker.update`` on every step's scored results).
"""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from stepcredit.cli.main import main

TINY = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.intermediate_size=64",
    "data.train_size=64",
    "data.val_size=4",
    "rollout.prompts_per_step=4",
    "rollout.n=2",
    "rollout.max_new_tokens=16",
    "trainer.threads=1",
    "trainer.progress=false",
    "trainer.tensorboard=false",
    "trainer.val_every=0",
    "trainer.save_every=0",
]


def _track_sft(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import stepcredit.trainer.loop as loop
    import stepcredit.trainer.sft as sft

    calls: list[int] = []
    real = sft.run_sft

    def tracked(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(sft, "run_sft", tracked)
    monkeypatch.setattr(loop, "run_sft", tracked, raising=False)
    return calls


def test_multidomain_without_bubblewrap_stops_before_sft(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k)
    )
    sft_calls = _track_sft(monkeypatch)
    out = tmp_path / "run"
    code = main(
        ["train", "--preset", "multidomain", "--out", str(out), *TINY, "sft.steps=2", "trainer.steps=1"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and "'code'" in err[0] and "bubblewrap" in err[0], err
    assert sft_calls == [], "the run reached SFT with a broken sandbox"


class FlakyJudge:
    """A chat endpoint that answers ``Score: 5`` to its first ``good`` requests, then HTTP 500."""

    def __init__(self, good: int) -> None:
        self.seen = 0
        lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    outer.seen += 1
                    ok = outer.seen <= good
                data = json.dumps({"choices": [{"message": {"content": "Score: 5"}}]}).encode()
                self.send_response(200 if ok else 500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data) if ok else 0))
                self.end_headers()
                if ok:
                    self.wfile.write(data)

            def log_message(self, *a: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_judge_failing_mid_run_stops_at_the_breaker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = FlakyJudge(good=9)  # the start-up probe and the first steps' arith rows, then 500s
    out = tmp_path / "run"
    args = [
        *TINY,
        "sft.steps=2",
        "trainer.steps=8",
        "reward.domains.arith.fn=judge",
        f"reward.judge.base_url={judge.url}",
        "reward.judge.max_retries=0",
        "reward.judge.backoff_s=0.01",
        "reward.judge.deadline_s=10",
        "reward.breaker.window_steps=3",
        "reward.breaker.min_samples=4",
    ]
    try:
        code = main(["train", "--preset", "multidomain", "--out", str(out), *args])
    finally:
        judge.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and "reward source 'judge'" in err[0] and "error=" in err[0], err
    steps = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines() if r.strip()]
    assert 1 <= max(r.get("step", 0) for r in steps) < 8, "stopped mid-run, after some good steps"
