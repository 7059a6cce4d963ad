"""What a step reports: batch figures, the per-step accumulator, and the run-directory outputs
(``metrics.jsonl``, TensorBoard events, ``curves.png``)."""

from __future__ import annotations

import json
import math
import resource
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stepcredit.config import TrainerConfig
from stepcredit.data import WASTED_EPISODES
from stepcredit.errors import ConfigError
from stepcredit.reward import reward_metrics
from stepcredit.types import Batch, RewardResult, Status


class StepMetrics:
    """One step's figures: update metrics averaged over mini-batches and epochs, counters and
    durations (``time/...``) summed."""

    def __init__(self) -> None:
        self.means: dict[str, list[float]] = {}
        self.sums: dict[str, float] = {}

    def add(self, m: dict[str, float]) -> None:
        for k, v in m.items():
            if k.startswith("time/"):
                self.count(k, v)
            else:
                self.means.setdefault(k, []).append(v)

    def count(self, key: str, n: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + n

    def add_times(self, times: dict[str, float]) -> None:
        """Costs of work done during this step (a rollout's generation and process values)."""
        for k, v in times.items():
            self.count(k, v)

    def result(self) -> dict[str, float]:
        out = {k: float(np.mean(v)) for k, v in self.means.items()}
        out.update(self.sums)
        return out


def batch_metrics(batch: Batch, *, per_domain: bool = False) -> dict[str, float]:
    """Reward, length and status figures of a scored batch (before any update); with ``per_domain``
    also ``{domain}/reward/mean``, ``{domain}/response_length/mean``, ``{domain}/status/{status}``..."""
    assert batch.rewards is not None
    if per_domain:
        m = batch_metrics(batch)
        domain_B = [s.domain for s in batch.samples]
        for d in dict.fromkeys(domain_B):
            part = batch.select([i for i, x in enumerate(domain_B) if x == d])
            assert part.rewards is not None
            sub = batch_metrics(part)
            for k in (
                "reward/mean",
                "response_length/mean",
                "response_length/max",
                "response/truncated_frac",
            ):
                m[f"{d}/{k}"] = sub[k]
            m[f"{d}/groups/all_equal_frac"] = sub["groups/all_equal_frac"]
            m[f"{d}/count"] = float(len(part))
            for st in Status:
                m[f"{d}/status/{st.value}"] = float(sum(r.status == st for r in part.rewards))
        return m
    scores = [r.score for r in batch.rewards if r.ok]
    lengths = batch.response_mask_BT.sum(1).float()
    m = {
        "reward/mean": float(np.mean(scores)) if scores else float("nan"),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response/truncated_frac": float(batch.truncated_B.float().mean()),
    }
    m.update(reward_metrics(batch.rewards))
    m.update(waste_metrics([s.data_source for s in batch.samples], batch.texts))
    # groups whose outcome scores are all equal carry no outcome signal
    by_group: dict[int, set[float]] = {}
    for g, r in zip(batch.group_B.tolist(), batch.rewards, strict=True):
        by_group.setdefault(g, set()).add(round(r.score, 6) if r.ok else float("nan"))
    m["groups/all_equal_frac"] = float(np.mean([len(v) == 1 for v in by_group.values()]))
    return m


def waste_metrics(data_source_B: Sequence[str], texts: Sequence[str], prefix: str = "") -> dict[str, float]:
    """``{prefix}response/wasted_episodes_per_response`` over the responses whose data source can
    count its wasted episodes (``stepcredit.data.WASTED_EPISODES``); nothing when none can."""
    counts = [
        WASTED_EPISODES.get(src)(t)
        for src, t in zip(data_source_B, texts, strict=True)
        if src in WASTED_EPISODES
    ]
    return {f"{prefix}response/wasted_episodes_per_response": float(np.mean(counts))} if counts else {}


def outcome_free_signal(
    rewards: Sequence[RewardResult],
    group_B: torch.Tensor,
    valid_B: torch.Tensor,
    adv_BT: torch.Tensor,
    live_BT: torch.Tensor,
) -> dict[str, float]:
    """How many groups carry no outcome signal (all valid raw outcome scores equal) and still get a
    non-zero advantage on some token, as fractions of the groups of a mini-batch.

    Outcome-only estimators give such groups exactly zero advantage; process rewards are what can
    move them (``groups/all_equal_nonzero_adv_frac`` / ``groups/all_equal_adv_frac`` is the share).
    """
    raw_B = torch.tensor([r.score for r in rewards], dtype=torch.float64)
    moved_B = ((adv_BT.abs() > 1e-8) & live_BT).any(1).cpu()
    group_B, valid_B = group_B.cpu(), valid_B.cpu()
    n_groups = n_equal = n_moved = 0
    for g in group_B.unique().tolist():
        idx = ((group_B == g) & valid_B).nonzero().flatten()
        n_groups += 1
        if len(idx) == 0 or float(raw_B[idx].max() - raw_B[idx].min()) > 1e-6:
            continue
        n_equal += 1
        n_moved += int(bool(moved_B[idx].any()))
    if n_groups == 0:
        return {}
    return {
        "groups/all_equal_adv_frac": n_equal / n_groups,
        "groups/all_equal_nonzero_adv_frac": n_moved / n_groups,
    }


class ZeroPassTracker:
    """Breaking out of zero pass rate: prompts whose group once had no passing response (no valid
    outcome score > 0), and how many of them a later group of the same prompt (by ``Sample.uid``, else
    the prompt text) solved. Only meaningful when prompts come back (``data.train_size`` smaller than
    the prompts drawn in the run); carried in checkpoints so a resumed run keeps counting.

    Reported as cumulative counts: ``prompts/zero_pass`` (seen with zero pass rate),
    ``prompts/zero_pass_revisited`` (drawn again afterwards) and ``prompts/zero_pass_solved_later``
    (a later group had a passing response).
    """

    def __init__(self) -> None:
        self.stuck: set[str] = set()
        self.revisited: set[str] = set()
        self.solved: set[str] = set()

    def update(self, batch: Batch) -> dict[str, float]:
        assert batch.rewards is not None
        passed: dict[str, bool] = {}
        for s, r in zip(batch.samples, batch.rewards, strict=True):
            key = s.uid or json.dumps(s.prompt, sort_keys=True)
            passed[key] = passed.get(key, False) or (r.ok and r.score > 0)
        for key, ok in passed.items():
            if key in self.stuck:
                self.revisited.add(key)
                if ok:
                    self.solved.add(key)
            elif not ok:
                self.stuck.add(key)
        return {
            "prompts/zero_pass": float(len(self.stuck)),
            "prompts/zero_pass_revisited": float(len(self.revisited)),
            "prompts/zero_pass_solved_later": float(len(self.solved)),
        }

    def state_dict(self) -> dict[str, list[str]]:
        return {k: sorted(getattr(self, k)) for k in ("stuck", "revisited", "solved")}

    def load_state_dict(self, d: dict[str, list[str]]) -> None:
        for k in ("stuck", "revisited", "solved"):
            setattr(self, k, set(d.get(k, [])))


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class MetricsLogger:
    """Appends one JSON object per step to ``metrics.jsonl`` and mirrors scalars to TensorBoard and
    (``trainer.wandb``) Weights & Biases."""

    def __init__(
        self,
        run_dir: Path,
        cfg: TrainerConfig | None = None,
        ckpt: dict[str, Any] | None = None,
        *,
        config: dict[str, Any] | None = None,
    ) -> None:
        """``ckpt``: the checkpoint a run resumes from (rows after its step are dropped).
        ``config``: the run's whole config, recorded with the W&B run."""
        tensorboard = cfg.tensorboard if cfg is not None else True
        truncate_after = int(ckpt["step"]) if ckpt is not None else None
        self.path = run_dir / "metrics.jsonl"
        if truncate_after is not None and self.path.exists():
            # On resume drop rows of steps after the checkpoint: they will be recomputed.
            keep = [r for r in read_metrics(self.path) if r.get("step", -1) <= truncate_after]
            with self.path.open("w") as f:
                for r in keep:
                    f.write(json.dumps(r) + "\n")
        # a fresh run into a used directory starts the file over (appending would mix two runs' rows)
        self._f = self.path.open("a" if truncate_after is not None else "w")
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(run_dir / "tb"))
            except ImportError:  # tensorboard is an optional extra
                self._tb = None
        self._wandb: Any = None
        if cfg is not None and cfg.wandb:
            self._wandb = _wandb_run(run_dir, cfg, config or {}, resume=ckpt is not None)

    def log(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self._f.write(json.dumps(clean) + "\n")
        self._f.flush()
        step = int(row.get("step", 0))
        scalars = {
            k: v
            for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step" and math.isfinite(v)
        }
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _wandb_run(run_dir: Path, cfg: TrainerConfig, config: dict[str, Any], *, resume: bool) -> Any:
    """A W&B run writing under ``run_dir/wandb``; its id is kept in ``run_dir/wandb_id`` so a resumed
    run continues the same W&B run."""
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            "trainer.wandb=true needs Weights & Biases: pip install 'stepcredit[wandb]'"
        ) from None
    id_file = run_dir / "wandb_id"
    run_id = id_file.read_text().strip() if resume and id_file.exists() else secrets.token_hex(4)
    id_file.write_text(run_id + "\n")
    return wandb.init(
        project=cfg.wandb_project,
        name=run_dir.name,
        id=run_id,
        dir=str(run_dir),
        mode="online" if cfg.wandb_mode == "online" else "offline",
        config=config,
        resume="allow",
        settings=wandb.Settings(console="off", silent=True),
    )


def read_metrics(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_curves(run_dir: Path, *, extra_keys: tuple[str, ...] = ()) -> Path | None:
    """Reward, validation accuracy and response length against step, as ``curves.png``."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    rows = read_metrics(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("reward", [k for k in _keys(rows) if k.endswith("reward/mean")]),
        ("validation accuracy", [k for k in _keys(rows) if k.startswith("val/accuracy")]),
        ("response length", [k for k in _keys(rows) if k.endswith("response_length/mean")]),
        *[(k, [k]) for k in extra_keys],
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6))
    for ax, (title, keys) in zip(axes, panels, strict=True):
        for k in keys:
            pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=k)
        ax.set_title(title)
        ax.set_xlabel("step")
        if keys:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = run_dir / "curves.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _keys(rows: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            seen.setdefault(k, None)
    return list(seen)
