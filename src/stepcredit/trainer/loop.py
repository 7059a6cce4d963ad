"""The training loop. It reads top to bottom: SFT warm-up, then per step rollout -> rewards ->
process utilities -> advantages -> policy loss, with validation, metrics and checkpoints around it.
"""

from __future__ import annotations

import copy
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from stepcredit import advantages, losses, process
from stepcredit.config import Config, to_dict
from stepcredit.data import PromptStream, load_task
from stepcredit.errors import ConfigError, UserError
from stepcredit.losses import KLController
from stepcredit.models import load_policy, save_pretrained
from stepcredit.reward import build_rewarder, reward_metrics
from stepcredit.reward.agent import Ticket, build_agent
from stepcredit.rollout import generate
from stepcredit.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state
from stepcredit.trainer.metrics import MetricsLogger, peak_rss_mb, plot_curves
from stepcredit.trainer.progress import Progress
from stepcredit.trainer.sft import run_sft
from stepcredit.trainer.steps import Channels, policy_update, reward_channels
from stepcredit.trainer.validate import validate
from stepcredit.types import Batch


# Losses whose trust region is centred on the proximal policy while the behaviour policy only weights
# the sample (Hilton et al. 2022), or that are built for off-policy data (TOPR).
OFF_POLICY_LOSSES = ("decoupled_ppo", "topr")


def check_config(cfg: Config) -> None:
    """Every start-up check, so a bad combination fails before any work (exit 2), not mid-run."""
    advantages.check_config(cfg)
    losses.check_config(cfg)
    process.check_config(cfg)
    if cfg.pipeline.one_step_off_policy and cfg.loss.name not in OFF_POLICY_LOSSES:
        raise ConfigError(
            f"config key loss.name: pipeline.one_step_off_policy=true trains on 1-step-stale data; use a loss "
            f"that corrects for it ({', '.join(OFF_POLICY_LOSSES)}), not {cfg.loss.name!r}"
        )


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
    agent = build_agent(cfg.reward, rewarder)  # scores in the background; the loop pulls whole groups
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

        def rollout_and_submit(step: int) -> Rollout:
            """Generate for ``step`` (+ V(prefix) while the policy is loaded); scoring starts at once."""
            t0 = time.perf_counter()
            batch = rollout(model, tok, stream, cfg, step)
            batch.extra["time/rollout_s"] = time.perf_counter() - t0
            return Rollout(batch, agent.submit(batch))

        # --- phase 2: RL
        pending = (
            Rollout(state["pending"], agent.submit(state["pending"])) if state and state["pending"] else None
        )
        for step in range(start, cfg.trainer.steps + 1):
            t_step = time.perf_counter()
            current = pending or rollout_and_submit(step)
            pending = None
            if current.batch.policy_version < step - 1 - cfg.pipeline.max_staleness:
                current = rollout_and_submit(step)  # too stale (only after a resume with a changed bound)
            if cfg.pipeline.one_step_off_policy and step < cfg.trainer.steps:
                pending = rollout_and_submit(step + 1)  # step t+1's generation overlaps step t's reward wait
            t_gen = time.perf_counter()
            staleness = step - 1 - current.batch.policy_version
            upd: dict[str, list[float]] = {}
            scored: list[tuple[Batch, Channels]] = []
            arrived: list[Batch] = []
            wait_s = 0.0
            k = cfg.pipeline.mini_batch or len(current.batch)
            pulls = agent.stream(current.ticket, k)
            while True:
                t_wait = time.perf_counter()
                got = next(pulls, None)  # whole groups, as soon as k samples' worth are scored
                wait_s += time.perf_counter() - t_wait
                if got is None:
                    break
                mb = current.batch.select(got[0])
                mb.rewards = got[1]
                arrived.append(mb)
                mb, channels = reward_channels(mb, cfg)  # failure policy; outcome + process channels
                scored.append((mb, channels))
                for e in range(cfg.pipeline.ppo_epochs if not cfg.pipeline.mini_batch else 1):
                    _merge(
                        upd,
                        policy_update(
                            model, ref, opt, mb, channels, cfg, kl_ctl, proximal=e > 0 or staleness > 0
                        ),
                    )
            for _ in range(cfg.pipeline.ppo_epochs - 1 if cfg.pipeline.mini_batch else 0):
                for mb, channels in scored:  # later epochs replay the mini-batches in arrival order
                    _merge(upd, policy_update(model, ref, opt, mb, channels, cfg, kl_ctl, proximal=True))
            t_upd = time.perf_counter()
            batch = current.batch
            metrics = batch_metrics(Batch.concat(arrived))
            metrics.update({k: float(np.mean(v)) for k, v in upd.items()})
            n_tok = int(batch.response_mask_BT.sum())
            metrics.update(
                {
                    "step": step,
                    "time/generation_s": batch.extra["time/rollout_s"]
                    - batch.extra.get("time/process_s", 0.0),
                    "time/process_s": batch.extra.get("time/process_s", 0.0),
                    "time/reward_wait_s": wait_s,
                    "time/reward_s": wait_s,
                    "time/update_s": t_upd - t_gen - wait_s,
                    "tokens_per_s": n_tok / max(t_upd - t_step, 1e-9),
                    "kl_coef": kl_ctl.value,
                    "staleness": float(staleness),
                    **{k: v for k, v in agent.metrics().items() if not k.startswith("agent/latency")},
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
                        # the next step's batch when it was generated ahead (one-step off-policy)
                        "pending": pending.batch.without_rewards() if pending is not None else None,
                    },
                )
        save_pretrained(model, tok, run_dir / "checkpoints" / "final" / "model")
    finally:
        bar.close()
        log.close()
        agent.close()
        rewarder.close()
    plot_curves(run_dir)
    return last


@dataclass
class Rollout:
    """A generated batch and the agent's ticket for its rewards."""

    batch: Batch
    ticket: Ticket


def _merge(acc: dict[str, list[float]], m: dict[str, float]) -> None:
    for k, v in m.items():
        acc.setdefault(k, []).append(v)


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
