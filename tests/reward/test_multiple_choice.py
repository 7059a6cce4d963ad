"""The multiple-choice verifier on hand-labelled responses in the forms models write: each case says
which single option the response's final answer names (or that it names several, or none)."""

from __future__ import annotations

import pytest

from stepcredit.reward.verifiers.multiple_choice import extract_choice, gold_letter, mc_compute_score
from stepcredit.types import Status

OPTS = ["Berlin", "Madrid", "Paris", "Rome"]
MULTI = "MULTI"
NONE = "NONE"

# (response, what its final answer names: a letter, MULTI for several options, NONE for none)
CASES = [
    ("(C)", "C"),
    ("C.", "C"),
    ("C)", "C"),
    ("C", "C"),
    ("**C**", "C"),
    ("The answer is C", "C"),
    ("The answer is (C).", "C"),
    ("Answer: C", "C"),
    ("answer: c", "C"),  # a lone lower-case letter other than a, i, v, x is no word: the option
    ("Final Answer: **C**", "C"),
    ("The correct option is C: Paris.", "C"),
    ("\\boxed{C}", "C"),
    ("So we get \\boxed{\\text{C}}.", "C"),
    ("$\\boxed{(C)}$", "C"),
    ("The capital of France is Paris, so the answer is Paris.", "C"),
    ("I choose C because Paris is the capital.", "C"),
    ("Is it B or C? I'll say C.", "C"),  # "I'd/I'll/I would say" names the pick (was unparseable)
    ("Hmm. I'd say (C).", "C"),
    ("Therefore, the correct answer is option C.", "C"),
    ("The answer is: [C]", "C"),
    ("Let me think.\nA is Germany's capital. B is Spain's. D is Italy's.\nSo the answer is C.", "C"),
    ("Option A is wrong, option B is wrong.\nAnswer: C", "C"),
    ("<think>Maybe the answer is A? No.</think>The answer is C.", "C"),
    ("The answer is A.\nWait, that is Berlin. Actually, the answer is C.", "C"),
    ("Paris", "C"),
    ("Reasoning...\n\nC. Paris", "C"),
    ("The answer is A or B.", MULTI),
    ("Answer: A and C", MULTI),
    ("The answer is either B or C.", MULTI),
    ("\\boxed{AC}", MULTI),
    ("\\boxed{A, C}", MULTI),
    ("Final answer: C/D", MULTI),
    ("It could be A, but also C. Answer: A or C", MULTI),
    ("I am not sure.", NONE),
    ("", NONE),
    ("A capital city is a city that hosts the government.", NONE),
    ("The answer is E.", NONE),  # four options: E is no option
    ("The answer is B, not C.", "B"),
    ("Both A and C are capitals, but the question asks for France: \\boxed{C}", "C"),
    ("**Answer:** (D) Rome", "D"),
    ("The best answer is D", "D"),
    ("Answer: Berlin", "A"),
]


@pytest.mark.parametrize(("response", "label"), CASES)
def test_hand_labelled_forms(response: str, label: str) -> None:
    _extracts(response, label)


def _extracts(response: str, label: str) -> None:
    """``extract_choice`` reads ``response`` as ``label``: one letter, none, or several (MULTI)."""
    got, how = extract_choice(response, letters="ABCD", options=dict(zip("ABCD", OPTS, strict=True)))
    if label == NONE:
        assert got == [], (got, how)
    elif label == MULTI:
        assert len(got) >= 2, (got, how)
    else:
        assert got == [label], (got, how)


@pytest.mark.parametrize(("response", "label"), CASES)
def test_scores_follow_the_labels(response: str, label: str) -> None:
    # gold C: only a single C scores; several options are wrong even when C is among them
    r = mc_compute_score("multiple_choice", response, "C", {"options": OPTS})
    assert r.score == (1.0 if label == "C" else 0.0)
    assert r.status == (Status.UNPARSEABLE if label == NONE else Status.OK)
    assert r.ok
    if label == MULTI:
        assert r.info["multiple"] is True


