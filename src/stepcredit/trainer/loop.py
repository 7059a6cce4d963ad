"""The training loop, read top to bottom (CleanRL's shape): set-up; SFT warm-up; then per RL step

    current = pending or rollout_and_submit(step)          # generate; the agent scores in the background
    pending = rollout_and_submit(step + 1)                 # one-step off-policy: overlaps this step
    for mb in step_stream(agent, current):                 # whole groups as their rewards complete
        train_on(mb)                                       # postprocess -> process -> advantages -> critic -> loss
    log, validate, checkpoint

The stages live in their own modules: :mod:`.rollout`, :mod:`.sampling` (mini-batches, dynamic
sampling), :mod:`.update` (``train_on``), :mod:`.critic`, :mod:`.state` (what a checkpoint holds),
:mod:`.metrics`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from stepcredit import advantages, losses, process, rollout
from stepcredit.config import Config, to_dict
from stepcredit.data.domains import build_data, check_routes
from stepcredit.errors import ConfigError, UserError
from stepcredit.models import save_pretrained
from stepcredit.models.lora import merged_state_dict
from stepcredit.process import VALUE_ESTIMATORS
from stepcredit.process.domains import process_domains
from stepcredit.reward import RewardAgent, Rewarder, TrainingProgress, build_agent, build_rewarder, shaping
from stepcredit.reward.run import backends
from stepcredit.reward.run.failures import FailureLog
from stepcredit.reward.run.health import CircuitBreaker, RewardBackendError, probe_routes
from stepcredit.rollout import ROLLOUT_MODES, engines
from stepcredit.rollout.sampling import row_key
from stepcredit.runtime import set_threads
from stepcredit.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state
from stepcredit.trainer.metrics import (
    MetricsLogger,
    StepMetrics,
    ValHistory,
    batch_metrics,
    peak_rss_mb,
    plot_curves,
)
from stepcredit.trainer.progress import Progress, banner_lines, param_counts
from stepcredit.trainer.rollout import Rollout, progress_of, rollout_and_submit, tool_context
from stepcredit.trainer.sampling import step_stream
from stepcredit.trainer.schedule import LR_SCHEDULES, short_run_warning
from stepcredit.trainer.setup import engine_bound, load_model
from stepcredit.trainer.sft import run_sft
from stepcredit.trainer.state import TrainState, build_state
from stepcredit.trainer.update import Prepared, train_on, update
from stepcredit.trainer.validate import is_correct, validate
from stepcredit.types import Batch, RewardResult, Sample, Status


def train(cfg: Config, run_dir: Path, *, resume: Path | None = None) -> dict[str, Any]:
    """Run SFT (unless resuming) and ``cfg.trainer.steps`` RL steps; returns the last metrics row.
    ``run_dir/summary.json`` says whether RL helped (:meth:`ValHistory.summary`). A run that fails
    before its first SFT or RL step removes the run directory it created (nothing in it to keep)."""
    check_config(cfg)
    created = not run_dir.exists()
    started = [False]
    try:
        return _train(cfg, run_dir, resume, started)
    except BaseException:
        if created and not started[0]:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _warm_up(
    cfg: Config, run_dir: Path, model: Any, tok: Any, train_set: list[Sample], bar: Progress
) -> dict[str, float]:
    """Phase 1: supervised warm-up on the training prompts' solutions (results in the rollouts' own tokens
    on a tools run), the SFT policy saved for ``eval`` and pushed to the engine; its time."""
    t0 = time.perf_counter()
    uses_tools = ROLLOUT_MODES.get(cfg.rollout.mode).uses_tools
    run_sft(
        model,
        tok,
        train_set,
        cfg.sft,
        seed=cfg.trainer.seed,
        on_step=bar.sft_step(cfg.sft.steps),
        tools=cfg.rollout.tools if uses_tools else None,
    )
    if cfg.sft.steps > 0:
        save_pretrained(model, tok, run_dir / "checkpoints" / "sft" / "model")
    engines.sync(model)  # the SFT policy to the engine (validation generates with it)
    return {"time/sft_s": time.perf_counter() - t0}


def _maybe_save(cfg: Config, run_dir: Path, state: TrainState, pending: Rollout | None) -> None:
    """A checkpoint every ``trainer.save_every`` steps and at the last one; the next step's batch when it
    was generated ahead (one-step off-policy) is saved with it."""
    step = state.step
    if cfg.trainer.save_every > 0 and (step % cfg.trainer.save_every == 0 or step == _last_step(cfg, 0)):
        ahead = {"pending": pending.batch.without_rewards() if pending is not None else None}
        save_checkpoint(run_dir / "checkpoints", step, {**state.state_dict(), **ahead})


@dataclass(frozen=True)
class _Run:
    """What the set-up hands the loop: the data and policy it starts from, and what each step calls."""

    ckpt: dict[str, Any] | None  # the checkpoint resumed from, or None for a fresh run
    train_set: list[Sample]
    model: Any  # the policy as loaded (LoRA may wrap it: ``state.model``)
    tok: Any
    state: TrainState
    agent: RewardAgent
    breaker: CircuitBreaker
    failures: FailureLog
    log: MetricsLogger
    history: ValHistory
    bar: Progress
    rollout_for: Callable[[int], Rollout]  # generate step t's batch and submit it to the agent
    validation: Callable[[int], dict[str, float]]


def _set_up(cfg: Config, run_dir: Path, resume: Path | None, closing: contextlib.ExitStack) -> _Run:
    """Data, policy, rewards and the services a step calls, each closed by ``closing``; every start-up
    check runs here (a route no reward scores, a broken backend, process data) and the banner is printed
    last, once they all passed."""
    _start_run(cfg, run_dir)
    train_set, val_set, stream = build_data(cfg.data, seed=cfg.trainer.seed)
    model, tok = load_model(cfg)  # on trainer.device: the reference, critic, rollout and values follow it
    ckpt = _resume_state(resume) if resume is not None else None
    rewarder = closing.enter_context(build_rewarder(cfg.reward))
    check_routes(train_set + val_set, rewarder.route)
    # a broken backend (bwrap, judge) stops here; probed as the first batch will be scored
    routes = probe_routes(rewarder, train_set + val_set, TrainingProgress(0, cfg.trainer.steps))
    breaker = CircuitBreaker(cfg.reward.breaker)  # and one that breaks mid-run stops at its step
    # every failed reward: printed once per distinct error, counted per step, kept in the run directory
    failures = FailureLog(run_dir, warn=not cfg.reward.breaker.enabled)
    agent = closing.enter_context(build_agent(cfg.reward, rewarder))
    if cfg.reward.agent.prestart:
        agent.prestart()  # workers import while the model loads and generates (reward.agent.prestart)
    log = closing.enter_context(
        contextlib.closing(MetricsLogger(run_dir, cfg.trainer, ckpt, config=to_dict(cfg)))
    )
    history = ValHistory(run_dir, int(ckpt["step"]) if ckpt is not None else None)
    bar = closing.enter_context(contextlib.closing(Progress(cfg.trainer.steps, cfg.trainer.progress)))
    # the rollout engine (vLLM: built from the policy as it is now; it follows the weights from here)
    closing.enter_context(engine_bound(cfg, model, tok))
    state = build_state(cfg, model, tok, stream)
    domains = process_domains(cfg.process, train_set) if cfg.process.enabled else frozenset()
    process.check_data(cfg.process, train_set, domains)
    rollout_for = functools.partial(rollout_and_submit, state, agent, rewarder, process_domains=domains)
    validation = functools.partial(_validate, state, val_set, rewarder, log, history)
    _announce(cfg, run_dir, model, sorted(routes), len(train_set), len(val_set))  # every check passed
    return _Run(
        ckpt,
        train_set,
        model,
        tok,
        state,
        agent,
        breaker,
        failures,
        log,
        history,
        bar,
        rollout_for,
        validation,
    )


def _train(cfg: Config, run_dir: Path, resume: Path | None, started: list[bool]) -> dict[str, Any]:
    with contextlib.ExitStack() as closing:
        # --- set-up: data, policy, rewards (a route no reward scores fails here, before any work)
        run = _set_up(cfg, run_dir, resume, closing)
        started[0] = True
        ckpt, state, agent, log, bar = run.ckpt, run.state, run.agent, run.log, run.bar
        rollout_for, validation = run.rollout_for, run.validation

        # --- phase 1: supervised warm-up; the reference model is the SFT policy, saved for `eval`
        if ckpt is None:
            sft = _warm_up(cfg, run_dir, run.model, run.tok, run.train_set, bar)
            log_row(log, bar, {"step": 0, "phase": "sft", **sft, **validation(0)})
        else:
            state.load_state_dict(ckpt)
            engines.sync(run.model)  # the checkpoint's weights to the engine
        state.start_rl(ckpt)
        if state.model is not run.model:  # LoRA wrapped the policy: its engine serves it, adapters merged
            engines.follow(run.model, state.model, functools.partial(merged_state_dict, state.model))
            closing.callback(engines.unbind, state.model)
        pending = (
            Rollout(ckpt["pending"], agent.submit(ckpt["pending"], progress_of(ckpt["pending"], cfg)))
            if ckpt and ckpt["pending"]
            else None
        )
        if ckpt is not None:
            set_rng_state(ckpt["rng"])  # last, so nothing above consumes random numbers

        # --- phase 2: RL
        last: dict[str, Any] = {}
        for step in range(state.step + 1, _last_step(cfg, state.step) + 1):
            t_step = time.perf_counter()
            state.set_lr(step)
            counts = StepMetrics()
            current, pending = pending, None
            if current is None or state.step - current.batch.policy_version > cfg.pipeline.max_staleness:
                current = rollout_for(step)  # (a staler batch only after a resume with a changed bound)
                counts.add_times(current.times)
            if cfg.pipeline.one_step_off_policy and step < cfg.trainer.steps:
                pending = rollout_for(step + 1)  # step t+1's generation overlaps step t's rewards and updates
                counts.add_times(pending.times)
            train_policy = step > cfg.critic.warmup  # critic warm-up: only the critic learns
            arrived: list[Batch] = []
            prepared: list[Prepared] = []
            for mb in step_stream(agent, current, cfg, counts, functools.partial(rollout_for, step), arrived):
                p, metrics = train_on(state, mb, train_policy=train_policy)  # postprocess ... loss
                prepared.append(p)
                counts.add(metrics)
            for _ in range(cfg.pipeline.ppo_epochs - 1):  # later epochs replay mini-batches in arrival order
                for p in prepared:
                    counts.add(update(state, p, train_policy=train_policy))
            state.step = step
            last = _step_row(state, current.batch, arrived, counts, prepared, agent.metrics(), t_step)
            last.update(run.failures.record(*_scored(arrived), step=step))  # printed once, counted, kept
            last["optim/lr"] = state.opt.param_groups[0]["lr"]
            try:
                run.breaker.update([r for b in arrived for r in b.rewards or []], step=step)
            except RewardBackendError:
                log_row(log, bar, last, t_step)  # the step that stops the run is shown and logged first
                raise
            if cfg.trainer.val_every > 0 and (step % cfg.trainer.val_every == 0 or step == cfg.trainer.steps):
                last.update(validation(step))
            log_row(log, bar, last, t_step)
            if cfg.trainer.generations_every > 0 and step % cfg.trainer.generations_every == 0:
                log.log_samples(step, "train", _generations(arrived, cfg.trainer.generations_to_log))
            _maybe_save(cfg, run_dir, state, pending)
        state.export(run_dir / "checkpoints" / "final")
        summary = {
            **run.history.summary(),
            "params": param_counts(state.model),
            "reward_failures": run.failures.summary(),
        }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_curves(run_dir)
    return last


_PER_RESPONSE = {
    "rollout/generated_tokens": "rollout/generated_tokens_per_response",  # a tree's leaves share prefixes
    "rollout/response_tokens": "rollout/tokens_per_response",
    "tree/branch_points": "tree/branch_points_per_leaf",
    "tree/depth": "tree/depth",
    "tools/calls": "tools/calls_per_response",
    "tools/turns": "tools/turns_per_response",
    "tools/failed_calls": "tools/failed_calls_per_response",
}
_WAIT_KEYS = ("time/reward_wait_s", "time/generation_s", "time/process_s")


def _start_run(cfg: Config, run_dir: Path) -> None:
    set_threads(cfg.trainer.threads)  # at most the usable CPUs; STEPCREDIT_THREADS overrides
    seed_everything(cfg.trainer.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def _last_step(cfg: Config, done: int) -> int:
    """The last RL step of this invocation (``trainer.stop_after_steps`` ends it early, resumable)."""
    if cfg.trainer.stop_after_steps:
        return min(cfg.trainer.steps, done + cfg.trainer.stop_after_steps)
    return cfg.trainer.steps


def _validate(
    state: TrainState,
    val_set: list[Sample],
    rewarder: Rewarder,
    log: MetricsLogger,
    history: ValHistory,
    step: int,
) -> dict[str, float]:
    """Validation by tag (``val/accuracy_greedy``, or ``val/accuracy_sampled`` when
    ``rollout.val_temperature > 0``; ``val/accuracy`` is its older name); the answers go to
    ``samples.jsonl`` with their step, the per-prompt verdicts to ``validation.jsonl``."""
    cfg = state.cfg
    if cfg.trainer.val_every <= 0:
        return {}
    # Common random numbers: sampled validation (rollout.val_temperature > 0) draws each prompt's answer
    # from a random stream of its own, keyed (trainer.seed, step, prompt index) (rollout/sampling.py),
    # so two variants of one seed are scored with the same random numbers row by row: identical models
    # give identical answers, and a row that ends earlier never shifts another row's draws (their paired
    # difference loses most of the sampling noise). The fork keeps validation off the training run's
    # random stream (val_every changes nothing else; tool rollouts still draw from the forked stream).
    t0 = time.perf_counter()
    with torch.random.fork_rng():
        torch.manual_seed(cfg.trainer.seed * 1_000_003 + step)
        metrics, rows = validate(
            state.model,
            state.tok,
            val_set,
            rewarder,
            max_new_tokens=cfg.rollout.max_new_tokens,
            temperature=cfg.rollout.val_temperature,
            tools=tool_context(cfg, rewarder),
            row_seeds=[row_key(cfg.trainer.seed, step, i) for i in range(len(val_set))],
            progress=TrainingProgress(global_step=step, max_steps=cfg.trainer.steps),
        )
    if not rows:
        return metrics
    kind = "sampled" if cfg.rollout.val_temperature > 0 else "greedy"
    metrics[f"val/accuracy_{kind}"] = metrics["val/accuracy"]
    metrics["time/val_s"] = time.perf_counter() - t0  # inside the step's time: compute accounts take it out
    history.add(step, [is_correct(RewardResult(r["score"], Status(r["status"]))) for r in rows], kind)
    log.log_samples(step, "val", rows)
    return metrics


def _announce(cfg: Config, run_dir: Path, model: Any, sources: list[str], n_train: int, n_val: int) -> None:
    """The start-up banner on stdout (:func:`~stepcredit.trainer.progress.banner_lines`), and on stderr
    a warning when the run ends inside its learning-rate warm-up."""
    tools = ROLLOUT_MODES.get(cfg.rollout.mode).uses_tools
    for line in banner_lines(cfg, run_dir, model, sources=sources, n_train=n_train, n_val=n_val, tools=tools):
        print(line, flush=True)
    o = cfg.optim
    if warning := short_run_warning(steps=cfg.trainer.steps, warmup=o.warmup_steps, lr=o.lr):
        print(warning, file=sys.stderr, flush=True)


def _scored(arrived: list[Batch]) -> tuple[list[Sample], list[str], list[RewardResult]]:
    """The step's scored responses as three parallel lists (samples, texts, results)."""
    samples = [s for b in arrived for s in b.samples]
    texts = [t for b in arrived for t in b.texts]
    return samples, texts, [r for b in arrived for r in b.rewards or []]


