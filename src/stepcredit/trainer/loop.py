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
from stepcredit.data import PromptStream
from stepcredit.data.domains import MixedStream, build_data, check_routes
from stepcredit.errors import ConfigError, UserError
from stepcredit.losses import KLController
from stepcredit.models import load_policy, save_pretrained
from stepcredit.models.critic import ValueModel
from stepcredit.reward import apply_failure_policy, build_rewarder, reward_metrics
from stepcredit.reward.postprocess import RunningStats, zero_signal_groups
from stepcredit.reward.run.agent import Ticket, build_agent
from stepcredit.rollout import generate
from stepcredit.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state
from stepcredit.trainer.metrics import MetricsLogger, peak_rss_mb, plot_curves
from stepcredit.trainer.progress import Progress
from stepcredit.trainer.sft import run_sft
from stepcredit.trainer.steps import Channels, Critic, critic_values, policy_update, reward_channels
from stepcredit.trainer.validate import validate
from stepcredit.types import Batch, Status

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
    if cfg.postprocess.dynamic_sampling.enabled and (
        cfg.pipeline.mini_batch or cfg.pipeline.one_step_off_policy
    ):
        raise ConfigError(
            "config key postprocess.dynamic_sampling.enabled: filtering groups needs the whole batch scored "
            "first; set pipeline.mini_batch=0 and pipeline.one_step_off_policy=false"
        )
    if cfg.critic.warmup > 0 and not cfg.algorithm.use_critic:
        raise ConfigError(
            "config key critic.warmup: there is no critic to warm up; set algorithm.use_critic=true"
        )
    if cfg.data.domains:
        for d in cfg.postprocess.domains:
            if d not in cfg.data.domains:
                raise ConfigError(
                    f"config key postprocess.domains.{d}: not a domain of data.domains ({', '.join(cfg.data.domains)})"
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

    train_set, val_set, stream = build_data(cfg.data, seed=cfg.trainer.seed)
    model, tok = load_policy(cfg.model, seed=cfg.trainer.seed)
    rewarder = build_rewarder(cfg.reward)
    try:  # a domain or tag that no reward function scores fails here, before any work
        check_routes(train_set + val_set, rewarder.route)
    except ConfigError:
        rewarder.close()
        raise
    multi = bool(cfg.data.domains)
    running = RunningStats()  # per-domain running moments of outcome scores (postprocess.*=running)
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
            running.load_state_dict(state.get("outcome_stats") or {})
            start = state["step"] + 1
        critic = _build_critic(model, cfg, state)
        ref = _frozen_copy(model, state["ref_model"] if state else None) if cfg.loss.kl_coef > 0 else None
        if state is not None:
            set_rng_state(state["rng"])  # last, so nothing above consumes random numbers

        def rollout_and_submit(step: int, extra: int = 0) -> Rollout:
            """Generate for ``step`` (+ V(prefix) while the policy is loaded); scoring starts at once."""
            t0 = time.perf_counter()
            batch = rollout(model, tok, stream, cfg, step, critic=critic, extra=extra)
            batch.extra["time/rollout_s"] = time.perf_counter() - t0
            return Rollout(batch, agent.submit(batch))

        def scored(r: Rollout) -> tuple[Batch, float]:
            """The whole batch once every reward is in, and the time spent waiting."""
            t0 = time.perf_counter()
            parts = []
            for idx, results in agent.stream(r.ticket, len(r.batch)):
                mb = r.batch.select(idx)
                mb.rewards = results
                parts.append(mb)
            return Batch.concat(parts), time.perf_counter() - t0

        def dynamic_sample(first: Rollout, step: int) -> tuple[Batch | None, list[Batch], dict[str, float]]:
            """Keep the groups with outcome signal; refill with extra rollouts up to max_extra_batches.
            Returns (kept batch of at most prompts_per_step groups or None, every drawn batch, metrics)."""
            ds = cfg.postprocess.dynamic_sampling
            drawn: list[Batch] = []
            kept: list[Batch] = []
            m: dict[str, float] = {"sampling/dropped_groups": 0.0, "sampling/extra_batches": 0.0}
            n_kept, wait, r = 0, 0.0, first
            for extra in range(ds.max_extra_batches + 1):
                if extra > 0:
                    r = rollout_and_submit(step, extra)
                    m["sampling/extra_batches"] += 1
                b, w = scored(r)
                wait += w
                drawn.append(b)
                assert b.rewards is not None
                score_B, valid_B, _ = apply_failure_policy(b.rewards, b.group_B, cfg.reward)
                drop = zero_signal_groups(
                    score_B,
                    valid_B,
                    b.group_B,
                    criterion=ds.criterion,
                    mean_low=ds.mean_low,
                    mean_high=ds.mean_high,
                )
                groups = list(dict.fromkeys(b.group_B.tolist()))
                m["sampling/dropped_groups"] += len(drop)
                for g in drop:
                    d = b.samples[b.group_B.tolist().index(g)].domain
                    m[f"{d}/sampling/dropped_groups"] = m.get(f"{d}/sampling/dropped_groups", 0.0) + 1
                take = [g for g in groups if g not in drop][: cfg.rollout.prompts_per_step - n_kept]
                if take:
                    kept.append(b.select([i for i, g in enumerate(b.group_B.tolist()) if g in set(take)]))
                    n_kept += len(take)
                if n_kept >= cfg.rollout.prompts_per_step:
                    break
            m["sampling/drawn_prompts"] = float(sum(len(set(b.group_B.tolist())) for b in drawn))
            m["sampling/kept_groups"] = float(n_kept)
            m["time/reward_wait_s"] = wait
            return (Batch.concat(kept) if kept else None), drawn, m

        # --- phase 2: RL
        pending = (
            Rollout(state["pending"], agent.submit(state["pending"])) if state and state["pending"] else None
        )
        for step in range(start, cfg.trainer.steps + 1):
            t_step = time.perf_counter()
            # linear warm-up: Adam's first steps move every weight by ~lr whatever the gradient's size
            for g in opt.param_groups:
                g["lr"] = cfg.optim.lr * min(1.0, step / max(1, cfg.optim.warmup_steps))
            current = pending or rollout_and_submit(step)
            pending = None
            if current.batch.policy_version < step - 1 - cfg.pipeline.max_staleness:
                current = rollout_and_submit(step)  # too stale (only after a resume with a changed bound)
            if cfg.pipeline.one_step_off_policy and step < cfg.trainer.steps:
                pending = rollout_and_submit(step + 1)  # step t+1's generation overlaps step t's reward wait
            t_gen = time.perf_counter()
            staleness = step - 1 - current.batch.policy_version
            upd: dict[str, list[float]] = {}
            done: list[tuple[Batch, Channels]] = []
            arrived: list[Batch] = []
            wait_s = 0.0
            sampling: dict[str, float] = {}
            # critic warm-up: the critic learns the returns while the policy's weights stay as they are
            train_policy = step > cfg.critic.warmup

            def update(
                mb: Batch,
                channels: Channels,
                *,
                proximal: bool,
                upd: dict[str, list[float]] = upd,
                train_policy: bool = train_policy,
            ) -> None:
                """One optimiser step on a mini-batch; ``proximal`` when the policy moved since generation."""
                _merge(
                    upd,
                    policy_update(
                        model,
                        ref,
                        opt,
                        mb,
                        channels,
                        cfg,
                        kl_ctl,
                        proximal=proximal,
                        critic=critic,
                        update_policy=train_policy,
                    ),
                )

            if cfg.postprocess.dynamic_sampling.enabled:
                kept, arrived, sampling = dynamic_sample(current, step)  # waits for every reward first
                wait_s = sampling.pop("time/reward_wait_s")
                if kept is not None:
                    mb, channels = reward_channels(kept, cfg, running)
                    for e in range(cfg.pipeline.ppo_epochs):
                        update(mb, channels, proximal=e > 0 or staleness > 0)
            else:
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
                    # failure policy, per-domain outcome processing; outcome + process channels
                    mb, channels = reward_channels(mb, cfg, running)
                    done.append((mb, channels))
                    for e in range(cfg.pipeline.ppo_epochs if not cfg.pipeline.mini_batch else 1):
                        update(mb, channels, proximal=e > 0 or staleness > 0)
                for _ in range(cfg.pipeline.ppo_epochs - 1 if cfg.pipeline.mini_batch else 0):
                    for mb, channels in done:  # later epochs replay the mini-batches in arrival order
                        update(mb, channels, proximal=True)
            t_upd = time.perf_counter()
            batch = current.batch
            metrics = batch_metrics(Batch.concat(arrived), per_domain=multi)
            metrics.update(sampling)
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
                        "outcome_stats": running.state_dict(),
                        "critic": critic.model.state_dict() if critic is not None else None,
                        "critic_opt": critic.opt.state_dict() if critic is not None else None,
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


def _build_critic(model: Any, cfg: Config, state: dict[str, Any] | None) -> Critic | None:
    """The value model (a copy of the policy's backbone after SFT, or the checkpoint's) and its optimiser."""
    if not cfg.algorithm.use_critic:
        return None
    vm = ValueModel(model)
    opt = torch.optim.AdamW(vm.parameters(), lr=cfg.critic.lr, betas=cfg.optim.betas, weight_decay=0.0)
    if state is not None and state.get("critic") is not None:
        vm.load_state_dict(state["critic"])
        opt.load_state_dict(state["critic_opt"])
    return Critic(vm, opt)


def rollout(
    model: Any,
    tok: Any,
    stream: PromptStream | MixedStream,
    cfg: Config,
    step: int,
    *,
    critic: Critic | None = None,
    extra: int = 0,
) -> Batch:
    """Sample prompts (each domain its share), generate ``rollout.n`` responses each, store the critic's
    values, and (when process rewards are on) V(prefix) at episode ends while the policy is loaded.
    ``extra`` numbers the refill rollouts of dynamic sampling (their group ids stay distinct)."""
    P = cfg.rollout.prompts_per_step
    prompts = stream.take(P)
    batch = generate(
        model,
        tok,
        prompts,
        n=cfg.rollout.n,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        group_offset=(extra * (cfg.trainer.steps + 1) + step) * P,
        policy_version=step - 1,
        # the process stage may continue from the behaviour log-prob pass instead of re-running responses
        keep_cache=cfg.process.enabled,
    )
    if critic is not None:
        batch.values_BT = critic_values(critic, batch)
    if cfg.process.enabled:
        t0 = time.perf_counter()
        process.compute_prefix_values(model, tok, batch, cfg.process)
        batch.extra["time/process_s"] = time.perf_counter() - t0
    return batch


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
