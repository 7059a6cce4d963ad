"""Load-independent profiles behind the benchmarks' ratios (issue 48): CPU time, not wall time.

On a shared machine a wall-clock ratio moves with whatever else runs; the CPU time a thread or process
used does not count the time it waited for a core (``time.thread_time``, ``getrusage``,
``/proc/<pid>/task/<tid>/schedstat``: CPU, run-queue wait). Each subcommand measures one benchmark's
sides that way, so two commits can be compared on a busy machine (run it from each tree: ``git worktree
add /tmp/old <commit>`` and ``cd /tmp/old && PYTHONPATH=src python benchmarks/_profile.py ...``).

    python benchmarks/_profile.py step --model DIR [--steps 3] [--sides flat,tree]
        per training step of process_cost's sides: main-thread CPU of the rollout and of the update,
        voluntary context switches (waits) and each decode pass's shape and CPU
    python benchmarks/_profile.py agent [--backend thread] [--requests 20000] [--reps 4]
        CPU microseconds per request of the reward agent (this process and its workers), with the
        main thread's CPU / run-queue wait / idle split and the garbage collector's time
    python benchmarks/_profile.py sandbox [--programs 12] [--cases 8]
        CPU per program of the bare subprocess.run, the runner without isolation and the sandbox
        (this process and its children), and the children's page faults
    python benchmarks/_profile.py advantages [--threads 1]
        CPU of ours and verl's reinforce_pp / gae / grpo at 1024x4096 (needs verl: .venv-verl)

A helper, not a benchmark: it prints profiles, never a ratio for the README.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _rusage() -> tuple[float, float, int]:
    """(CPU seconds of this process, of its reaped children, children's minor page faults)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime, c.ru_minflt


def _schedstat() -> dict[str, tuple[float, float]]:
    """Per thread of this process: (CPU seconds, seconds waited on a run queue)."""
    out = {}
    for d in Path("/proc/self/task").iterdir():
        try:
            cpu, wait, _ = (int(x) for x in (d / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue
        out[d.name] = (cpu / 1e9, wait / 1e9)
    return out


# ------------------------------------------------------------------------------ step
def profile_step(a: argparse.Namespace) -> None:
    import torch

    import process_cost as pc
    import stepcredit.rollout.engines.hf as hf
    import stepcredit.trainer.loop as loop
    from stepcredit.cli.common import apply_overrides, load_preset, setup_runtime
    from stepcredit.config import from_dict

    setup_runtime()
    torch.set_num_threads(1)
    phases: list[tuple[str, float, float, int]] = []
    decodes: list[tuple[tuple[int, ...], int, float]] = []

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def g(*args: Any, **kw: Any) -> Any:
            r0 = resource.getrusage(resource.RUSAGE_THREAD)
            c0, w0 = time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                vol = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - r0.ru_nvcsw
                phases.append((name, time.thread_time() - c0, time.perf_counter() - w0, vol))

        return g

    loop.rollout_and_submit = wrap("rollout", loop.rollout_and_submit)  # type: ignore[attr-defined]
    loop.train_on = wrap("update", loop.train_on)  # type: ignore[assignment]
    decode = hf.decode

    def timed_decode(model: Any, ids: Any, mask: Any, **kw: Any) -> Any:
        c0 = time.thread_time()
        out = decode(model, ids, mask, **kw)
        decodes.append((tuple(ids.shape), int(out.shape[1]), time.thread_time() - c0))
        return out

    hf.decode = timed_decode  # type: ignore[assignment]
    base = load_preset(a.preset)
    common = [
        f"model.path={a.model}", "sft.steps=0", f"trainer.steps={a.steps}", "trainer.val_every=0",
        "trainer.save_every=0", "trainer.progress=false", "trainer.tensorboard=false", "trainer.threads=1",
        *a.overrides,
    ]  # fmt: skip
    for side in a.sides.split(","):
        phases.clear()
        decodes.clear()
        cfg = from_dict(apply_overrides(copy.deepcopy(base), [*common, *pc.TREE_SIDES[side]]))
        with tempfile.TemporaryDirectory() as d:
            loop.train(cfg, Path(d))
        print(f"== {side}")
        for name, cpu, wall, vol in phases:
            print(f"  {name:<8} CPU {cpu:7.3f} s   wall {wall:7.3f} s   voluntary switches {vol}")
        for shape, t, cpu in decodes:
            print(f"  decode rows x context {shape}, {t} steps: CPU {cpu:.3f} s")
        per = {n: statistics.mean(c for m, c, _, _ in phases[2:] if m == n) for n in ("rollout", "update")}
        print(
            f"  mean CPU per step after the first: rollout {per['rollout']:.3f} s, update {per['update']:.3f} s"
        )


# ------------------------------------------------------------------------------ agent
def profile_agent(a: argparse.Namespace) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import agent_throughput as at
    from _harness import _own, _proc_table
    from stepcredit.config import AgentConfig, RewardConfig, RewardCustomConfig
    from stepcredit.reward import build_agent

    tmp = tempfile.mkdtemp()
    (Path(tmp) / "fn.py").write_text(at.FN)
    sys.path.insert(0, tmp)
    cfg = RewardConfig(
        custom=RewardCustomConfig(path=f"{tmp}/fn.py:compute_score"), agent=AgentConfig(backend=a.backend)
    )
    gc_s = [0.0, 0.0]

    def on_gc(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            gc_s[1] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - gc_s[1]

    gc.callbacks.append(on_gc)

    def workers_cpu() -> float:
        t = _proc_table()
        return sum(t[p][2] for p in _own(t) if p != os.getpid())

    me = str(threading.get_native_id())
    with build_agent(cfg) as agent:
        agent.warmup()
        s, t, g = at.batch(2048, seed=1)
        list(agent.stream(agent.submit_samples(s, t, g), 256))
        for rep in range(a.reps):
            s, t, g = at.batch(a.requests, seed=0)
            gc_s[0] = 0.0
            s0, c0, w0, p0 = _schedstat(), workers_cpu(), time.perf_counter(), time.process_time()
            for _ in agent.stream(agent.submit_samples(s, t, g), 256):
                pass
            wall, s1 = time.perf_counter() - w0, _schedstat()
            cpu = time.process_time() - p0 + workers_cpu() - c0
            mc, mw = (s1[me][i] - s0[me][i] for i in (0, 1))
            print(
                f"batch {rep + 1}: {1e6 * cpu / a.requests:.2f} us CPU per request (CPU-bound rate "
                f"{a.requests / cpu:,.0f}/s); wall {wall:.3f} s = main thread CPU {mc:.3f} + run-queue wait "
                f"{mw:.3f} + idle {wall - mc - mw:.3f}; gc {gc_s[0]:.3f} s"
            )


# ------------------------------------------------------------------------------ sandbox
def profile_sandbox(a: argparse.Namespace) -> None:
    import subprocess

    import sandbox as sb
    from stepcredit.config import SandboxConfig

    progs = sb.make_programs(a.cases)
    box = sb.Sandbox(SandboxConfig(concurrency=1))  # the benchmark's own sandbox (wherever it lives)
    plain = sb.UnisolatedSandbox(SandboxConfig(concurrency=1))
    tmp = tempfile.mkdtemp()
    files = {}
    for name, code, _ in progs:
        files[name] = os.path.join(tmp, name + ".py")
        Path(files[name]).write_text(code)

    def bare(job: Any) -> None:
        for c in job[2]:
            cmd = [box._python, "-I", "-S", "-B", files[job[0]]]
            subprocess.run(cmd, input=c.stdin.encode(), capture_output=True, timeout=10)

    runners: dict[str, Callable[[Any], Any]] = {
        sb.BARE: bare,
        sb.PLAIN: lambda job: plain.check(job[1], job[2]),
        sb.BOX: lambda job: box.check(job[1], job[2]),
    }
    for name, fn in runners.items():
        for job in progs:
            fn(job)
        r0 = _rusage()
        for i in range(a.programs):
            fn(progs[i % len(progs)])
        r1 = _rusage()
        own, kids, flt = ((r1[i] - r0[i]) / a.programs for i in range(3))
        print(
            f"{name:<26} per program of {a.cases} cases: CPU here {1e3 * own:6.1f} ms, children "
            f"{1e3 * kids:6.1f} ms, total {1e3 * (own + kids):6.1f} ms; children's page faults {flt:,.0f}"
        )


# ------------------------------------------------------------------------------ advantages
def profile_advantages(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(a.threads)
    import advantages as adv
    from stepcredit.advantages import ESTIMATORS, hparams
    from stepcredit.config import AlgorithmConfig
    from stepcredit.runtime import keep_freed_memory

    keep_freed_memory()
    hp = hparams(AlgorithmConfig(gamma=adv.GAMMA, lam=adv.LAM, process_weight=0.5))
    d = adv.make_batch(1024, 4096)

    def cpu_ms(fn: Callable[[], Any], n: int) -> float:
        fn()
        xs = []
        for _ in range(n):
            c0 = time.process_time()
            fn()
            xs.append(time.process_time() - c0)
        return 1e3 * statistics.median(xs)

    for name, inp, verl_fn in adv.cases(d):
        if verl_fn is None:
            continue
        fn = ESTIMATORS.get(name).fn

        def ours(fn: Callable[..., Any] = fn, inp: Any = inp) -> None:
            with torch.no_grad():
                fn(inp, **hp)

        o, v = cpu_ms(ours, 7), cpu_ms(verl_fn, 3)
        print(
            f"{name:<22} 1024x4096, {a.threads} thread(s): CPU ours {o:8.2f} ms, verl {v:8.2f} ms: {v / o:5.1f}x"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("step")
    s.add_argument("--model", required=True, help="a saved SFT model of the preset")
    s.add_argument("--preset", default="midchain_process")
    s.add_argument("--steps", type=int, default=3)
    s.add_argument("--sides", default="flat,tree")
    s.add_argument("overrides", nargs="*", default=[
        "process.value_estimator=forced_answer_logprob", "algorithm.advantage=grpo_process"])  # fmt: skip
    g = sub.add_parser("agent")
    g.add_argument("--backend", default="thread")
    g.add_argument("--requests", type=int, default=20_000)
    g.add_argument("--reps", type=int, default=4)
    x = sub.add_parser("sandbox")
    x.add_argument("--programs", type=int, default=12)
    x.add_argument("--cases", type=int, default=8)
    v = sub.add_parser("advantages")
    v.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    {
        "step": profile_step,
        "agent": profile_agent,
        "sandbox": profile_sandbox,
        "advantages": profile_advantages,
    }[a.what](a)


if __name__ == "__main__":
    main()
