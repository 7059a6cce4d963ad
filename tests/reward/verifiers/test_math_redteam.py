"""The math verifier against responses written to game it, and against correct answers written in common ways.

Each hedge below gave credit before (input -> score 1): a policy that writes two answers in two final-answer
markers, a number list or an "or" after its answer phrase, or a bound instead of a value must not be paid
for it. Where a case is a judgement call the comment says what a careful grader marks and why.
"""

from __future__ import annotations

import pytest

from stepcredit.reward.verifiers.math import math_compute_score, math_fast


def _score(response: str, gold: str) -> float:
    return math_compute_score("math", response, gold).score


@pytest.mark.parametrize(
    "response",
    [
        # a box and GSM8K's "####" that disagree: two final answers. Before, each gold was credited (the
        # fast path read the later "####", math-verify the box), so writing one candidate in each paid
        # whichever was right. A careful grader marks a response with two final answers wrong.
        "The answer is \\boxed{5}.\n#### 2",
        "#### 2\n\\boxed{5}",
        "$\\boxed{2}$ $\\boxed{2}$ #### 5",
    ],
)
@pytest.mark.parametrize("gold", ["2", "5"])
def test_a_box_and_a_hash_that_disagree_are_wrong_for_either_gold(response: str, gold: str) -> None:
    assert _score(response, gold) == 0.0


def test_a_box_and_a_hash_that_agree_stay_right() -> None:
    assert _score("So she has \\boxed{18} eggs.\n#### 18", "18") == 1.0
    assert _score("\\boxed{\\$18}\n#### 18", "18") == 1.0


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        # several numbers joined after an answer marker: before, the first one was read alone
        ("The answer is 2 or 3.", "2"),
        ("Final answer: 2 or 3", "2"),
        ("#### 2 or 3", "2"),
        ("#### 2, 3", "2"),
        ("Answer: 2, 3, 4", "2"),
        ("The answer is 2 or 3 apples.", "2"),
        ("The answer is $2$ or $3$.", "2"),  # the same hedge in math delimiters
        ("#### $2$ or $3$", "2"),
        ("The answer is 2 and 3.", "2"),
        ("The answer is 1, 2, or 3.", "1"),
        # a bound or a hedge inside the box is not the value a numeric truth asks for
        ("\\boxed{\\geq 2}", "2"),
        ("\\boxed{\\le 2}", "2"),
        ("\\boxed{\\text{at least } 2}", "2"),
        ("\\boxed{2 \\text{ or more}}", "2"),
        ("\\boxed{2 \\text{ (or 3)}}", "2"),
        ("\\boxed{2 \\text{ or } 3}", "2"),
    ],
)
def test_hedged_answers_against_a_number_are_wrong(response: str, gold: str) -> None:
    assert _score(response, gold) == 0.0


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        # the same forms are right where the truth itself is a list, a bound or a pair of roots
        ("The answer is 2, 3", "2, 3"),
        ("\\boxed{x = 2 \\text{ or } x = -2}", "2, -2"),
        ("\\boxed{x \\ge 2}", "x \\ge 2"),
        # a number with a thousands separator is one number, not a list
        ("Final answer: 1,234,567", "1234567"),
        ("The answer is 1,000.", "1000"),
        ("#### 12,5", "12.5"),
        # "approximately" qualifies a value; it does not hedge between two
        ("\\boxed{\\approx 2}", "2"),
        ("The answer is 18, the number of eggs.", "18"),
        # a number then a clause that names another number: the first is the answer, not a list
        ("The answer is 5, 2 more than 3.", "5"),
        ("The answer is 12, because 3 * 4 = 12.", "12"),
    ],
)
def test_lists_and_bounds_that_are_the_answer_stay_right(response: str, gold: str) -> None:
    assert _score(response, gold) == 1.0


