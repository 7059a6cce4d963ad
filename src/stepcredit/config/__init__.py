"""One tree of frozen dataclasses: the only place a setting is defined and documented.

The tree is split by stage (:mod:`.generation`: model, data, rollout; :mod:`.reward`; :mod:`.credit`:
process, algorithm, postprocess, critic; :mod:`.training`: loss, optim, sft, pipeline, trainer; :mod:`.root`),
beside the loader (:mod:`.loader`) and judge-template parsing (:mod:`.judge_template`); everything is
imported from here: ``from stepcredit.config import RewardConfig, from_dict``.

Each field has a one-line docstring under it. Validation lives in ``__post_init__``; merging YAML
presets with command-line overrides happens only in :mod:`stepcredit.cli`. :func:`from_dict` turns a
nested mapping into the tree and rejects unknown keys with the list of close valid ones.
"""

from __future__ import annotations

from stepcredit.config.checks import _check
from stepcredit.config.credit import (
    AlgorithmConfig,
    CriticConfig,
    DynamicSamplingConfig,
    LengthPenaltyConfig,
    OutcomeProcessConfig,
    PostprocessConfig,
    ProcessConfig,
)
from stepcredit.config.generation import (
    ArithConfig,
    DataConfig,
    DomainDataConfig,
    LoRAConfig,
    ModelConfig,
    RolloutConfig,
    TinyModelConfig,
    TreeConfig,
    VLLMConfig,
)
from stepcredit.config.judge_template import JUDGE_FIELD_RE, JUDGE_FIELDS, check_judge_template
from stepcredit.config.loader import (
    _NUMBER,
    _build,
    _coerce,
    _number,
    all_keys,
    from_dict,
    to_dict,
    tree_source,
)
from stepcredit.config.reward import (
    AgentConfig,
    BreakerConfig,
    JudgeConfig,
    RewardConfig,
    RewardCustomConfig,
    RewardDomainConfig,
    RewardModelConfig,
    SandboxConfig,
)
from stepcredit.config.root import Config
from stepcredit.config.training import LossConfig, OptimConfig, PipelineConfig, SFTConfig, TrainerConfig

__all__ = [
    "JUDGE_FIELDS",
    "JUDGE_FIELD_RE",
    "_NUMBER",
    "AgentConfig",
    "AlgorithmConfig",
    "ArithConfig",
    "BreakerConfig",
    "Config",
    "CriticConfig",
    "DataConfig",
    "DomainDataConfig",
    "DynamicSamplingConfig",
    "JudgeConfig",
    "LengthPenaltyConfig",
    "LoRAConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "OutcomeProcessConfig",
    "PipelineConfig",
    "PostprocessConfig",
    "ProcessConfig",
    "RewardConfig",
    "RewardCustomConfig",
    "RewardDomainConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "SFTConfig",
    "SandboxConfig",
    "TinyModelConfig",
    "TrainerConfig",
    "TreeConfig",
    "VLLMConfig",
    "_build",
    "_check",
    "_coerce",
    "_number",
    "all_keys",
    "check_judge_template",
    "from_dict",
    "to_dict",
    "tree_source",
]
