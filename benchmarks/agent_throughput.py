"""Requests per second of the reward agent per backend, for a trivial reward, next to a direct loop.

The reward is what a new user writes first: ``reward.custom.path=fn.py:compute_score``, one string
comparison per sample. Per backend (``thread``, ``process``, ``ray`` on a local instance), with
default settings otherwise: one warm-up batch, then ``--requests`` samples (groups of 8) through
``agent.submit_samples`` + ``agent.stream(ticket, --pull)``, timed from submit to the last pull. The
same backends run again with ``reward.agent.chunk_s=0`` (one request per sample, the dispatch before
chunking) on ``--baseline-requests`` samples, so ``speedup`` is a ratio measured in this run. The
direct loop calls the function in this process, no agent. ``identical`` says whether every
per-request score equals the direct loop's. The set-up's garbage is collected before each timed batch
(``gc_s_in_timed``: the collector's time inside the timed window, from the batch's own allocations). The chunked and per-sample runs alternate (``--repeats``
rounds, medians with min/max) and the machine's load is recorded around each
(``benchmarks/_harness.py``; ``"valid": false`` says the figures cannot be trusted, and why).

Ray runs ``--ray-workers`` reward actors (``reward.agent.max_concurrency``) on a cluster of
``--ray-nodes`` nodes started on this machine with ``ray.cluster_utils.Cluster`` (one GCS, one raylet
per node, ``--ray-cpus-per-node`` CPUs each; each actor reserves an equal share of a node, so Ray's
scheduler has to place them on every node). Results come back through the object store across raylets,
as on a real cluster; what this machine cannot show is more cores: all nodes share its CPUs, so the
figure is the dispatch path's rate with a cluster's fan-out, not a cluster's throughput. The JSON's
``ray.cluster`` says which setting ran (``how``: a multi-node ``Cluster``, or one local node when the
cluster could not start, with the reason) and ``ray.completed_per_node`` where the requests of the last chunked run ran (its warm-up batch included).

    python benchmarks/agent_throughput.py [--json] [--requests 20000] [--backends thread,process,ray] [--repeats 3]
        [--ray-workers 4] [--ray-nodes 2] [--ray-cpus-per-node 1]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from _harness import SAMPLE_S, Monitor, emit, own_pids, spread, wait_own_exit
from stepcredit.config import AgentConfig, RewardConfig, RewardCustomConfig
from stepcredit.reward import build_agent
from stepcredit.types import Sample

FN = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(solution_str == ground_truth)
"""
GROUP = 8


def batch(n: int, seed: int) -> tuple[list[Sample], list[str], list[int]]:
    samples = [Sample(prompt=(), ground_truth=str((i * 7 + seed) % 10), uid=f"{seed}:{i}") for i in range(n)]
    texts = [str((i * 3 + seed) % 10) for i in range(n)]
    return samples, texts, [i // GROUP for i in range(n)]


def ray_cluster(nodes: int, cpus: int) -> tuple[dict[str, Any], Any]:
    """Start ``nodes`` Ray nodes of ``cpus`` CPUs on this machine and connect to them: (what ran, the
    cluster to shut down or None). One local node of ``nodes * cpus`` CPUs when the cluster cannot
    start (the reason is in ``how``)."""
    import ray

    try:
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "include_dashboard": False})
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=cpus)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        alive = [n for n in ray.nodes() if n.get("Alive")]
        how = f"ray.cluster_utils.Cluster: {len(alive)} raylets on this machine, one GCS"
        return {
            "nodes": len(alive),
            "cpus_per_node": cpus,
            "how": how,
            "simulated_on_one_machine": True,
        }, cluster
    except Exception as e:  # a cluster is not always possible (ports, shared memory): say so
        with contextlib.suppress(Exception):
            ray.shutdown()
        ray.init(num_cpus=nodes * cpus, include_dashboard=False)
        how = f"one local node (a {nodes}-node cluster did not start: {type(e).__name__}: {str(e)[:200]})"
        return {"nodes": 1, "cpus_per_node": nodes * cpus, "how": how, "simulated_on_one_machine": True}, None