def test_hedges_are_decided_without_math_verify() -> None:
    """A hedge against a number is decided on the fast path (the common path stays off math-verify)."""
    for response in ("#### 2 or 3", "\\boxed{\\geq 2}", "The answer is \\boxed{5}.\n#### 2"):
        fast = math_fast("math", response, "2")
        assert fast is not None and fast.score == 0.0, response


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("\\boxed{4-2}", "2"),  # the truth as an expression that evaluates to it
        ("2", "2"),  # a response that is only the number
        ("\\boxed{2.0}", "2"),
        ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac12"),
        ("\\boxed{2\\frac{1}{2}}", "\\frac{5}{2}"),  # a mixed number
        ("\\boxed{-0}", "0"),
        ("\\boxed{50\\%}", "50"),
        ("\\boxed{1{,}000}", "1000"),
        ("\\boxed{5 \\text{ cm}}", "5"),
        ("\\boxed{\\text{2}}", "2"),
        ("\\boxed{−2}", "-2"),  # unicode minus
        ("\\boxed{２}", "2"),  # full-width digit
        ("Final answer: ١٢", "12"),  # Arabic-Indic digits
        ("Final answer: 42 apples, as computed", "42"),
    ],
)
def test_correct_answers_in_common_forms(response: str, gold: str) -> None:
    assert _score(response, gold) == 1.0


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("\\boxed{1,2,3,4,5}", "2"),  # every candidate in one box
        ("\\boxed{2} or \\boxed{3}", "2"),
        ("\\boxed{[0, 10]}", "2"),  # an interval that contains the truth
        ("\\boxed{\\{1,2,3\\}}", "2"),
        ("The answer is x = 2 or x = -2", "2"),
        ("\\boxed{\\infty}", "2"),
        ("\\boxed{nan}", "2"),
        ("\\boxed{}", "0"),
        # the last box is the answer (VeRL's last_boxed_only_string): an early box is not credited
        ("\\boxed{2}" + " and more" * 2000 + " \\boxed{5}", "2"),
    ],
)
def test_games_that_were_already_wrong_stay_wrong(response: str, gold: str) -> None:
    assert _score(response, gold) == 0.0


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        # a decimal is credited within its own written precision (and 1e-6 relative, math-verify's
        # rounding), never within 1e-6 of a large truth: 123456.1 is not 123456. Before, both scored 1.
        ("\\boxed{123456.1}", "123456"),
        ("\\boxed{1000000.5}", "1000000"),
        ("\\boxed{12.000001}", "12"),  # math-verify also says no
    ],
)
def test_a_decimal_off_by_more_than_its_precision_is_wrong(response: str, gold: str) -> None:
    assert _score(response, gold) == 0.0


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("\\boxed{0.333333}", "\\frac13"),  # the truth rounded to the places written
        ("\\boxed{0.666667}", "\\frac{2}{3}"),
        ("\\boxed{18.00}", "18"),
        ("\\boxed{2.5}", "\\frac{5}{2}"),
    ],
)
def test_a_decimal_that_rounds_the_truth_stays_right(response: str, gold: str) -> None:
    assert _score(response, gold) == 1.0


@pytest.mark.parametrize(
    "response",
    [
        # A box the response then disowns for another number. VeRL's last_boxed_only_string and
        # math-verify (a box outranks "the answer is": parser.py priorities 50 vs 100/200) both read the
        # box, so gold 3 was paid before. A careful grader sees two final answers: wrong for either truth,
        # as for a box and a "####" above.
        "The answer is $\\boxed{3}$.\n\nWait, that's wrong. The answer is 4.",
        "So the answer is \\boxed{3}. Wait, that's wrong. Let me recompute: the correct answer is $4$.",
        "$\\boxed{3}$\n\nAnswer: 4",
    ],
)
@pytest.mark.parametrize("gold", ["3", "4"])
def test_a_box_retracted_by_a_later_answer_phrase_is_wrong_for_either_gold(response: str, gold: str) -> None:
    assert _score(response, gold) == 0.0
    fast = math_fast("math", response, gold)
    assert fast is not None and fast.info.get("hedged"), "decided on the fast path, as a hedge"


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        # a later phrase that repeats the box, in other words or units, is no rival
        ("$\\boxed{3}$\n\nThe answer is 3 because 1+2=3.", "3"),
        ("$\\boxed{12}$ square units. The answer is 12 square units.", "12"),
        ("Area: $\\boxed{12}$.\nThe answer is $12\\text{ cm}^2$.", "12"),
        ("The probability is $\\boxed{\\frac{1}{2}}$, i.e. the answer is 50%.", "\\frac{1}{2}"),
        ("$\\boxed{12}$. Note that the answer is independent of $x$.", "12"),
        # an approximation of an exact box is not a second answer
        ("$\\boxed{2\\sqrt{3}}$, so the answer is approximately 3.46.", "2\\sqrt{3}"),
        ("$\\boxed{\\frac{1}{3}}$; the answer is about 0.33.", "\\frac{1}{3}"),
        # "final answer is" after a box is the answer itself (math-verify ranks it with the box)
        ("The answer is $\\boxed{3}$. Let me double-check... so the final answer is $4$.", "4"),
        # a hallucinated next few-shot question ("Q: ... A: 5") is not a rival answer phrase
        ("So she makes \\boxed{18} dollars.\n\nQ: How many legs do 2 dogs have?\nA: 8", "18"),
    ],
)
def test_a_later_phrase_that_agrees_with_the_box_stays_right(response: str, gold: str) -> None:
    assert _score(response, gold) == 1.0


