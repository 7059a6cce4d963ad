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
    # 4 steps: generation 0.5 s, update 0.5 s, reward wait 3 s, each step 4 s; 2 s outside the steps
    step = {"time/generation_s": 0.5, "time/update_s": 0.5, "time/reward_wait_s": 3.0, "time/step_s": 4.0}
    run = {"wall_s": 18.0, "steps": [dict(step) for _ in range(4)]}
    # the critical path: G1 ends 0.5, R1 3.5; G2 (after G1) 1.0, R2 4.0; G3 waits for R1: 4.0, R3 7.0;
    # G4 waits for G3 and R2: 4.5, R4 7.5. Serial work sum(G+T) = 4 s is less: the bound is 7.5 s, and
    # it is never below the two chains' mean, sum(G+R)/2 = 7 s
    assert async_reward.least_steps_time(run["steps"]) == 7.5
    red, gt, rw = async_reward.ideal_reduction(run["steps"])
    assert (gt, rw) == (1.0, 3.0)
    assert red == 1 - 7.5 / 16
    # uneven rewards: the longer chain counts (R = 1, 5, 1, 5: the even steps' chain 0.5+5+0.5+5 plus
    # the first generation) where the old mean would say (4 * 0.5 + 12) / 2 = 7
    uneven = [{**step, "time/reward_wait_s": w} for w in (1.0, 5.0, 1.0, 5.0)]
    assert async_reward.least_steps_time(uneven) == 11.5
    # the time outside the steps is the pipelined run's own (its wall less its steps), paid by every
    # schedule: median of 2, 3 and 1 s, plus the steps' bound of the baseline runs
    piped = [{**run, "wall_s": 18.0}, {**run, "wall_s": 19.0}, {**run, "wall_s": 17.0}]
    assert async_reward.ideal_wall([run, run], piped) == 2 + 7.5
