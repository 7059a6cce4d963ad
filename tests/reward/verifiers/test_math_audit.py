"""The math verifier on realistic answers labelled by other projects' grading conventions.

Each case names the convention its label follows: math-verify 0.9.0's own test-suite and grader
(``math_verify/grader.py``), VeRL's ``reward_score/math*.py`` and ``gsm8k.py``, lm-eval-harness's
Minerva-math normalisation, Qwen2.5-Math's ``grader.py`` (``math_equal``). Where they disagree, the
label is what a careful grader gives, and never "equal" where one of them would refuse it for a reason
(a false "correct" is a reward a policy can learn to hack).
"""

from __future__ import annotations

import pytest

from stepcredit.reward.verifiers.math import fast_verdict, math_compute_score


def _score(response: str, gold: str) -> float:
    return math_compute_score("math", response, gold).score


# ------------------------------------------------------------------------------------ already right
@pytest.mark.parametrize(
    ("gold", "response", "score"),
    [
        # fractions and their decimals, \dfrac / \tfrac (math-verify; Minerva strips \dfrac, \tfrac)
        ("0.5", "So the answer is $\\boxed{\\frac{1}{2}}$.", 1.0),
        ("\\frac{1}{2}", "$\\boxed{0.5}$", 1.0),
        ("\\frac12", "\\boxed{\\dfrac{1}{2}}", 1.0),
        ("\\frac{1}{2}", "\\boxed{\\tfrac12}", 1.0),
        (
            "\\frac{1}{3}",
            "\\boxed{0.333}",
            0.0,
        ),  # a rounding short of 6 places (math-verify float_rounding=6)
        # thousands separators: one number, never a list read as 12 (VeRL gsm8k.py drops commas only
        # inside a number it matched; math-verify reads "1,2" as a set)
        ("1000", "\\boxed{1,000}", 1.0),
        ("1000", "\\boxed{1{,}000}", 1.0),
        ("12", "\\boxed{1,2}", 0.0),
        ("1, 2", "\\boxed{12}", 0.0),
        ("12", "The answer is 1,2.", 0.0),
        ("1234", "#### 1,234", 1.0),  # VeRL gsm8k.py: "#### (\-?[0-9\.\,]+)", commas removed
        ("12345678", "#### 12,345,678", 1.0),
        ("1234", "#### 1234.00", 1.0),
        ("1000", "The answer is 1.000", 0.0),  # a European separator is ambiguous: not credited
        # money and units (Minerva's normalize_final_answer removes units and "\$")
        ("5", "\\boxed{\\$5.00}", 1.0),
        ("5", "The answer is $5.00.", 1.0),
        ("5", "The answer is 5 dollars.", 1.0),
        ("5", "\\boxed{5 \\text{ dollars}}", 1.0),
        ("10", "\\boxed{10 \\mathrm{cm}^2}", 1.0),
        # percentages: a percentage equals its number and its value over 100 (math-verify's percent
        # handling); a bare 0.5 is not 50
        ("0.5", "\\boxed{50\\%}", 1.0),
        ("50", "\\boxed{50\\%}", 1.0),
        ("50\\%", "\\boxed{0.5}", 1.0),
        ("0.5", "\\boxed{50}", 0.0),
        ("50", "\\boxed{0.5}", 0.0),
        # assignments by their right side (math-verify: is_assignment_relation)
        ("3", "\\boxed{x = 3}", 1.0),
        ("x=3", "\\boxed{3}", 1.0),
        ("3", "\\boxed{x = 4}", 0.0),
        ("x=3", "\\boxed{y=3}", 0.0),  # another variable (math-verify: x=1 != y=1)
        # intervals: ends must match (math-verify sympy_compare_interval)
        ("(1, 2]", "\\boxed{(1,2]}", 1.0),
        ("(1, 2]", "\\boxed{(1,2)}", 0.0),
        ("(1, 2]", "\\boxed{[1,2]}", 0.0),
        ("(1, 2]", "\\boxed{x \\in (1, 2]}", 1.0),
        # sets in any order, tuples in order (math-verify sympy_compare_sets)
        ("\\{1, 2\\}", "\\boxed{\\{2, 1\\}}", 1.0),
        ("(1, 2)", "\\boxed{(2, 1)}", 0.0),
        ("(3, -1)", "\\boxed{(-1, 3)}", 0.0),
        ("1, 2", "\\boxed{2, 1}", 1.0),
        # closed forms (math-verify's symbolic check)
        ("\\frac{\\pi}{2}", "\\boxed{\\pi/2}", 1.0),
        ("\\sqrt{2}", "\\boxed{\\sqrt2}", 1.0),
        ("2\\sqrt{2}", "\\boxed{2\\sqrt2}", 1.0),
        ("\\sqrt{12}", "\\boxed{2\\sqrt3}", 1.0),
        # degrees: the sign is dropped (Minerva removes "^\circ"); radians are not degrees
        ("30^\\circ", "\\boxed{30}", 1.0),
        ("30", "\\boxed{30^{\\circ}}", 1.0),
        ("30", "\\boxed{30°}", 1.0),
        ("30", "\\boxed{\\frac{\\pi}{6}}", 0.0),
        # scientific notation written in LaTeX
        ("1500000", "\\boxed{1.5 \\times 10^{6}}", 1.0),
        ("0.00015", "\\boxed{1.5 \\times 10^{-4}}", 1.0),
        ("15", "\\boxed{1.5 \\times 10^{6}}", 0.0),
        # a unicode minus is a minus, never dropped
        ("-3", "\\boxed{\u22123}", 1.0),
        ("-3", "The answer is \u22123.", 1.0),
        ("-3", "#### \u22123", 1.0),
        ("3", "\\boxed{\u22123}", 0.0),
        ("3", "#### \u22123", 0.0),
        # MATH's multiple-choice golds (\text{(B)})
        ("\\text{(C)}", "\\boxed{C}", 1.0),
        ("\\text{(C)}", "\\boxed{\\textbf{(C)}}", 1.0),
        ("\\text{(C)}", "\\boxed{(D)}", 0.0),
        ("\\text{(C)}", "\\boxed{(C) \\text{ or } (D)}", 0.0),
    ],
)
def test_verdicts_that_were_already_right(gold: str, response: str, score: float) -> None:
    assert _score(response, gold) == score


