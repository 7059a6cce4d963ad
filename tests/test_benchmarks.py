"""The benchmark harness: a run beside a busy process says it is not valid, and why; every script uses it.

No test here asserts ``"valid": true``: the machine running the tests may be busy.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _last_json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_record(out: dict) -> None:
    assert isinstance(out["valid"], bool)
    assert (out["reason"] is None) == out["valid"]
    load = out["load"]
    assert load["cpus"] >= 1 and load["windows"]
    for w in load["windows"]:
        assert {"side", "wall_s", "load1_before", "load1_after", "own_cores", "busy"} <= set(w)


def test_a_busy_process_beside_the_benchmark_makes_it_invalid() -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        cmd = [sys.executable, str(BENCH / "_harness.py"), "--json", "--repeats", "2", "--side-s", "0.3"]
        out = _last_json(subprocess.run(cmd, capture_output=True, text=True, timeout=120))
    finally:
        spinner.kill()
        spinner.wait()
    _check_record(out)
    assert out["valid"] is False
    assert f"(pid {spinner.pid})" in out["reason"]
    busy = [b for w in out["load"]["windows"] for b in w["busy"]]
    assert any(b["pid"] == spinner.pid and b["cores"] >= 0.1 for b in busy)
    assert set(out["settings"]) == {"a", "b"}
    assert out["a_loops"]["n"] == 2 and out["a_loops"]["min"] <= out["a_loops"]["median"]


def test_a_script_run_carries_the_load_record_both_settings_and_spread() -> None:
    cmd = [sys.executable, str(BENCH / "rollout.py"), "--json", "--prompts", "2", "--n", "2"]
    cmd += ["--new-tokens", "4", "--repeats", "1", "--threads", "1"]
    out = _last_json(subprocess.run(cmd, capture_output=True, text=True, timeout=300))
    _check_record(out)
    assert {"kv_cache_generate", "no_cache_generate"} <= set(out["settings"])
    assert out["generation_s"]["n"] == 1 and out["no_cache_s"]["n"] == 1
    sides = {w["side"] for w in out["load"]["windows"]}
    assert {"kv_cache_generate", "no_cache_generate"} <= sides


def test_every_benchmark_script_uses_the_harness() -> None:
    scripts = [f for f in BENCH.glob("*.py") if not f.name.startswith("_")]
    assert len(scripts) >= 10
    missing = [f.name for f in scripts if "from _harness import" not in f.read_text()]
    assert not missing, missing


def test_the_unisolated_runner_of_the_sandbox_benchmark_never_kills_every_process(tmp_path: Path) -> None:
    # outside a pid namespace the runner's kill(-1) would reach every process of the user
    sys.path.insert(0, str(BENCH))
    try:
        import sandbox as bench_sandbox  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCH))
    src = bench_sandbox.unisolated_runner_source(str(tmp_path / "work"), str(tmp_path / "solution.py"))
    assert "os.kill(-1" not in src and "os.kill(child, _SIGKILL)" in src
    assert '"/tmp"' not in src and "/box/" not in src
    compile(src, "runner_unisolated.py", "exec")


def test_the_async_bound_is_a_wall_time_every_schedule_needs() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import async_reward  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCH))
    # 4 steps: generation 0.5 s, update 0.5 s, reward wait 3 s; 2 s of the run outside the steps
    step = {"time/generation_s": 0.5, "time/update_s": 0.5, "time/reward_wait_s": 3.0}
    run = {"wall_s": 18.0, "steps": [dict(step) for _ in range(4)]}
    red, gt, rw = async_reward.ideal_reduction(run["steps"])
    # serial 16 s; two generate-and-score chains at a time need (4 * 3.5) / 2 = 7 s > sum(G+T) = 4 s
    assert (gt, rw) == (1.0, 3.0)
    assert red == 1 - 7 / 16
    # the 2 s outside the steps are paid by every schedule: the least wall time is 2 + 7 = 9 s
    assert async_reward.ideal_wall([run, {**run, "wall_s": 20.0}, {**run, "wall_s": 19.0}]) == 2 + 7 + 1
