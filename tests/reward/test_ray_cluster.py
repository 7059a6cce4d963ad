"""A Ray cluster of two nodes on this machine (``ray start --head`` and ``ray start --address ...``) with
different resources: code-sandbox actors go only to the node that declares ``sandbox``, the user's
reward function runs on reward actors, the judge-like work stays on the driver, and killing the
sandbox node's actors loses no sample (each is replaced and its chunk re-submitted).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from stepcredit.config import AgentConfig, RewardConfig, RewardCustomConfig, RewardDomainConfig
from stepcredit.reward.run.rewarder import build_agent
from stepcredit.types import Sample, Status

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

RAY = str(Path(sys.executable).with_name("ray"))
FN = textwrap.dedent(
    """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
        return float(solution_str == ground_truth)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not shutil.which(RAY) and not Path(RAY).exists():
        pytest.skip("the ray command is not installed")
    if ray.is_initialized():
        ray.shutdown()
    tmp = tmp_path_factory.mktemp("ray")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    port = _free_port()
    address = f"127.0.0.1:{port}"
    common = ["--disable-usage-stats", "--num-gpus=0"]
    # Own session and temp dirs: other Ray instances on this machine are left alone, and ours are
    # stopped by killing exactly the processes of these sessions.
    head = [RAY, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false"]
    head += [f"--temp-dir={tmp}", '--resources={"head": 1}', *common]
    subprocess.run(head, check=True, env=env, capture_output=True, timeout=120)
    worker = [RAY, "start", f"--address={address}", "--num-cpus=1", '--resources={"sandbox": 2}', *common]
    subprocess.run(worker, check=True, env=env, capture_output=True, timeout=120)
    ray.init(address=address)
    try:
        end = time.monotonic() + 60
        while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < end:
            time.sleep(0.2)
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        assert len(nodes) == 2, nodes
        yield address, nodes, tmp
    finally:
        ray.shutdown()
        _stop_session(tmp)


def _stop_session(tmp: Path) -> None:
    """Kill the processes of the Ray sessions under ``tmp`` (``ray stop`` would stop every Ray on the machine)."""
    import psutil

    mine = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(str(tmp) in part for part in p.info["cmdline"] or []):
                mine.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for p in mine:
        p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(mine, timeout=3)
    for p in alive:
        p.kill()


def _code(i: int) -> tuple[Sample, str]:
    gt = json.dumps({"inputs": [f"{i}\n"], "outputs": [f"{i + 1}\n"]})
    right = "```python\nprint(int(input()) + 1)\n```"
    wrong = "```python\nprint(int(input()) + 2)\n```"
    sample = Sample(prompt=(), ground_truth=gt, data_source="code", domain="code", uid=f"c{i}")
    return sample, right if i % 2 == 0 else wrong


def test_sandbox_actors_only_where_the_resource_is_and_a_killed_node_loses_nothing(
    cluster: Any, tmp_path: Path
) -> None:
    address, nodes, _ = cluster
    sandbox_node = next(nid for nid, res in nodes.items() if res.get("sandbox"))
    fn = tmp_path / "fn.py"
    fn.write_text(FN)
    cfg = RewardConfig(
        custom=RewardCustomConfig(path=f"{fn}:compute_score"),  # every rule row but the code domain
        domains={"code": RewardDomainConfig(fn="code")},
        agent=AgentConfig(
            backend="ray",
            ray_address=address,
            max_concurrency=1,  # every actor start imports the reward stack (~2 s of CPU)
            ray_num_cpus=0.25,
            ray_scorers={"code": {"sandbox": 1}},
            ray_scorer_concurrency=2,
            batch_size=4,
            timeout_s=30,
            deadline_s=240,
            # a bound on a hang, not a speed: on 2 cores beside 2 busy processes an actor took over 60 s
            ray_startup_timeout_s=300,
        ),
    )
    code = [_code(i) for i in range(16)]
    plain = [(Sample(prompt=(), ground_truth=str(i % 3), uid=f"p{i}"), str(i % 2)) for i in range(400)]
    samples = [s for s, _ in code] + [s for s, _ in plain]
    texts = [t for _, t in code] + [t for _, t in plain]
    group_B = [i // 4 for i in range(len(samples))]
    with build_agent(cfg) as agent:
        agent.warmup()
        backend: Any = agent.backend
        assert set(backend.actor_nodes("code")) == {sandbox_node}  # placed by the custom resource
        first = {s.pid for s in backend.pools["code"].slots}

        ticket = agent.submit_samples(samples, texts, group_B)
        # Kill the sandbox node's actors while their chunks run: the chunks are re-submitted to
        # replacements (again on the sandbox node) and nothing is lost or scored twice.
        for pid in first:
            os.kill(pid, signal.SIGKILL)
        seen: list[int] = []
        for idx, results in agent.stream(ticket, 8):
            seen.extend(idx)
            for i, r in zip(idx, results, strict=True):
                assert r.status == Status.OK, (i, r)
                want = float(i % 2 == 0) if i < 16 else float((i - 16) % 2 == (i - 16) % 3)
                assert r.score == want, (i, r)
                assert r.source == ("code" if i < 16 else "custom")
        assert sorted(seen) == list(range(len(samples)))  # every sample exactly once
        now = {s.pid for s in backend.pools["code"].slots if s.actor is not None}
        assert now and not now & first  # replaced
        assert set(backend.actor_nodes("code")) == {sandbox_node}
        m = agent.metrics()
        assert m["agent/completed"] == len(samples) and m["agent/resubmits"] >= 1
        assert any(k.startswith("agent/node_completed/") for k in m)
        pids = backend.all_pids()
    end = time.monotonic() + 60  # that they die, not how fast (Ray took over 10 s on a loaded machine)
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "actors left behind"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