@pytest.mark.parametrize("gold", ["3", "5"])
def test_two_different_boxes_credit_neither_value(gold: str) -> None:
    # Several distinct boxes are one answer of several values (math-verify joins them into a set), not
    # the last box (VeRL's last_boxed_only_string): against one number both candidates are a hedge.
    assert _score("First \\boxed{3}. Then \\boxed{5}.", gold) == 0.0


# ------------------------------------------------------------------------------------ fixed here
@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("(1, 2]", "1 < x \\le 2"),
        ("(-\\infty, 0)", "x<0"),
        ("[-2, 7)", "-2 \\le x < 7"),
        ("[3, \\infty)", "x \\geq 3"),
        ("[3, \\infty)", "3 \\le x"),
        ("(-\\infty, 5]", "5 \\ge x"),
    ],
)
def test_an_interval_answered_as_its_inequality_is_right(gold: str, pred: str) -> None:
    # Before: 0 (math-verify compares a relation with a set only when the gold is the relation). The
    # same set either way round; the differential test's interval_notations labels both right.
    assert fast_verdict(gold, pred) is True
    assert _score(f"\\boxed{{{pred}}}", gold) == 1.0


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("[-2, 7)", "-2 < x < 7"),  # another end
        ("[3, \\infty)", "x > 3"),
        ("(-\\infty, 0)", "x \\le 0"),
        ("(1, 2)", "1 < x < 2"),  # "(1, 2)" may be a point: left to math-verify, which says no
        ("[3, \\infty)", "x \\ge 3, y \\ge 3"),
        ("[3, \\infty)", "x \\ne 3"),
    ],
)
def test_an_inequality_for_another_set_stays_wrong(gold: str, pred: str) -> None:
    assert fast_verdict(gold, pred) is not True
    assert _score(f"\\boxed{{{pred}}}", gold) == 0.0


