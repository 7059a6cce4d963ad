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
from stepcredit.stats import wilson_interval
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
    m.update(reward_info_metrics(batch.rewards))
    m.update(waste_metrics([s.data_source for s in batch.samples], batch.texts))
    # groups whose outcome scores are all equal carry no outcome signal
    by_group: dict[int, set[float]] = {}
    for g, r in zip(batch.group_B.tolist(), batch.rewards, strict=True):
        by_group.setdefault(g, set()).add(round(r.score, 6) if r.ok else float("nan"))
    m["groups/all_equal_frac"] = float(np.mean([len(v) == 1 for v in by_group.values()]))
    return m


def reward_info_metrics(rewards: Sequence[RewardResult]) -> dict[str, float]:
    """What reward functions return beside the score, as means over the batch:

    * ``reward/{source}/extra/{key}``: each numeric key of ``info`` (the extra keys of a verl-style
      function's ``{"score": ..., "acc": ...}``, a sandbox's ``passed``/``total``), over the results
      that carry it;
    * ``reward/fn/{name}/mean``: each TRL-style function's own value (``info["rewards"]``, None left
      out), as TRL logs ``rewards/{name}/mean`` beside the weighted sum (``reward/mean``).
    """
    extra: dict[str, list[float]] = {}
    per_fn: dict[str, list[float]] = {}
    for r in rewards:
        for k, v in r.info.items():
            if isinstance(v, (int, float)) and math.isfinite(float(v)):
                extra.setdefault(f"reward/{r.source or 'unknown'}/extra/{k}", []).append(float(v))
        fns = r.info.get("rewards")
        if isinstance(fns, dict):
            for name, v in fns.items():
                if isinstance(v, (int, float)) and math.isfinite(float(v)):
                    per_fn.setdefault(str(name), []).append(float(v))
    out = {k: float(np.mean(v)) for k, v in sorted(extra.items())}
    # "file.py:fn" -> "fn" (TRL names a function by its __name__), the whole spec when two share a name
    short = [n.rsplit(":", 1)[-1] for n in per_fn]
    for (name, vs), s in zip(per_fn.items(), short, strict=True):
        out[f"reward/fn/{s if short.count(s) == 1 else name}/mean"] = float(np.mean(vs))
    return out


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
        self.samples_path = run_dir / "samples.jsonl"
        kept = (
            [r for r in read_metrics(self.samples_path) if r.get("step", -1) <= truncate_after]
            if truncate_after is not None and self.samples_path.exists()
            else []
        )
        self.samples_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.generations_to_log = cfg.generations_to_log if cfg is not None else 4
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

    def log_samples(self, step: int, split: str, rows: Sequence[dict[str, Any]]) -> None:
        """Append ``rows`` (prompt, response, ground truth, score, status...) to ``samples.jsonl``
        with their ``step`` and ``split`` (``val``: every validation answer; ``train``: sampled
        completions), and show the first ``trainer.generations_to_log`` in TensorBoard (text) and W&B
        (a table), as verl's ``val_generations_to_log`` does."""
        with self.samples_path.open("a") as f:
            for r in rows:
                f.write(json.dumps({"step": step, "split": split, **r}, default=str) + "\n")
        shown = list(rows[: self.generations_to_log])
        if not shown:
            return
        cols = ["step", "prompt", "response", "ground_truth", "score", "status"]
        table = [[step, *(_cell(r.get(c)) for c in cols[1:])] for r in shown]
        if self._tb is not None:
            md = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
            md += "".join("| " + " | ".join(_md(str(x)) for x in row) + " |\n" for row in table)
            self._tb.add_text(f"samples/{split}", md, step)
            self._tb.flush()
        if self._wandb is not None:
            import wandb

            self._wandb.log(
                {f"samples/{split}": wandb.Table(columns=list[str | int](cols), data=table)}, step=step
            )

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _cell(v: Any) -> Any:
    return v if isinstance(v, (int, float, str)) or v is None else json.dumps(v, default=str)


def _md(text: str) -> str:
    # one table cell: pipes and line breaks would end it early
    return text.replace("|", "\\|").replace("\n", "<br>")


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
        mode=cfg.wandb_mode,  # offline or online, validated by the config
        config=config,
        resume="allow",
        settings=wandb.Settings(console="off", silent=True),
    )


