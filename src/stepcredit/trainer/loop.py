"""The training loop. It reads top to bottom: SFT warm-up, then per step rollout -> rewards ->
process utilities -> advantages -> policy loss, with validation, metrics and checkpoints around it.
"""

from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from stepcredit import advantages, losses, process
from stepcredit.config import Config, to_dict
from stepcredit.data import PromptStream, load_task
from stepcredit.errors import UserError
from stepcredit.losses import KLController
from stepcredit.models import load_policy, save_pretrained
from stepcredit.reward import build_rewarder, reward_metrics
from stepcredit.rollout import generate
from stepcredit.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state
from stepcredit.trainer.metrics import MetricsLogger, peak_rss_mb, plot_curves
from stepcredit.trainer.progress import Progress
from stepcredit.trainer.sft import run_sft
from stepcredit.trainer.steps import policy_update, reward_channels
from stepcredit.trainer.validate import validate
from stepcredit.types import Batch


def check_config(cfg: Config) -> None:
    """Every start-up check, so a bad combination fails before any work (exit 2), not mid-run."""
    advantages.check_config(cfg)
    losses.check_config(cfg)
    process.check_config(cfg)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(cfg: Config, run_dir: Path, *, resume: Path | None = None) -> dict[str, Any]:
    """Run SFT (unless resuming) and ``cfg.trainer.steps`` RL steps; returns the last metrics row."""
    check_config(cfg)
    torch.set_num_threads(cfg.trainer.threads)
    seed_everything(cfg.trainer.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))

    train_set, val_set = load_task(cfg.data)
    model, tok = load_policy(cfg.model, seed=cfg.trainer.seed)
    stream = PromptStream(train_set, seed=cfg.trainer.seed)
    rewarder = build_rewarder(cfg.reward)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas, weight_decay=cfg.optim.weight_decay
    )
    kl_ctl = KLController.from_config(cfg.loss)
    state = _resume_state(resume) if resume is not None else None
    log = MetricsLogger(
        run_dir, tensorboard=cfg.trainer.tensorboard, truncate_after=state["step"] if state else None
    )
    bar = Progress(total=cfg.trainer.steps, enabled=cfg.trainer.progress)

    def run_validation() -> tuple[dict[str, float], list[dict[str, Any]]]:
        return validate(
            model,
            tok,
            val_set,
            rewarder,
            max_new_tokens=cfg.rollout.max_new_tokens,
            temperature=cfg.rollout.val_temperature,
        )

    last: dict[str, Any] = {}
    try:
        if state is None:
            # --- phase 1: supervised warm-up, then the reference model is the SFT policy
            t0 = time.perf_counter()
            if cfg.sft.steps > 0:
                run_sft(
                    model, tok, train_set, cfg.sft, seed=cfg.trainer.seed, on_step=bar.sft_step(cfg.sft.steps)
                )
            row: dict[str, Any] = {"step": 0, "phase": "sft", "time/sft_s": time.perf_counter() - t0}
            if cfg.trainer.val_every > 0:
                row.update(run_validation()[0])
            log.log(row)
            bar.update(0, row)
            start = 1
        else:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            stream.load_state_dict(state["data"])
            kl_ctl.load_state_dict(state["kl_ctl"])
            start = state["step"] + 1
        ref = _frozen_copy(model, state["ref_model"] if state else None) if cfg.loss.kl_coef > 0 else None
        if state is not None:
            set_rng_state(state["rng"])  # last, so nothing above consumes random numbers

        # --- phase 2: RL
        for step in range(start, cfg.trainer.steps + 1):
            t_step = time.perf_counter()
            batch = rollout(model, tok, stream, cfg, step)  # generate n per prompt (+ V(prefix) while loaded)
            t_gen = time.perf_counter()
            batch.rewards = rewarder.score_batch(batch.samples, batch.texts)
            t_rew = time.perf_counter()
            metrics = batch_metrics(batch)
            upd: dict[str, list[float]] = {}
            for mb in mini_batches(batch, cfg.pipeline.mini_batch, cfg.pipeline.ppo_epochs):
                mb, channels = reward_channels(mb, cfg)  # failure policy; outcome + process channels
                m = policy_update(
                    model, ref, opt, mb, channels, cfg, kl_ctl, temperature=cfg.rollout.temperature
                )
                for k, v in m.items():
                    upd.setdefault(k, []).append(v)
            t_upd = time.perf_counter()
            metrics.update({k: float(np.mean(v)) for k, v in upd.items()})
            n_tok = int(batch.response_mask_BT.sum())
            metrics.update(
                {
                    "step": step,
                    "time/generation_s": t_gen - t_step - batch.extra.get("time/process_s", 0.0),
                    "time/process_s": batch.extra.get("time/process_s", 0.0),
                    "time/reward_s": t_rew - t_gen,
                    "time/update_s": t_upd - t_rew,
                    "tokens_per_s": n_tok / max(t_upd - t_step, 1e-9),
                    "kl_coef": kl_ctl.value,
                }
            )
            if cfg.trainer.val_every > 0 and (step % cfg.trainer.val_every == 0 or step == cfg.trainer.steps):
                vm, rows = run_validation()
                metrics.update(vm)
                _write_samples(run_dir, rows)
            metrics["time/step_s"] = time.perf_counter() - t_step
            metrics["memory/peak_rss_mb"] = peak_rss_mb()
            log.log(metrics)
            bar.update(step, metrics)
            last = metrics
            if cfg.trainer.save_every > 0 and (
                step % cfg.trainer.save_every == 0 or step == cfg.trainer.steps
            ):
                save_checkpoint(
                    run_dir / "checkpoints",
                    step,
                    {
                        "model": model.state_dict(),
                        "optimizer": opt.state_dict(),
                        "data": stream.state_dict(),
                        "kl_ctl": kl_ctl.state_dict(),
                        "ref_model": ref.state_dict() if ref is not None else None,
                    },
                )
        save_pretrained(model, tok, run_dir / "checkpoints" / "final" / "model")
    finally:
        bar.close()
        log.close()
        rewarder.close()
    plot_curves(run_dir)
    return last


