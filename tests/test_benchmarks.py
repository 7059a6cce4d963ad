"""The benchmark harness: a run beside a busy process says it is not valid, and why; every script uses it.

No test here asserts ``"valid": true``: the machine running the tests may be busy.
"""

from __future__ import annotations

import json
import os
import signal
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
        assert {"side", "wall_s", "load1_before", "load1_after", "own_cores", "other_cores", "busy"} <= set(w)


def test_many_short_lived_processes_beside_the_benchmark_make_it_invalid() -> None:
    # no single process lives through a side, so only the machine's whole CPU use shows them
    churn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys\nwhile True: subprocess.run(['sh', '-c', 'i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done'])",
        ]
    )
    try:
        time.sleep(0.3)
        cmd = [sys.executable, str(BENCH / "_harness.py"), "--json", "--repeats", "2", "--side-s", "0.5"]
        out = _last_json(subprocess.run(cmd, capture_output=True, text=True, timeout=120))
    finally:
        churn.kill()
        churn.wait()
    _check_record(out)
    assert out["valid"] is False
    assert max(w["other_cores"] for w in out["load"]["windows"]) > 0.3, out["load"]["windows"]


def test_a_lagging_load_average_is_no_verdict() -> None:
    # a quiet side after the benchmark's own busy one: the 1-minute load average still says 3, the
    # machine's CPU time says nothing else ran (the verdict that marked shared_machine.py's runs invalid)
    sys.path.insert(0, str(BENCH))
    try:
        import _harness  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCH))
    mon = _harness.Monitor(probe_s=0)
    quiet = {"side": "alone", "wall_s": 10.0, "load1_before": 3.4, "load1_after": 2.9, "own_cores": 1.2}
    mon.windows = [{**quiet, "foreign_cores": 0.0, "other_cores": 0.05, "busy": []}]
    assert mon.reasons() == []
    mon.windows = [{**quiet, "foreign_cores": 0.0, "other_cores": 0.9, "busy": []}]
    assert "0.90 cores beyond" in mon.reasons()[0]


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


def test_an_own_process_that_ends_outside_the_tree_is_own_cpu_not_the_machines() -> None:
    """A process the run started that leaves its tree and ends inside a side without a mark the side's
    end can read (as Ray's workers orphaned at ray.shutdown: a zombie whose environment is gone, or
    reaped by init): the sampler saw it as own, so its CPU time counts as the benchmark's own."""
    sys.path.insert(0, str(BENCH))
    try:
        import _harness  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCH))
    mon = _harness.Monitor(probe_s=0, sample_s=0.05)
    unmarked = {k: v for k, v in os.environ.items() if not k.startswith("STEPCREDIT_BENCH_")}
    # 1.5 s of CPU, however slow the machine: a busy machine may delay the sampler's last look by a few
    # intervals (0.6 s failed once beside a loaded CI run), never by most of the spinner's life
    spin = "import time\nwhile time.process_time() < 1.5: pass"
    assert mon.sampler is not None
    try:
        with mon.side("orphan") as rec:
            # through a shell that exits once the sampler has seen its child: the spinner is then
            # nobody's child here any more
            shell = subprocess.Popen(
                ["sh", "-c", f'{sys.executable} -c "$SPIN" >/dev/null 2>&1 & echo $!; read x'],
                env={**unmarked, "SPIN": spin},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert shell.stdout is not None and shell.stdin is not None
            orphan = int(shell.stdout.readline())
            mon.sampler.look()  # what the sampling thread does every sample_s
            shell.stdin.close()
            shell.wait()
            end = time.monotonic() + 120
            while not _harness._zombie(orphan) and time.monotonic() < end:  # gone, or a zombie
                time.sleep(0.05)
    finally:
        mon.sampler.stop()
    assert _harness._zombie(orphan), "the spinner did not end"
    # the spinner's 1.5 s less what ran after the sampler's last look; without the sampler ~0
    assert rec["own_cores"] * rec["wall_s"] >= 0.75, rec
    assert orphan not in {b["pid"] for b in rec["busy"]}


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
    # guard.py is not a benchmark: it runs the others and reads their JSON
    scripts = [f for f in BENCH.glob("*.py") if not f.name.startswith("_") and f.name != "guard.py"]
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
    src = bench_sandbox.unisolated_runner_source(str(tmp_path / "work"))
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


# ------------------------------------------------------------------------------ the benchmark guard
def _guard():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    try:
        import guard  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCH))
    return guard


