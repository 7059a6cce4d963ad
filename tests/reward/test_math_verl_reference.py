"""The math verifier against a careful grader's labels on responses VeRL's and lm-eval's graders also score.

``data/verl_math_reference.json`` holds realistic GSM8K, MATH-500 and DAPO-style responses with our label
and the verdicts of verl 0.9.1's ``reward_score`` functions (``gsm8k`` strict and flexible, ``math_reward``,
``math_dapo``, ``prime_math``) and lm-eval's GSM8K filters, written by ``data/make_verl_math_reference.py``
(its docstring says how; this test needs neither verl nor that script). Where a reference disagrees
with us, the label decides: the verifier must give the label on every case except those in
``LEFT_ALONE``, each with its reason.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stepcredit.reward.verifiers.math import math_compute_score

DATA = json.loads((Path(__file__).parent / "data" / "verl_math_reference.json").read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = DATA["cases"]
SOURCES = {"gsm8k": "openai/gsm8k", "math500": "HuggingFaceH4/MATH-500", "dapo": "math_dapo"}

# (gold, response) -> why our verdict is not the label. Every reference agrees with us on these except the
# unfinished <think>, where math-verify and prime_math do too.
LEFT_ALONE = {
    ("18", "The answer is eighteen."): "numbers in words are not read (no reference reads them either)",
    (
        "18",
        "Janet makes eighteen dollars a day.",
    ): "numbers in words are not read, and this one has no anchor",
    (
        "70000",
        "He made a profit of $70k.",
    ): "a 'k' suffix is not read as thousands: 2k is a term in MATH answers",
    (
        "(-\\infty, 2) \\cup (3, \\infty)",
        "So $\\boxed{x<2 \\text{ or } x>3}$.",
    ): "a disjunction of inequalities is not read as a union of intervals (one inequality is; math-verify reads neither)",
    (
        "46",
        "<think>It is 46, I believe. Let me check again",
    ): "flexible mode reads an unfinished <think> as math-verify does (docs/verifiers.md); strict mode says unparseable",
}


def _id(c: dict[str, Any]) -> str:
    return f"{c['source']}:{c['gold']}:{c['response'][:40]}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_the_verdict_is_the_label(case: dict[str, Any]) -> None:
    got = math_compute_score(SOURCES[case["source"]], case["response"], case["gold"]).score == 1.0
    key = (case["gold"], case["response"])
    if key in LEFT_ALONE:
        assert got != case["label"], f"fixed: remove it from LEFT_ALONE ({LEFT_ALONE[key]})"
    else:
        assert got == case["label"], case["note"] or "see the label"


def test_the_set_is_broad_and_the_references_disagree_with_the_labels() -> None:
    assert Counter(c["source"] for c in CASES) >= Counter({"gsm8k": 60, "math500": 150, "dapo": 35})
    assert all(isinstance(c["label"], bool) for c in CASES)
    assert {k for k in LEFT_ALONE} <= {(c["gold"], c["response"]) for c in CASES}
    # the references are no oracle here: each is wrong on some labelled case (the counts are in the report)
    for ref in (
        "verl_gsm8k_strict",
        "verl_gsm8k_flexible",
        "lm_eval_strict",
        "lm_eval_flexible",
        "verl_math",
        "verl_math_dapo",
        "verl_prime_math",
    ):
        assert any(
            ref in c["refs"] and c["refs"][ref] is not None and c["refs"][ref] != c["label"] for c in CASES
        )