def rollout(model: Any, tok: Any, stream: PromptStream, cfg: Config, step: int) -> Batch:
    """Sample prompts, generate ``rollout.n`` responses each, and (when process rewards are on) store
    V(prefix) at episode ends while the policy is loaded."""
    prompts = stream.take(cfg.rollout.prompts_per_step)
    batch = generate(
        model,
        tok,
        prompts,
        n=cfg.rollout.n,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        group_offset=step * cfg.rollout.prompts_per_step,
        policy_version=step - 1,
    )
    if cfg.process.enabled:
        t0 = time.perf_counter()
        process.compute_prefix_values(model, tok, batch, cfg.process)
        batch.extra["time/process_s"] = time.perf_counter() - t0
    return batch


def mini_batches(batch: Batch, size: int, epochs: int) -> list[Batch]:
    """Whole groups per mini-batch (so group baselines stay exact), ``epochs`` passes in order."""
    if size <= 0 or size >= len(batch):
        return [batch] * epochs
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_B.tolist()):
        groups.setdefault(g, []).append(i)
    chunks: list[list[int]] = [[]]
    for members in groups.values():
        if chunks[-1] and len(chunks[-1]) + len(members) > size:
            chunks.append([])
        chunks[-1].extend(members)
    return [batch.select(c) for _ in range(epochs) for c in chunks]


def batch_metrics(batch: Batch) -> dict[str, float]:
    """Reward, length and status figures of a scored batch (before any update)."""
    assert batch.rewards is not None
    scores = [r.score for r in batch.rewards if r.ok]
    lengths = batch.response_mask_BT.sum(1).float()
    m = {
        "reward/mean": float(np.mean(scores)) if scores else float("nan"),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response/truncated_frac": float(batch.truncated_B.float().mean()),
    }
    m.update(reward_metrics(batch.rewards))
    # groups whose outcome scores are all equal carry no outcome signal
    by_group: dict[int, set[float]] = {}
    for g, r in zip(batch.group_B.tolist(), batch.rewards, strict=True):
        by_group.setdefault(g, set()).add(round(r.score, 6) if r.ok else float("nan"))
    m["groups/all_equal_frac"] = float(np.mean([len(v) == 1 for v in by_group.values()]))
    return m


def _frozen_copy(model: Any, state: dict[str, Any] | None) -> Any:
    ref = copy.deepcopy(model)
    if state is not None:
        ref.load_state_dict(state)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def _resume_state(run_dir: Path) -> dict[str, Any]:
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise UserError(f"--resume {run_dir}: no checkpoint found under {run_dir / 'checkpoints'}")
    return load_checkpoint(ckpt)


def _write_samples(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    tmp = run_dir / "samples.jsonl.tmp"
    with tmp.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    tmp.replace(run_dir / "samples.jsonl")
