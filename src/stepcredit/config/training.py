"""Settings of the update and the loop: loss, optimiser, supervised warm-up, pipeline and trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stepcredit.config.checks import _check, check_bounds, check_choices


# ------------------------------------------------------------------------------------------ loss
@dataclass(frozen=True)
class LossConfig:
    name: str = "ppo_clip"
    """Name of the policy loss (see ``stepcredit.losses``)."""
    clip_low: float = 0.2
    """PPO clip range below 1 (ratio >= 1 - clip_low)."""
    clip_high: float = 0.2
    """PPO clip range above 1 (ratio <= 1 + clip_high)."""
    agg: str = "token-mean"
    """Loss aggregation: token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm."""
    kl_coef: float = 0.02
    """Weight of the KL-to-reference loss term (0 disables the reference model)."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3 (low variance)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    dual_clip_c: float = 3.0
    """Dual-clip bound on the loss of negative-advantage tokens (Ye et al. 2020); 0 disables, else > 1."""
    agg_norm_len: int = 0
    """Constant length L of seq-mean-token-sum-norm (Dr. GRPO); 0 = the padded length T (as verl)."""
    kl_in_reward: bool = False
    """Apply the KL as a penalty on token rewards (apply_kl_penalty) instead of as a loss term."""
    kl_ctrl: Literal["fixed", "adaptive"] = "fixed"
    """KL coefficient controller: fixed, or adaptive (Ziegler et al. 2019)."""
    kl_target: float = 0.1
    """Adaptive KL controller: target KL."""
    kl_horizon: int = 10000
    """Adaptive KL controller: horizon (samples) of the proportional update."""
    behav_weight_cap: float = 0.0
    """decoupled_ppo: truncate the importance weight pi_prox/pi_behaviour at this value (0 = no cap)."""
    tis_cap: float = 2.0
    """An external rollout engine (vLLM): weight each token's loss by min(pi_trainer / pi_engine, C),
    C = this (truncated importance sampling for the engines' numeric mismatch); 0 = no correction."""

    def __post_init__(self) -> None:
        _check(self.clip_low >= 0 and self.clip_high >= 0, "loss.clip_low", "clip ranges must be >= 0")
        check_bounds(
            self,
            "loss",
            at_least_0=("kl_coef", "agg_norm_len", "behav_weight_cap"),
            above_0=("kl_target", "kl_horizon"),
        )
        aggs = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
        _check(self.agg in aggs, "loss.agg", f"one of {', '.join(aggs)}")
        _check(self.dual_clip_c == 0 or self.dual_clip_c > 1, "loss.dual_clip_c", "0 (off) or > 1")
        check_choices(self, "loss")
        _check(self.tis_cap >= 0, "loss.tis_cap", "must be >= 0 (0 = no correction)")


# ----------------------------------------------------------------------------------------- optim
@dataclass(frozen=True)
class OptimConfig:
    lr: float = 2e-5
    """AdamW learning rate of the RL phase."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    warmup_steps: int = 10
    """RL steps over which the learning rate rises linearly from lr/warmup_steps to lr (reached at this
    step); the schedule starts after them. A run with fewer steps never reaches lr (warned at start-up)."""
    schedule: str = "constant"
    """Learning-rate schedule of the RL phase after the warm-up (``stepcredit.trainer.schedule.
    LR_SCHEDULES``): ``constant``, or ``cosine`` (decay to ``min_lr_ratio`` x lr at ``trainer.steps``)."""
    min_lr_ratio: float = 0.1
    """The cosine schedule's floor, as a fraction of ``lr``."""

    def __post_init__(self) -> None:
        check_bounds(self, "optim", above_0=("lr",))
        _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", "between 0 and 1")
        _check(len(self.betas) == 2, "optim.betas", "two numbers")


# ------------------------------------------------------------------------------------------- sft
@dataclass(frozen=True)
class SFTConfig:
    steps: int = 300
    """Supervised warm-up steps on the task's reference traces before RL (0 skips SFT)."""
    batch_size: int = 32
    """Traces per SFT step."""
    lr: float = 2e-3
    """AdamW learning rate of SFT (cosine decay to 10%)."""

    def __post_init__(self) -> None:
        check_bounds(self, "sft", at_least_0=("steps",), at_least_1=("batch_size",))


