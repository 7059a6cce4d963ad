"""The multiple-choice verifier against answers written to hedge, and correct answers written in common forms.

The verifier's rule is one answer only ("A or B" is wrong). The hedges below named several options in
forms the joining patterns missed and were read as their first option (input -> score 1 before).
"""

from __future__ import annotations

import pytest

from stepcredit.reward.verifiers.multiple_choice import mc_compute_score

ROW = {"answer": "A", "options": ["Paris", "London", "Berlin", "Madrid"]}


def _score(response: str, gold: str = "A") -> float:
    return mc_compute_score("mc", response, {**ROW, "answer": gold}).score


@pytest.mark.parametrize(
    "response",
    [
        "Answer: A or maybe B",
        "Answer: A (or possibly C)",
        "Answer: A, or perhaps B",
        "Answer: A; B",
        "Answer: A | B",
        "Answer: (A)(B)",
        "The answer is [A][B]",
        "Answer: A (Paris) or B (London)",
        "The answer is Paris or London.",  # option texts joined: a hedge too
        "The answer is Paris and London",
        # every option listed after the answer phrase, with no joining word
        "Answer: A. B. C. D.",
        "Answer: A. B.",
        "Answer: (A) (B) (C) (D)",
        "Answer: A) B) C)",
    ],
)
def test_a_hedge_between_options_is_wrong(response: str) -> None:
    r = mc_compute_score("mc", response, ROW)
    assert r.score == 0.0 and r.info["multiple"], response


@pytest.mark.parametrize(
    "response",
    [
        "The answer is A or B",
        "The answer is A, B, C, D",
        "\\boxed{ABCD}",
        "Answer: A and B and C and D",
        "The answer is not A.",  # a negation names no answer: unparseable, not A
        "Actually",  # the letter inside a word
        "Answer: Actually I am unsure",
        "Answer: All of the above",
    ],
)
def test_games_that_were_already_wrong_stay_wrong(response: str) -> None:
    assert _score(response) == 0.0


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("the answer is (b)", "B"),  # lower case in brackets is a letter, not the article "a"
        ("The answer is (a).", "A"),
        ("Answer: (A) Paris", "A"),
        ("(C)", "C"),
        ("Paris", "A"),  # the option's text
        ("The answer is Paris.", "A"),
        ("The answer is Paris, the capital of France.", "A"),
        ("The answer is A. Option (B) is wrong because London is not in France.", "A"),
        ("The answer is (A) because (B) is in England.", "A"),
        ("The answer is A. Wait, the answer is B.", "B"),  # a correction: the last answer phrase
        ("Answer: C. D. is incorrect", "C"),  # a letter list needs the whole rest of the line
        ("The answer is A. B is wrong.", "A"),
    ],
)
def test_answers_in_common_forms_are_read(response: str, gold: str) -> None:
    assert _score(response, gold) == 1.0