def test_guard_picks_ratios_by_dotted_path_and_list_selector() -> None:
    g = _guard()
    obj = {
        "gsm8k": {"all": {"speedup": 30.5}},
        "results": [
            {"estimator": "grpo", "shape": "1024x4096", "speedup": 3.0},
            {"estimator": "reinforce_pp", "shape": "256x1024", "speedup": 9.0},
            {"estimator": "reinforce_pp", "shape": "1024x4096", "speedup": 18.4},
        ],
        "valid": True,
    }
    assert g.pick(obj, "gsm8k.all.speedup") == 30.5
    assert g.pick(obj, "results[estimator=reinforce_pp,shape=1024x4096].speedup") == 18.4
    assert g.pick(obj, "results[estimator=gae].speedup") is None  # no such row
    assert g.pick(obj, "math500.all.speedup") is None
    assert g.pick(obj, "valid") is None  # a bool is not a figure
    assert g.last_json("table\n\n" + json.dumps(obj) + "\n") == obj
    assert g.last_json("no json here") is None


def test_guard_counts_its_runs_processes_as_own_even_after_they_leave_the_tree() -> None:
    """A process a benchmark run left behind (as Ray's workers outlive ray.shutdown, re-parented to
    init) carries the guard's mark and is not foreign; a busy process without it is."""
    g = _guard()
    spin = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"
    env = {**os.environ, g.GUARD_ENV: g.GUARD_MARK}
    # started through a shell that exits at once: the spinner is nobody's child here any more
    shell = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "$SPIN" >/dev/null 2>&1 & echo $!'],
        env={**env, "SPIN": spin},
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = int(shell.stdout.strip())
    foreign = subprocess.Popen([sys.executable, "-c", spin])  # a child of this process, unmarked
    try:
        time.sleep(0.3)
        w = g.probe(1.0)
    finally:
        foreign.kill()
        foreign.wait()
        os.kill(orphan, signal.SIGKILL)
    busy = {b["pid"] for b in w["busy"]}
    assert foreign.pid in busy, w
    assert orphan not in busy, w
    assert w["foreign_cores"] >= 0.1