def _generations(arrived: list[Batch], n: int) -> list[dict[str, Any]]:
    """The first ``n`` scored training completions of a step, as ``samples.jsonl`` rows."""
    out: list[dict[str, Any]] = []
    for b in arrived:
        for s, t, r in zip(b.samples, b.texts, b.rewards or [], strict=True):
            if len(out) >= n:
                return out
            out.append(
                {
                    "prompt": s.prompt[-1]["content"] if s.prompt else "",
                    "response": t,
                    "ground_truth": s.ground_truth,
                    "score": r.score,
                    "status": r.status.value,
                }
            )
    return out


def log_row(log: MetricsLogger, bar: Progress, row: dict[str, Any], t_step: float | None = None) -> None:
    """Finish a row (step time, throughput, memory), write it and show it."""
    if t_step is not None:
        row["time/step_s"] = step_s = time.perf_counter() - t_step
        row["tokens_per_s"] = row.pop("_tokens") / step_s
        row["memory/peak_rss_mb"] = peak_rss_mb()
    log.log(row)
    bar.update(int(row["step"]), row)


def _step_row(
    state: TrainState,
    current: Batch,
    arrived: list[Batch],
    counts: StepMetrics,
    prepared: list[Prepared],
    agent_metrics: dict[str, float],
    t_step: float,
) -> dict[str, Any]:
    """The step's metrics row: reward figures of every scored response, the update metrics, the
    agent's figures and the sample accounting (generated = trained + dropped, each drop with its reason)."""
    row: dict[str, Any] = {
        "step": state.step,
        "staleness": float(state.step - 1 - current.policy_version),
        "kl_coef": state.kl_ctl.value,
        **batch_metrics(scored := Batch.concat(arrived), per_domain=bool(state.cfg.data.domains)),
        **state.zero_pass.update(scored),
        **agent_metrics,
        **counts.result(),
        "samples/trained": float(sum(len(p.batch) for p in prepared)),
        # mini-batches trained this step (dynamic sampling buffers kept groups up to pipeline.mini_batch)
        "samples/mini_batches": float(len(prepared)),
        "samples/dropped_failed": float(sum(p.dropped for p in prepared)),
        "_tokens": float(sum(int(b.response_mask_BT.sum()) for b in arrived)),
    }
    # the mean score of this step's sampled (rollout.temperature) responses; "reward/mean" is its older name
    row["train/reward_sampled"] = row["reward/mean"]
    row["time/reward_s"] = row.get("time/reward_wait_s", 0.0)
    # compute accounting (docs/experiments.md): tokens sampled from the policy this step, rollouts (a
    # tree's shared prefixes once, dynamic sampling's refills included) plus the process stage's
    # continuations, and their running total over the run (checkpointed, so a resumed run continues it)
    row["generated/step_tokens"] = row.get("rollout/generated_tokens", 0.0) + row.get(
        "process/generated_tokens", 0.0
    )
    state.generated_tokens += row["generated/step_tokens"]
    row["generated_tokens"] = state.generated_tokens
    if responses := row.pop("rollout/responses", 0.0):  # this step's rollouts' counters, per response
        for key, name in _PER_RESPONSE.items():
            if key in row:
                row[name] = row.pop(key) / responses
    row["samples/dropped"] = sum(
        row.get(f"samples/dropped_{why}", 0.0) for why in ("failed", "no_signal", "surplus")
    )
    row["time/update_s"] = time.perf_counter() - t_step - sum(row.get(k, 0.0) for k in _WAIT_KEYS)
    return row


