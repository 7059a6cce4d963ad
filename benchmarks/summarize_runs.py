"""Summarise run directories: validation accuracy right after SFT (step 0) and at the last
validation, mean reward over the last steps, response length, and wall time.

    python benchmarks/summarize_runs.py [runs/default-s0 runs/default-s1 ...] [--json]

With no run directories it summarises every directory under ``runs/`` that holds a ``metrics.jsonl``.
Its wall times were measured when the runs ran, not by this command: the JSON carries this command's
load record (``benchmarks/_harness.py``) and always ``"valid": false`` with that reason.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from _harness import Monitor, emit


def _share(rows: list[dict]) -> float:
    eq = sum(r.get("groups/all_equal_adv_frac", 0.0) for r in rows)
    moved = sum(r.get("groups/all_equal_nonzero_adv_frac", 0.0) for r in rows)
    return moved / eq if eq > 0 else float("nan")


def summarize(run: Path) -> dict[str, float | str]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    vals = [r for r in rows if isinstance(r.get("val/accuracy"), (int, float))]
    rl = [r for r in rows if r.get("step", 0) > 0]
    tail = rl[-10:]
    return {
        "run": str(run),
        "val_after_sft": vals[0]["val/accuracy"] if vals and vals[0]["step"] == 0 else float("nan"),
        "val_final": vals[-1]["val/accuracy"] if vals else float("nan"),
        "reward_last10": statistics.mean(r["reward/mean"] for r in tail if r.get("reward/mean") is not None)
        if tail
        else float("nan"),
        "response_length_last10": statistics.mean(r["response_length/mean"] for r in tail)
        if tail
        else float("nan"),
        "all_equal_groups_last10": statistics.mean(r.get("groups/all_equal_frac", float("nan")) for r in tail)
        if tail
        else float("nan"),
        # of the groups with all-equal outcomes (no outcome signal), the share that still got a
        # non-zero advantage somewhere, over all RL steps (logged since the process-reward runs)
        "equal_groups_moved_share": _share(rl),
        "wall_s": sum(r.get("time/step_s", 0.0) for r in rl) + sum(r.get("time/sft_s", 0.0) for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, help="run directories (default: every one under runs/)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs = args.runs or sorted(f.parent for f in Path("runs").glob("**/metrics.jsonl"))
    mon = Monitor(probe_s=0.2)
    if not runs:
        mon.invalidate("no run directories given and none with a metrics.jsonl under runs/")
        emit(mon.finish({"benchmark": "summarize_runs", "runs": []}, {}), args.json)
        return
    with mon.side("read"):
        out = [summarize(r) for r in runs]
    mon.invalidate("summarises saved runs: their wall times were measured when they ran, not by this command")
    keys = [k for k in out[0] if k != "run"]
    print(f"{'run':<36}" + "".join(f"{k:>24}" for k in keys))
    for s in out:
        print(f"{s['run']:<36}" + "".join(f"{s[k]:>24.3f}" for k in keys))  # type: ignore[str-format]
    settings = {str(r): {"config": str(r / "config.yaml")} for r in runs}
    emit(mon.finish({"benchmark": "summarize_runs", "runs": out}, settings), args.json)


if __name__ == "__main__":
    main()
