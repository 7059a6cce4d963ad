"""The synthetic ``code`` task: write a one-line Python function from a one-line spec.

"Write a Python function add3(x) that returns x + 3." The response is a fenced Python block; the
ground truth is VeRL's ``{"assert_case": [...]}`` format, so the code sandbox (data_source ``code``)
scores it as the share of asserts that pass. The SFT trace (``extra_info["solution"]``) is the
reference function, so the tiny model learns the format and the arithmetic after a short warm-up.
Generation is deterministic by seed.
"""

from __future__ import annotations

import random
from typing import Any

DATA_SOURCE = "code"

# (name stem, expression); the function is ``{stem}{k}(x)`` returning the expression
_OPS = [("add", "x + {k}"), ("sub", "x - {k}"), ("mul", "x * {k}")]
_TEST_XS = (0, 1, 5, -3)


def make_problem(rng: random.Random) -> tuple[str, str, list[str]]:
    """(question, reference solution, assert statements) of one problem."""
    stem, phrase = rng.choice(_OPS)
    k = rng.randint(2, 12)
    fn = f"{stem}{k}"
    expr = phrase.format(k=k)
    question = f"Write a Python function {fn}(x) that returns {expr}."
    solution = f"```python\ndef {fn}(x):\n    return {expr}\n```"
    asserts = [f"assert {fn}({x}) == {eval(expr, {}, {'x': x})}" for x in _TEST_XS]  # our own literal
    return question, solution, asserts


def make_rows(n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` rows in the verl parquet schema; train and validation splits use disjoint seeds."""
    salt = {"train": 11, "val": 1_000_033, "test": 2_000_039}.get(split, 3_000_047)
    rng = random.Random(seed * 7_919 + salt)
    rows = []
    for i in range(n):
        question, solution, asserts = make_problem(rng)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question}],
                "ability": "code",
                "reward_model": {"style": "rule", "ground_truth": {"assert_case": asserts}},
                "extra_info": {"split": split, "index": i, "solution": solution},
            }
        )
    return rows