def check_config(cfg: Config) -> None:
    """Every start-up check, so a bad combination fails before any work (exit 2), not mid-run. The
    checks that involve an extension ask its registry entry (capabilities as metadata), never its name."""
    advantages.check_config(cfg)
    losses.check_config(cfg)
    process.check_config(cfg)
    rollout.check_config(cfg)
    shaping.check_config(cfg)
    mode = ROLLOUT_MODES.get(cfg.rollout.mode)  # an unknown mode: one line with the valid ones
    spec = VALUE_ESTIMATORS.get(cfg.process.value_estimator)
    if cfg.process.enabled and spec.from_outcomes and not mode.shares_prefixes:
        ok = ", ".join(n for n in ROLLOUT_MODES if ROLLOUT_MODES.get(n).shares_prefixes)
        raise ConfigError(
            f"config key rollout.mode: process.value_estimator={cfg.process.value_estimator} values the "
            f"nodes of a rollout whose responses share prefixes; use rollout.mode={ok}, not {cfg.rollout.mode!r}"
        )
    ds = cfg.postprocess.dynamic_sampling
    drops_equal = ds.criterion == "std" or (ds.mean_low >= 0.0 and ds.mean_high <= 1.0)
    if cfg.process.enabled and cfg.process.credit_groups == "all_equal" and ds.enabled and drops_equal:
        raise ConfigError(
            "config key process.credit_groups: all_equal credits only groups whose outcomes are all equal, "
            "and postprocess.dynamic_sampling drops every such group; turn one of them off"
        )
    backends.check_config(cfg.reward)
    LR_SCHEDULES.require(cfg.optim.schedule, "optim.schedule")
    if cfg.pipeline.one_step_off_policy and not losses.LOSSES.get(cfg.loss.name).corrects_staleness:
        ok = ", ".join(n for n in losses.LOSSES if losses.LOSSES.get(n).corrects_staleness)
        raise ConfigError(
            f"config key loss.name: pipeline.one_step_off_policy=true trains on 1-step-stale data; use a loss "
            f"that corrects for it ({ok}), not {cfg.loss.name!r}"
        )
    if cfg.critic.warmup > 0 and not cfg.algorithm.use_critic:
        raise ConfigError(
            "config key critic.warmup: there is no critic to warm up; set algorithm.use_critic=true"
        )
    for d in cfg.postprocess.domains:
        if cfg.data.domains and d not in cfg.data.domains:
            raise ConfigError(
                f"config key postprocess.domains.{d}: not a domain of data.domains ({', '.join(cfg.data.domains)})"
            )
    known = list(cfg.data.domains) or ["default"]
    for d in cfg.process.domains:
        if d not in known:
            raise ConfigError(
                f"config key process.domains: {d!r} is not a domain of the data ({', '.join(known)})"
            )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _resume_state(run_dir: Path) -> dict[str, Any]:
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise UserError(f"--resume {run_dir}: no checkpoint found under {run_dir / 'checkpoints'}")
    return load_checkpoint(ckpt)
