"""Imports every built-in reward module so that each registers itself in ``REWARDS``.

Add one import line here per new built-in module (the pool's workers import this module too).
"""

from stepcredit.reward import (  # noqa: F401  (each module registers itself)
    judge,  # LLM judge: data_source judge
    math_verifier,
    reward_model,  # reward models: reward_model.style model
    sandbox,  # code sandbox: data_source code (and VeRL's code sources)
)