@pytest.mark.parametrize(
    ("gold", "response", "score"),
    [
        # E notation, as Python's float() reads it (Qwen2.5-Math's grader: math_equal -> is_digit ->
        # float()). Before: "1.5e6" against 1500000 scored 0 either way round, the gold side "surely"
        # wrong on the fast path (math-verify reads "e" as Euler's number: 1.5 * e * 6).
        ("1500000", "\\boxed{1.5e6}", 1.0),
        ("1.5e6", "\\boxed{1500000}", 1.0),
        ("0.00015", "\\boxed{1.5e-4}", 1.0),
        ("1500000", "\\boxed{1.5E+6}", 1.0),
        ("1000", "#### 1e3", 1.0),  # before: read as "1" (then "e3" as a unit), surely wrong
        ("1500000", "The answer is 1.5e6.", 1.0),
        ("1500000", "\\boxed{1.5e5}", 0.0),
        ("15", "\\boxed{1.5e-1}", 0.0),
        # Euler's number stays itself where no exponent follows
        ("2e", "\\boxed{2e}", 1.0),
        ("2e^{3}", "\\boxed{2e^3}", 1.0),
    ],
)
def test_scientific_e_notation(gold: str, response: str, score: float) -> None:
    assert _score(response, gold) == score


@pytest.mark.parametrize(
    ("response", "score"),
    [
        # MATH's AMC rows have golds "\text{(C)}"; contest solutions (and models trained on them) box the
        # letter with its option's value, "\textbf{(C) }12". The letter is the answer: before, 0 (math-verify
        # has no such rule and reads a product). A careful grader credits the letter.
        ("The answer is $\\boxed{\\textbf{(C) }12}$", 1.0),
        ("$\\boxed{\\textbf{(C)}\\ 12}$", 1.0),
        ("$\\boxed{\\mathrm{(C)}\\ \\frac{1}{2}}$", 1.0),
        ("$\\boxed{\\textbf{(D) }12}$", 0.0),
        # a second option is a hedge, whatever the values
        ("$\\boxed{(C) 12 \\text{ or } (D) 15}$", 0.0),
        ("$\\boxed{(C) 12, (D) 15}$", 0.0),
        ("$\\boxed{(C)(D)}$", 0.0),
    ],
)
def test_a_choice_letter_with_its_value(response: str, score: float) -> None:
    assert _score(response, "\\text{(C)}") == score


def test_a_bare_letter_gold_is_not_read_as_a_choice() -> None:
    # "C" alone may name a point or a constant: "(C) 12" against it stays with math-verify (no)
    assert fast_verdict("C", "(C) 12") is None


@pytest.mark.parametrize(
    ("gold", "response", "score"),
    [
        # other minus signs models emit: the hyphens U+2010/U+2011, the small and full-width
        # hyphen-minus (NFKC maps U+FE63 and U+FF0D to "-"). Before, "\boxed{‐5}" scored 0 against -5.
        ("-5", "\\boxed{\u20105}", 1.0),
        ("-5", "\\boxed{\u20115}", 1.0),
        ("-5", "\\boxed{\uff0d5}", 1.0),
        ("-5", "\\boxed{\ufe635}", 1.0),
        ("5", "\\boxed{\u20105}", 0.0),
        # an assignment written value-first: "3 = x" says x is 3. Before, the fast path called it surely
        # wrong against 3 (it compared the right side, x, as math-verify does).
        ("3", "\\boxed{3 = x}", 1.0),
        ("4", "\\boxed{3 = x}", 0.0),
        ("3", "\\boxed{10 = 2x}", 0.0),
    ],
)
def test_minus_signs_and_value_first_assignments(gold: str, response: str, score: float) -> None:
    assert _score(response, gold) == score