@pytest.mark.parametrize("gold", ["3", "4"])
def test_a_box_retracted_by_a_later_box_is_wrong_for_either_gold(gold: str) -> None:
    # Several distinct boxes are read as one answer of several values (math-verify's reading), never the
    # one a later sentence disowns: neither truth is credited.
    response = "$\\boxed{4}$.\n\nHowever, I previously wrote \\boxed{3}, which was wrong."
    assert _score(response, gold) == 0.0


@pytest.mark.parametrize(
    ("response", "operand", "result"),
    [
        # a calculation after the answer marker, then words: before, the fast path read its first operand
        # (the English-sentence reading) and math-verify its result, so one response was right for two
        # golds: a correct intermediate value followed by one more (wrong) step was paid
        ("The answer is 40 - 10 = 30 pages left.", "40", "30"),
        ("Answer: 15 - 3 = 12 apples", "15", "12"),
        ("Final answer: 8 + 4 + 2 = 14 marbles", "8", "14"),
        ("Therefore, the final answer is 6 * 4 = 24 cupcakes.", "6", "24"),
        ("The answer is 3 × 5 = 15 apples.", "3", "15"),
        ("The answer is 3 x 5 = 15 apples.", "3", "15"),
        ("The answer is 20% of 50 = 10", "20", "10"),
        ("#### 40 - 10 = 30 pages", "40", "30"),
        # an "Answer:" after a sentence on the same line is the later marker (DAPO's, as VeRL reads it)
        ("Reasoning. So the answer is 34. **Answer:** 35", "34", "35"),
    ],
)
def test_a_calculation_after_the_answer_marker_is_read_as_its_result(
    response: str, operand: str, result: str
) -> None:
    assert (_score(response, operand), _score(response, result)) == (0.0, 1.0)


def test_an_answer_followed_by_its_reason_keeps_the_answer() -> None:
    assert _score("The answer is 5, since 2 + 3 = 5.", "5") == 1.0
    assert _score("The answer is 10 (since 2x = 20).", "10") == 1.0
    assert _score("The answer is 12 \\times 10^3 = 12000 grams.", "12000") == 1.0


@pytest.mark.parametrize(
    "response",
    [
        "<think>so it is 34</think>\n\nSorry, I cannot answer.",
        "<think>so it is \\boxed{34}</think>\n\nSorry, I can't help with that.",
        "<think>the answer is 34</think>\n\nI am not sure.",
    ],
)
def test_an_answer_only_in_the_thinking_is_no_answer(response: str) -> None:
    """The reply is what is scored: before, when it held no answer, math-verify read the whole text and
    credited the thinking's (1.0 for each of these)."""
    r = math_compute_score("math", response, "34")
    assert (r.score, r.status.value) == (0.0, "unparseable"), r.info


@pytest.mark.parametrize(
    ("response", "mantissa", "value"),
    [
        # scientific notation after an answer marker is one number: before, the leading-number reading
        # took its mantissa, so "1.2 x 10^5" was right for 1.2 and wrong for 120000 (math-verify, given
        # the response, reads 1.2 too)
        ("The answer is 1.2 x 10^5.", "1.2", "120000"),
        ("The answer is 1.2 × 10^5 dollars.", "1.2", "120000"),
        ("#### 1.2 x 10^5", "1.2", "120000"),
        ("Answer: 3 x 10^{-4}", "3", "0.0003"),
        ("The answer is 1.2 \\times 10^5.", "1.2", "120000"),
        ("The final answer is 6.02 * 10^23 molecules.", "6.02", "602000000000000000000000"),
    ],
)
def test_scientific_notation_after_the_answer_marker_is_one_number(
    response: str, mantissa: str, value: str
) -> None:
    assert (_score(response, mantissa), _score(response, value)) == (0.0, 1.0)


def test_a_power_of_ten_inside_a_longer_expression_is_not_read_as_scientific_notation() -> None:
    # "5 x 10^2 + 3" is an expression, "1.2 x 10^52" a different exponent: neither is 1.2 x 10^5
    assert _score("The answer is 1.2 x 10^52 meters.", "120000") == 0.0
    assert _score("The answer is 3 x 10^2 = 300.", "300") == 1.0


@pytest.mark.parametrize(
    "response",
    [
        "The answer is 10, since 2x = 20.",
        "The answer is 10 (since 2x = 20).",
        "The answer is 10, because 2x = 20.",
        "The answer is 10 because 2 \\times 10 = 20.",
        "The answer is 10, as 2x = 20.",
    ],
)
def test_a_number_inside_the_answers_reason_is_no_second_answer(response: str) -> None:
    """Before, the phrase reading credited 10 and math-verify, reading the whole response, the 20 in the
    reason: one response was right for two golds, a hedge a policy could learn."""
    assert (_score(response, "10"), _score(response, "20")) == (1.0, 0.0)
