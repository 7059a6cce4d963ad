"""Defects found by the differential audit against VeRL's reward functions and lm-eval's GSM8K extraction.

The labelled set behind the audit is ``tests/reward/data/verl_math_reference.json`` (checked whole in
``tests/reward/test_math_verl_reference.py``); each test here pins one defect it found, with the case that
showed it. The label is a careful grader's, not any reference's.
"""

from __future__ import annotations

import time

import pytest

from stepcredit.reward.verifiers.math import extract_answer, math_compute_score


def _score(response: str, gold: str) -> float:
    return math_compute_score("math", response, gold).score


@pytest.mark.parametrize(
    ("response", "gold", "score"),
    [
        # An answer phrase (or "####") whose tail is LaTeX without delimiters was read as its leading
        # number: "Answer: 2\sqrt2" as 2. Both ways wrong: the true answer scored 0 and the bare
        # coefficient scored 1 (a reward for writing any expression that starts with the gold). Found on
        # the DAPO-style "Answer:" line; VeRL's math_dapo (string match) and math-verify also fail the
        # true answer, lm-eval's flexible extraction would read the 2.
        ("Answer: 2\\sqrt2", "2\\sqrt{2}", 1.0),
        ("Answer: 2\\sqrt2", "2", 0.0),
        ("The answer is 3\\sqrt{13}.", "3\\sqrt{13}", 1.0),
        ("The answer is 3\\sqrt{13}.", "3", 0.0),
        ("The answer is 3 \\sqrt{13}, which is about 10.8.", "3\\sqrt{13}", 1.0),
        ("The answer is 3 \\sqrt{13}, which is about 10.8.", "3", 0.0),
        ("The answer is 5\\pi.", "5\\pi", 1.0),
        ("The answer is 5\\pi.", "5", 0.0),
        ("The answer is 1\\frac{4}{5}.", "1\\frac{4}{5}", 1.0),
        ("The answer is 1\\frac{4}{5}.", "1", 0.0),
        ("The answer is 12 \\times 10^3.", "12000", 1.0),
        ("The answer is 12 \\times 10^3.", "12", 0.0),
        ("The answer is 2 \\cdot 3 = 6.", "6", 1.0),
        ("The answer is 2 \\cdot 3 = 6.", "2", 0.0),
        ("#### 2\\sqrt{2}", "2", 0.0),
        ("Answer: 2x+3", "2x+3", 1.0),
        ("Answer: 2x+3", "2", 0.0),
        ("The final answer is 6i.", "6", 0.0),
        ("Answer: 52_8", "52_8", 1.0),
        # what still reads as the number: units, percent, degrees, words after it
        ("Answer: 5\\text{ cm}", "5", 1.0),
        ("The answer is 5 cm.", "5", 1.0),
        ("The answer is 18 dollars.", "18", 1.0),
        ("Answer: 3\\%", "3", 1.0),
        ("The answer is 10^\\circ.", "10", 1.0),
        ("The answer is 18, which is what she makes.", "18", 1.0),
    ],
)
def test_an_answer_phrase_reads_the_whole_expression_after_its_number(
    response: str, gold: str, score: float
) -> None:
    assert _score(response, gold) == score


@pytest.mark.parametrize(
    ("response", "gold", "score"),
    [
        # thousands separators inside a fraction: "\frac{20,000}{\pi}" scored 0 against "\frac{20000}{\pi}"
        # (math-verify reads "20,000" there as a pair; prime_math credits it)
        ("The area is $\\boxed{\\frac{20,000}{\\pi}}$.", "\\frac{20000}{\\pi}", 1.0),
        ("The area is $\\boxed{\\frac{20{,}000}{\\pi}}$.", "\\frac{20000}{\\pi}", 1.0),
        ("$\\boxed{\\frac{1,000}{3}}$", "\\frac{1000}{3}", 1.0),
        ("$\\boxed{\\frac{1,001}{3}}$", "\\frac{1000}{3}", 0.0),
        # a set is no number: "\{1,234\}" keeps its comma
        ("$\\boxed{\\{1,234\\}}$", "1234", 0.0),
        # LaTeX separators in a number outside math ("{,}", ",\!", "\,"): read as one number. Before,
        # "The answer is 10,\\!080." was read as 10 (credited against a gold of 10).
        ("The profit is \\$70{,}000.", "70000", 1.0),
        ("The answer is 10,\\!080.", "10080", 1.0),
        ("The answer is 10\\,080.", "10080", 1.0),
        ("The answer is 10,\\!080.", "10", 0.0),
    ],
)
def test_thousands_separators_inside_latex(response: str, gold: str, score: float) -> None:
    assert _score(response, gold) == score


def test_the_leading_number_is_still_what_a_plain_phrase_gives() -> None:
    assert extract_answer("The answer is 18.") == ("18", "phrase")
    assert extract_answer("#### 1,234") == ("1,234", "####")


@pytest.mark.parametrize(
    "response",
    [
        # cut off mid-equation, before the answer: math-verify reads the left side ("9 * 2", 18) and paid
        # it; VeRL's gsm8k (flexible) and lm-eval's flexible extraction read the last number, 2 (wrong).
        # The response states no answer: a careful grader marks it wrong.
        "She has 16 - 3 - 4 = 9 eggs left. She makes 9 * 2 =",
        "She has 16 - 3 - 4 = 9 eggs left. She makes 9 * 2 = ",
        "She has 9 eggs left.\nShe makes 9 * 2 =\n",
    ],
)
def test_a_response_cut_off_after_an_equals_sign_has_no_answer(response: str) -> None:
    result = math_compute_score("openai/gsm8k", response, "18")
    assert result.score == 0.0
    assert result.status.value == "unparseable"


def test_a_finished_equation_still_gives_its_last_number() -> None:
    assert _score("She has 9 eggs left. She makes 9 * 2 = 18", "18") == 1.0
    assert _score("She has 9 eggs left. She makes 9 * 2 = 18 dollars.", "18") == 1.0


def _seconds(response: str) -> float:
    start = time.perf_counter()
    math_compute_score("openai/gsm8k", response, "18")
    return time.perf_counter() - start


@pytest.mark.parametrize(
    "hostile",
    [
        # 4,000 answer phrases on one 100k-character line: each phrase's tail was the rest of the line,
        # read whole, so the extraction took 33 s inline (quadratic); now each tail is read a bounded way
        "The answer is 1\\sqrt{2}x" * 4000,
        "#### 1\\sqrt{2}x " * 6000,
        "Final answer: $5$ " * 5500,
    ],
)
def test_a_hostile_100k_character_response_is_scored_in_linear_time(hostile: str) -> None:
    # quiet, each takes well under 0.5 s (a 100k-character plain response: ~0.01 s); 10 s is the 10x
    # margin a loaded machine needs, and far below the 30 s the phrase scan took
    assert _seconds(hostile) < 10.0