def run(
    path: str, backend: str, n: int, pull: int, chunk_s: float | None, agent: dict[str, Any] | None = None
) -> tuple[float, list[float], dict[str, float]]:
    agent_kw: dict[str, Any] = {"backend": backend, **(agent or {})}
    if chunk_s is not None:
        agent_kw["chunk_s"] = chunk_s
    cfg = RewardConfig(custom=RewardCustomConfig(path=path), agent=AgentConfig(**agent_kw))
    with build_agent(cfg) as agent:
        agent.warmup()
        s, t, g = batch(min(n, 2048), seed=1)
        list(agent.stream(agent.submit_samples(s, t, g), pull))  # warm-up: workers, imports, chunk sizes
        agent.metrics()
        s, t, g = batch(n, seed=0)
        # The garbage of the set-up (the warm-up, the agent, the batch just built) is collected before
        # the clock starts: a full collection that the set-up's allocations make due would otherwise
        # land in the timed window or not depending on how many objects came before (issue 48's
        # profile: one gen-2 collection took 0.1-0.3 s of CPU, 1-3x the whole 20,000-request batch).
        # Collections that the timed batch's own allocations trigger still count (gc_s says how long).
        gc.collect()
        gc_s = [0.0, 0.0]

        def on_gc(phase: str, _info: dict[str, Any]) -> None:
            if phase == "start":
                gc_s[1] = time.perf_counter()
            else:
                gc_s[0] += time.perf_counter() - gc_s[1]

        gc.callbacks.append(on_gc)
        try:
            t0 = time.perf_counter()
            ticket = agent.submit_samples(s, t, g)
            scores = [0.0] * n
            for idx, results in agent.stream(ticket, pull):
                for i, r in zip(idx, results, strict=True):
                    scores[i] = r.score
            dt = time.perf_counter() - t0
        finally:
            gc.callbacks.remove(on_gc)
        m = {**agent.metrics(), "gc_s": gc_s[0]}
    return dt, scores, m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    ap.add_argument("--requests", type=int, default=20_000, help="samples per timed batch (chunked)")
    ap.add_argument("--baseline-requests", type=int, default=5_000, help="samples per batch with chunk_s=0")
    ap.add_argument("--pull", type=int, default=256, help="samples per stream pull (whole groups)")
    ap.add_argument("--backends", default="thread,process,ray")
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds of chunked / per-sample runs")
    ap.add_argument(
        "--ray-workers", type=int, default=4, help="Ray reward actors (reward.agent.max_concurrency)"
    )
    ap.add_argument(
        "--ray-nodes", type=int, default=2, help="Ray nodes started on this machine (1: one node)"
    )
    ap.add_argument("--ray-cpus-per-node", type=int, default=1, help="CPUs each Ray node declares")
    args = ap.parse_args(argv)
    if args.ray_workers < 1 or args.ray_nodes < 1 or args.ray_cpus_per_node < 1:
        ap.error("--ray-workers, --ray-nodes and --ray-cpus-per-node must be >= 1")

    with tempfile.TemporaryDirectory() as tmp:
        fn = Path(tmp) / "fn.py"
        fn.write_text(FN)
        sys.path.insert(0, tmp)
        from fn import compute_score  # type: ignore[import-not-found]

        mon = Monitor(sample_s=SAMPLE_S)  # Ray's workers outlive ray.shutdown (the harness's sampler)
        s, t, _ = batch(args.requests, seed=0)
        t_direct, direct = mon.timed(
            "direct loop",
            lambda: [
                compute_score(x.data_source, r, x.ground_truth, x.extra_info)
                for x, r in zip(s, t, strict=True)
            ],
        )
        out: dict[str, Any] = {"requests": args.requests, "direct_per_s": round(args.requests / t_direct, 1)}
        base_n = args.baseline_requests
        path = f"{fn}:compute_score"
        cluster: Any = None
        for backend in args.backends.split(","):
            extra: dict[str, Any] = {}
            if backend == "ray":
                before_ray = own_pids(mon.marks)
                out["ray_cluster"], cluster = ray_cluster(args.ray_nodes, args.ray_cpus_per_node)
                # an equal share of a node per actor: the scheduler must use every node
                per_node = -(-args.ray_workers // out["ray_cluster"]["nodes"])
                extra = {
                    "max_concurrency": args.ray_workers,
                    "ray_num_cpus": out["ray_cluster"]["cpus_per_node"] / per_node,
                }
            runs = mon.alternate(
                {
                    f"{backend} chunked": lambda b=backend, x=extra: run(
                        path, b, args.requests, args.pull, None, x
                    ),
                    f"{backend} per-sample": lambda b=backend, x=extra: run(
                        path, b, base_n, args.pull, 0.0, x
                    ),
                },
                repeats=args.repeats,
            )
            chunked = [args.requests / dt for dt, _, _ in runs[f"{backend} chunked"]]
            single = [base_n / dt for dt, _, _ in runs[f"{backend} per-sample"]]
            m = runs[f"{backend} chunked"][-1][2]
            out[backend] = {
                "per_s": round(statistics.median(chunked), 1),
                "per_sample_dispatch_per_s": round(statistics.median(single), 1),
                "speedup": round(statistics.median(chunked) / statistics.median(single), 2),
                "identical": all(sc == direct for _, sc, _ in runs[f"{backend} chunked"])
                and all(sc == direct[:base_n] for _, sc, _ in runs[f"{backend} per-sample"]),
                "chunk_size_mean": round(m["agent/chunk_size_mean"], 1),
                "chunks": m["agent/chunks"],
                "gc_s_in_timed": round(
                    statistics.median(r[2]["gc_s"] for r in runs[f"{backend} chunked"]), 4
                ),
                "per_s_spread": spread(chunked),
                "per_sample_dispatch_per_s_spread": spread(single),
            }
            if backend == "ray":
                prefix = "agent/node_completed/"
                done = {k[len(prefix) :]: int(v) for k, v in m.items() if k.startswith(prefix)}
                out["ray"]["workers"] = args.ray_workers
                out["ray"]["cluster"] = out.pop("ray_cluster")
                out["ray"]["completed_per_node"] = done
                out["ray"]["nodes_used"] = sum(1 for v in done.values() if v > 0)
                import ray

                ray.shutdown()
                if cluster is not None:
                    cluster.shutdown()
                # Ray's processes outlive shutdown for a moment (re-parented, still marked as this
                # run's): let them end here rather than in a guard's next window
                out["ray"]["exit_wait_s"] = round(wait_own_exit(before_ray, mon.marks), 2)
    print(f"direct loop: {out['direct_per_s']:,.0f} requests/s ({args.requests} requests)")
    cols = ["per_s", "per_sample_dispatch_per_s", "speedup", "identical", "chunk_size_mean"]
    print(f"{'backend':<9}" + "".join(f"{c:>28}" for c in cols))
    for backend in args.backends.split(","):
        print(f"{backend:<9}" + "".join(f"{out[backend][c]!s:>28}" for c in cols))
    if "ray" in out:
        r = out["ray"]
        print(
            f"ray: {r['workers']} actors, {r['cluster']['how']}; requests per node {r['completed_per_node']}"
        )
    common = {"backends": args.backends.split(","), "pull": args.pull, "reward": "string comparison"}
    settings = {
        "chunked": {**common, "requests": args.requests, "chunk_s": AgentConfig().chunk_s},
        "per_sample": {**common, "requests": base_n, "chunk_s": 0.0},
        "direct": {"requests": args.requests, "agent": None},
        "ray": {
            "workers": args.ray_workers,
            "nodes": args.ray_nodes,
            "cpus_per_node": args.ray_cpus_per_node,
        },
    }
    emit(mon.finish({"benchmark": "agent_throughput", **out}, settings), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
