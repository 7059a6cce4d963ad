"""Trainer: SFT warm-up, the RL loop, validation, metrics and checkpoints."""

from stepcredit.trainer.loop import check_config, train

__all__ = ["check_config", "train"]
