"""Imports every built-in reward module so that each registers itself in ``REWARDS``.

Add one import line here per new built-in module (the pool's workers import this module too).
"""

import stepcredit.reward.custom  # noqa: F401  (reward.custom.style=trl; not via the package: its __init__ imports this module)
from stepcredit.reward.scorers import (  # noqa: F401  (each module registers itself)
    judge,  # LLM judge: data_source judge
    reward_model,  # reward models: reward_model.style model
)
from stepcredit.reward.verifiers import (
    ifeval,  # noqa: F401  (ifeval: IFEval's instruction constraints)
    math,  # noqa: F401  (math, gsm8k, MATH, arith, ...)
    multiple_choice,  # noqa: F401  (multiple_choice, mmlu*, gpqa*, ...)
)
from stepcredit.reward.verifiers.code import sandbox  # noqa: F401  (data_source code, VeRL's code sources)