def read_metrics(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_curves(run_dir: Path, *, extra_keys: tuple[str, ...] = ()) -> Path | None:
    """Reward, validation accuracy, response length and (with process rewards) the process credit
    figures against step, as ``curves.png``."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    rows = read_metrics(path)
    from stepcredit.plotting import pyplot, save

    plt = pyplot()

    keys = _keys(rows)
    panels = [
        # the named keys say sampled/greedy; "reward/mean" and "val/accuracy" are their older names
        ("reward (sampled)", [k for k in keys if k == "train/reward_sampled" or k.endswith("/reward/mean")]),
        ("validation accuracy", [k for k in keys if k.startswith("val/accuracy") and k != "val/accuracy"]),
        ("response length", [k for k in keys if k.endswith("response_length/mean")]),
        *[(title, ks) for title, ks in _process_panels(keys)],
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
    return save(fig, run_dir / "curves.png", dpi=90)


def _process_panels(keys: list[str]) -> list[tuple[str, list[str]]]:
    """With process rewards on (``process/u_abs_mean`` logged): the utilities' size and near-zero
    share, and how often credit moved a group whose outcomes were all equal (0..1 scales), and
    episodes per response (a count) on its own panel."""
    if "process/u_abs_mean" not in keys:
        return []
    credit = ["process/u_abs_mean", "process/u_near_zero_frac", "groups/all_equal_nonzero_adv_frac"]
    return [
        ("process credit", [k for k in credit if k in keys]),
        ("process episodes per response", [k for k in keys if k == "process/episodes_per_response"]),
    ]


def _keys(rows: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            seen.setdefault(k, None)
    return list(seen)


# ------------------------------------------------------------------------------ did RL help?
def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar test: ``b`` prompts right before and wrong after, ``c`` the reverse.
    Under "no change" each discordant prompt flips either way with probability 1/2, so
    p = min(1, 2 P[Binomial(b + c, 1/2) <= min(b, c)])."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def two_proportion_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided pooled two-proportion z-test (for two validations on different prompts)."""
    if n1 <= 0 or n2 <= 0:
        return 1.0
    pooled = (k1 + k2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return 1.0
    z = abs(k1 / n1 - k2 / n2) / se
    return math.erfc(z / math.sqrt(2))


class ValHistory:
    """Every validation's per-prompt correctness (``validation.jsonl``: step, accuracy, correct as
    0/1 per validation prompt, in order), kept so the end of a run can say whether RL helped; a
    resumed run drops the validations after its checkpoint, as :class:`MetricsLogger` does."""

    def __init__(self, run_dir: Path, ckpt_step: int | None = None) -> None:
        self.path = run_dir / "validation.jsonl"
        self.rows: list[dict[str, Any]] = []
        if ckpt_step is not None and self.path.exists():
            self.rows = [r for r in read_metrics(self.path) if r["step"] <= ckpt_step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))

    def add(self, step: int, correct: Sequence[bool], kind: str) -> None:
        row = {"step": step, "kind": kind, "correct": [int(c) for c in correct]}
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def summary(self, *, alpha: float = 0.05) -> dict[str, Any]:
        """Post-SFT (step 0), best and final validation accuracy, each with its 95 % Wilson interval,
        and the verdict on final vs post-SFT: ``up``/``down`` when the change is significant at
        ``alpha``, else ``within noise``. The test is the exact McNemar test on the same validation
        prompts (paired: a prompt's two answers are not independent, so it is sharper than comparing
        two proportions); a two-proportion z-test when the prompt sets differ. ``best`` is picked
        after the fact, so it is reported but never tested (it would be biased upwards)."""
        if not self.rows:
            return {}

        def point(r: dict[str, Any]) -> dict[str, Any]:
            k, n = sum(r["correct"]), len(r["correct"])
            lo, hi = wilson_interval(k / n if n else 0.0, n)
            return {"step": r["step"], "accuracy": k / n if n else float("nan"), "n": n, "ci95": [lo, hi]}

        final = self.rows[-1]
        out: dict[str, Any] = {"kind": final["kind"], "final": point(final)}
        out["best"] = point(max(self.rows, key=lambda r: sum(r["correct"]) / max(1, len(r["correct"]))))
        base = next((r for r in self.rows if r["step"] == 0), None)
        if base is None or base is final:
            return out
        out["post_sft"] = point(base)
        a, b = base["correct"], final["correct"]
        if len(a) == len(b):
            p = mcnemar_exact_p(
                sum(x and not y for x, y in zip(a, b, strict=True)),
                sum(y and not x for x, y in zip(a, b, strict=True)),
            )
            test = f"exact McNemar test on {len(a)} paired prompts"
        else:
            p = two_proportion_p(sum(a), len(a), sum(b), len(b))
            test = "two-proportion z-test (the prompt sets differ)"
        diff = out["final"]["accuracy"] - out["post_sft"]["accuracy"]
        verdict = "within noise" if p >= alpha else ("up" if diff > 0 else "down")
        out["verdict"] = {"verdict": verdict, "change": diff, "p_value": p, "alpha": alpha, "test": test}
        return out


def summary_lines(s: dict[str, Any]) -> list[str]:
    """The run's result in a few plain lines (see :meth:`ValHistory.summary`), then the parameters
    that trained and the reward failures when the summary has them."""
    lines = _validation_lines(s) if "final" in s else []
    if params := s.get("params"):
        lines.append(
            f"parameters: {params['trainable']:,} trained of {params['total']:,} "
            f"({100 * params['trainable'] / max(1, params['total']):.1f} %)"
        )
    if (fails := s.get("reward_failures")) and fails.get("failed"):
        top = "; ".join(f"{t['count']} x {t['message']}" for t in fails["top"][:3])
        where = f" (every one in {fails['file']})" if fails.get("file") else ""
        lines.append(f"reward failures: {fails['failed']}{where}: {top}")
    return lines


def _validation_lines(s: dict[str, Any]) -> list[str]:
    n = s["final"]["n"]
    lines = [f"validation accuracy ({s['kind']}, {n} prompts, 95 % Wilson interval):"]
    for key, label in (("post_sft", "post-SFT"), ("best", "best"), ("final", "final")):
        if key in s:
            pt = s[key]
            lo, hi = pt["ci95"]
            lines.append(
                f"  {label + ' (step ' + str(pt['step']) + ')':<20}{pt['accuracy']:.3f}  [{lo:.3f}, {hi:.3f}]"
            )
    if "verdict" in s:
        v = s["verdict"]
        lines.append(
            f"  verdict: {v['verdict']} (final vs post-SFT {100 * v['change']:+.1f} points, "
            f"p = {v['p_value']:.3g}, {v['test']})"
        )
    return lines
