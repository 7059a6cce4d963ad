"""Imports every built-in reward module so that each registers itself in ``REWARDS``.

Add one import line here per new built-in module (the pool's workers import this module too). Each
line imports the module by its full name (``import stepcredit.reward.x``), not through the package
(``from stepcredit.reward import x`` would import ``stepcredit.reward``, which imports this module:
a cycle).
"""

import stepcredit.reward.custom  # reward.custom.style=trl
import stepcredit.reward.scorers.judge  # LLM judge: data_source judge
import stepcredit.reward.scorers.reward_model  # reward models: reward_model.style model
import stepcredit.reward.tools  # style tool: multi-turn rollouts' tool calls; arith_tools
import stepcredit.reward.verifiers.code.sandbox  # data_source code, VeRL's code sources
import stepcredit.reward.verifiers.ifeval  # ifeval: IFEval's instruction constraints
import stepcredit.reward.verifiers.math  # math, gsm8k, MATH, arith, ...
import stepcredit.reward.verifiers.multiple_choice  # noqa: F401  multiple_choice, mmlu*, gpqa*, ...