def _hist(name: str, *runs: tuple[bool, list[float]]) -> list[dict]:
    return [
        {"commit": f"c{i}", "valid": ok, "ratios": {name: {"values": v, "median": sorted(v)[len(v) // 2]}}}
        for i, (ok, v) in enumerate(runs)
    ]


def test_guard_flags_a_move_only_beyond_the_run_to_run_spread() -> None:
    g = _guard()
    r = g.Ratio("verifier.gsm8k_speedup", "gsm8k.all.speedup", goal=30.0)
    # valid records' ranges 2.0, 0.6, 1.0 -> typical spread (median) 1.0; the invalid record's range 10
    # and the single-value record do not count
    hist = _hist(
        r.name, (True, [29.0, 31.0]), (True, [30.0, 30.6]), (False, [20.0, 30.0]), (True, [29.5, 30.5])
    )
    hist += _hist(r.name, (True, [30.0]))
    assert g.historical_spread(hist, r.name) == 1.0
    # medians 29.3 vs 30.05: -0.75 is within the spread max(0.2, 0.1, 1.0) = 1.0
    steady = g.moved(r, [29.2, 29.4], [30.0, 30.1], reference_from="base x", history=hist)
    assert not steady.moved and steady.spread == 1.0 and steady.meets_goal is False
    # 27.1 vs 30.05: -2.95 beyond 1.0, downwards on a higher-is-better ratio: slipped
    slip = g.moved(r, [27.0, 27.2], [30.0, 30.1], reference_from="base x", history=hist)
    assert slip.moved and not slip.better and "SLIPPED" in slip.line() and "NOT MET" in slip.line()
    # a wide head range is its own spread: 27.1 -> 30.05 with head [25, 35] is within max range 10
    noisy = g.moved(r, [25.0, 35.0], [30.0, 30.1], reference_from="base x", history=hist)
    assert not noisy.moved
    # lower is better (a cost ratio): 1.2 -> 2.0 is a slip, 2.0 -> 1.2 an improvement that meets 1.2
    cost = g.Ratio("process_cost.tree_vs_flat", "tree_vs_flat", higher_is_better=False, goal=1.2)
    up = g.moved(cost, [1.9, 2.1], [1.19, 1.21], reference_from="base x", history=[])
    down = g.moved(cost, [1.19, 1.21], [1.9, 2.1], reference_from="base x", history=[])
    assert up.moved and not up.better and down.moved and down.better and down.meets_goal
    # one value a side and no history: no spread is known, so nothing is called moved
    once = g.moved(cost, [2.0], [1.2], reference_from="base x", history=[])
    assert not once.moved and not once.spread_known and "no spread known" in once.line()


def test_guard_compares_with_the_history_when_the_base_did_not_run() -> None:
    g = _guard()
    r = g.Ratio("fake.speedup", "speedup")
    suite = [g.Bench("fake", "fake.py", [], [r])]
    hist = _hist(r.name, (True, [4.0, 4.2]), (False, [9.0, 9.0]))
    hist[0]["commit"] = "older"
    hist[1]["commit"] = "invalid-run"
    moves = g.compare(suite, {r.name: [2.0, 2.1]}, {}, head_commit="head", base_commit=None, history=hist)
    assert len(moves) == 1 and moves[0].reference_from == "history older" and moves[0].moved
    assert moves[0].reference == [4.0, 4.2]
    # nothing valid to compare with: left out (the report says so)
    assert g.compare(suite, {r.name: [2.0]}, {}, head_commit="h", base_commit=None, history=hist[1:]) == []


FAKE_BENCH = """
import json, pathlib
here = pathlib.Path(__file__).parent
print("a fake benchmark")
print(json.dumps({"valid": True, "speedup": float((here / "speed.txt").read_text()), "steady": 3.0}))
"""


def test_guard_alternates_head_with_base_records_both_and_names_the_slip(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    g = _guard()
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "src").mkdir()
    (repo / "benchmarks" / "fake.py").write_text(FAKE_BENCH)

    def commit(speed: str, msg: str) -> str:
        (repo / "benchmarks" / "speed.txt").write_text(speed)
        env = {
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        }
        for cmd in (["add", "-A"], ["commit", "-qm", msg]):
            subprocess.run(
                ["git", "-C", str(repo), *cmd], check=True, env={**__import__("os").environ, **env}
            )
        return subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()

    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    base = commit("10.0", "fast")
    head = commit("5.0", "slow")
    suite = tmp_path / "suite.json"
    suite.write_text(
        json.dumps(
            [{"name": "fake", "script": "fake.py", "ratios": [
                {"name": "fake.speedup", "path": "speedup", "goal": 8.0},
                {"name": "fake.steady", "path": "steady"},
            ]}]
        )
    )  # fmt: skip
    history = tmp_path / "history.jsonl"
    args = ["--repo", str(repo), "--suite", str(suite), "--history", str(history), "--rounds", "2"]
    args += ["--probe-s", "0.1", "--allow-busy", "--max-foreign-cores", "1000"]
    assert g.main(args) == 0
    out = capsys.readouterr().out
    recs = [json.loads(line) for line in history.read_text().splitlines()]
    # one record per benchmarked commit, each with its two alternated rounds
    assert [(r["commit"], r["role"]) for r in recs] == [(head, "head"), (base, "base")]
    assert recs[0]["ratios"]["fake.speedup"]["values"] == [5.0, 5.0]
    assert recs[1]["ratios"]["fake.speedup"]["values"] == [10.0, 10.0]
    assert recs[0]["guard_run"] == recs[1]["guard_run"]
    # head and base alternate: head round 1, base round 1, head round 2, base round 2
    order = [line.split(" round")[0].split()[-1] for line in out.splitlines() if " round " in line]
    assert order == ["head", "base", "head", "base"]
    speed = next(line for line in out.splitlines() if line.startswith("fake.speedup"))
    assert "SLIPPED" in speed and "NOT MET" in speed
    assert "steady" in next(line for line in out.splitlines() if line.startswith("fake.steady"))
    assert "slipped: fake.speedup" in out
    # the base's worktree is gone again
    listed = subprocess.run(
        ["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert len(listed.strip().splitlines()) == 1
    # --fail-on-slip turns the slip into exit 1; a second run compares head with the same base again
    assert g.main([*args, "--fail-on-slip", "--no-record"]) == 1


def test_guard_refuses_a_busy_machine_and_records_nothing(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    g = _guard()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    history = tmp_path / "history.jsonl"
    try:
        time.sleep(0.3)
        # a spinning process uses about one core whatever else runs: far above half a core
        code = g.main(
            ["--history", str(history), "--probe-s", "1.0", "--max-foreign-cores", "0.5", "--no-base"]
        )
    finally:
        spinner.kill()
        spinner.wait()
    assert code == 3
    assert "REFUSED" in capsys.readouterr().out
    assert not history.exists()


def test_agent_throughput_says_when_its_ray_cluster_could_not_start(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The Ray figure names how it ran: a multi-node cluster, or one local node and why (no Ray is
    started here: the cluster fails and ray.init is a stub)."""
    import ray
    import ray.cluster_utils

    sys.path.insert(0, str(BENCH))
    try:
        import agent_throughput  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCH))

    class NoCluster:
        def __init__(self, *a, **k):  # type: ignore[no-untyped-def]
            raise OSError("no free port")

    inits: list[dict] = []
    monkeypatch.setattr(ray.cluster_utils, "Cluster", NoCluster)
    monkeypatch.setattr(ray, "init", lambda **kw: inits.append(kw))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    info, cluster = agent_throughput.ray_cluster(2, 1)
    assert cluster is None and info["nodes"] == 1 and info["cpus_per_node"] == 2
    assert "did not start" in info["how"] and "no free port" in info["how"]
    assert inits == [{"num_cpus": 2, "include_dashboard": False}]  # one node with both nodes' CPUs
