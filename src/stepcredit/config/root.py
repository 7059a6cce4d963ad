"""The root of the config tree: one field per stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from stepcredit.config.credit import AlgorithmConfig, CriticConfig, PostprocessConfig, ProcessConfig
from stepcredit.config.generation import DataConfig, ModelConfig, RolloutConfig
from stepcredit.config.reward import RewardConfig
from stepcredit.config.training import LossConfig, OptimConfig, PipelineConfig, SFTConfig, TrainerConfig


# ------------------------------------------------------------------------------------------ root
@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy (and reference) model."""
    data: DataConfig = field(default_factory=DataConfig)
    """Where prompts come from."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Verifiers, judges, sandboxes and the failure policy."""
    process: ProcessConfig = field(default_factory=ProcessConfig)
    """Training-free process rewards."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimation."""
    postprocess: PostprocessConfig = field(default_factory=PostprocessConfig)
    """Per-domain outcome processing (masking, normalisation, clipping, scaling) and dynamic sampling."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (when ``algorithm.use_critic``)."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Policy loss, KL and entropy terms."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser of the RL phase."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised warm-up."""
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    """Mini-batching, pipelining and off-policy overlap."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The loop: steps, validation, checkpoints."""
