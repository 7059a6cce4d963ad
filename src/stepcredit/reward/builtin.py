"""Imports every built-in reward module so that each registers itself in ``REWARDS``.

Add one import line here per new built-in module (the pool's workers import this module too).
"""

from stepcredit.reward import math_verifier  # noqa: F401