def test_ten_and_more_options() -> None:
    # MMLU-Pro has ten options (A-J); beyond J the letters go on, bounded by the row's options
    opts = [f"value {i}" for i in range(12)]
    assert mc_compute_score("mmlu_pro", "The answer is (J).", "J", {"options": opts}).score == 1.0
    assert mc_compute_score("mmlu_pro", "Answer: L", 11, {"options": opts}).score == 1.0
    assert mc_compute_score("mmlu_pro", "Answer: M", "L", {"options": opts}).status == Status.UNPARSEABLE
    # without options every letter A-Z is valid
    assert mc_compute_score("multiple_choice", "\\boxed{Q}", "Q").score == 1.0


def test_ground_truth_forms() -> None:
    o = dict(zip("ABCD", OPTS, strict=True))
    assert gold_letter("C", o) == gold_letter("(C)", o) == gold_letter(2, o) == gold_letter("Paris", o) == "C"
    assert gold_letter({"answer": "C", "options": OPTS}, None) == "C"
    # numpy keys, as a parquet row or a VeRL batch carries them (an ERROR before)
    import numpy as np

    assert gold_letter(np.int64(2), o) == gold_letter(np.array([2]), o) == gold_letter(np.str_("C"), o) == "C"
    r = mc_compute_score("multiple_choice", "C", {"answer": 2, "choices": OPTS})
    assert r.score == 1.0
    # a key that names no option is the row's fault: an error, never a silent 0
    bad = mc_compute_score("multiple_choice", "C", "E", {"options": OPTS})
    assert bad.status == Status.ERROR and not bad.ok


# Audit against a careful grader (simple-evals' ANSWER_PATTERN_MULTICHOICE, lm-eval's multi_choice_regex, a
# human reading the final answer), gold B, four options. Each was scored before the fix as noted.
@pytest.mark.parametrize(
    ("response", "label"),
    [
        # false positives fixed: several final answers read as one
        ("$\\boxed{A}$ or $\\boxed{B}$", MULTI),  # was B: two boxes joined by "or" are a hedge
        ("\\boxed{A} \\boxed{B}", MULTI),  # was B: two boxes side by side
        ("\\boxed{A}, \\boxed{B}", MULTI),  # was B
        ("The answer is B, but it could also be A.", MULTI),  # was B: a second answer offered
        ("Answer: B (A is also acceptable)", MULTI),  # was B
        ("The answer is B, though C is also possible.", MULTI),  # was B
        ("Answer: \\boxed{A} \\quad \\boxed{B}", MULTI),  # was B
        ("Answer: A\u2013B", NONE),  # was A: an en-dash range of options, as "A-B" already was
        # false negatives fixed: a lone lower-case letter (no English word) is the option
        ("Answer: b", "B"),  # was none (simple-evals' (?i) pattern matches it too)
        ("The answer is b.", "B"),  # was none
        ("b", "B"),  # was none
        ("**b**", "B"),  # was none
        # unchanged, checked
        ("(B)", "B"),
        ("B.", "B"),
        ("**B**", "B"),
        ("Answer: B", "B"),
        ("The correct option is B", "B"),
        ("\\boxed{B}", "B"),
        ("Madrid", "B"),
        ("\\boxed{A}\n\nWait, that is wrong. \\boxed{B}", "B"),  # a later box after text corrects
        ("\\boxed{B} or \\boxed{B}", "B"),  # the same answer twice
        ("The answer is B; it could not be A.", "B"),
        ("The answer is B (not A).", "B"),
        ("The answer is A or B.", MULTI),
        ("Answer: A/B", MULTI),
        ("The answer is not A.", NONE),  # a negation names no answer
        ("not A", NONE),
        ("The answer is neither A nor B.", NONE),
        ("The answer is a.", NONE),  # "a" may be the article: abstain
        ("The answer is a prime number.", NONE),
        ("The answer is x.", NONE),  # "x" is a variable or a roman numeral, never read as an option
        ("Answer: A-B", NONE),
    ],
)
def test_careful_grader_audit(response: str, label: str) -> None:
    _extracts(response, label)
    r = mc_compute_score("multiple_choice", response, "B", {"options": OPTS})
    assert r.score == (1.0 if label == "B" else 0.0)