# -------------------------------------------------------------------------------------- pipeline
@dataclass(frozen=True)
class PipelineConfig:
    mini_batch: int = 0
    """Responses per policy update; 0 = the whole batch in one update."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    one_step_off_policy: bool = False
    """Generate step t+1 while step t's rewards are computed and its updates run (data 1 step stale;
    needs a loss registered as correcting for it: ``loss.name=decoupled_ppo`` or ``topr``)."""
    max_staleness: int = 1
    """Largest allowed policy lag (in RL steps) of a batch; a staler batch is regenerated."""

    def __post_init__(self) -> None:
        check_bounds(self, "pipeline", at_least_0=("mini_batch", "max_staleness"), at_least_1=("ppo_epochs",))
        _check(
            not self.one_step_off_policy or self.max_staleness >= 1,
            "pipeline.max_staleness",
            "must be >= 1 with pipeline.one_step_off_policy=true",
        )


# --------------------------------------------------------------------------------------- trainer
@dataclass(frozen=True)
class TrainerConfig:
    steps: int = 60
    """RL steps."""
    seed: int = 0
    """Seed of model init, sampling and data order."""
    val_every: int = 20
    """Validate every this many steps (and before the first and after the last); 0 disables."""
    save_every: int = 20
    """Write a checkpoint every this many steps (and at the end); 0 disables."""
    threads: int = 2
    """torch intra-op threads; 0: every CPU this process may run on (its affinity). Never more than
    those; the environment variable STEPCREDIT_THREADS overrides it. The command line also chooses how OpenMP's
    idle threads wait (a short spin on a quiet machine, sleeping at once beside other busy work, unless
    OMP_WAIT_POLICY or GOMP_SPINCOUNT is set), so a busy machine slows a run about in proportion to the
    cores it gets (stepcredit.runtime)."""
    device: str = "cpu"
    """Where the policy, reference, critic, rollout and process values run: ``cpu``, ``cuda``
    (``cuda:N``) or ``auto`` (the GPU when there is one); ``model.dtype=bfloat16`` for bf16."""
    progress: bool = True
    """Show a live progress bar."""
    tensorboard: bool = True
    """Write TensorBoard events when tensorboard is installed."""
    wandb: bool = False
    """Log every step's scalars and the config to Weights & Biases (the ``wandb`` extra)."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """``offline`` (files under ``RUN_DIR/wandb``, no network; ``wandb sync`` uploads them later) or
    ``online``."""
    wandb_project: str = "stepcredit"
    """The W&B project; the run is named after the run directory."""
    stop_after_steps: int = 0
    """Stop after this many RL steps of this invocation (0 = run to ``steps``), leaving the run
    resumable exactly as a preempted job would (``--resume DIR`` continues it)."""
    generations_to_log: int = 4
    """Completions (with step and scores) shown per validation in TensorBoard text and a W&B table (verl's ``val_generations_to_log``)."""
    generations_every: int = 0
    """Every this many RL steps also log ``generations_to_log`` sampled training completions (samples.jsonl, TensorBoard, W&B); 0: never."""

    def __post_init__(self) -> None:
        check_bounds(self, "trainer", at_least_0=("steps", "stop_after_steps"))
        _check(self.threads >= 0, "trainer.threads", "must be >= 0 (0: every usable CPU)")
        _check(
            self.generations_to_log >= 0 and self.generations_every >= 0,
            "trainer.generations_to_log",
            "generations_to_log and generations_every must be >= 0",
        )
        _check(
            self.device in ("cpu", "auto") or self.device.split(":")[0] == "cuda",
            "trainer.device",
            "cpu, cuda, cuda:N or auto",
        )
        _check(self.val_every >= 0 and self.save_every >= 0, "trainer.val_every", "must be >= 0")
        check_choices(self, "trainer")
