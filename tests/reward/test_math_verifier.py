"""The math verifier: extraction, normalisation, the fast path, and self-consistency on real data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepcredit.reward.verifiers.math import (
    extract_answer,
    extract_gold,
    fast_verdict,
    math_compute_score,
    math_fast,
    normalize,
)
from stepcredit.types import Status

DATA = Path(
    os.environ.get("STEPCREDIT_SHARED_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data")
)


def _rows(name: str) -> list[dict]:
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} not found (set STEPCREDIT_SHARED_DATA)")
    return [json.loads(line) for line in path.open()]


@pytest.mark.parametrize(
    ("text", "answer", "how"),
    [
        ("Janet sells 9 eggs.\n#### 18", "18", "####"),
        ("The answer is 42.", "42", "phrase"),
        ("A: 26", "26", "phrase"),
        ("Q: how many?\nA: She has 5 apples. The answer is 26.", "26", "phrase"),
        ("**Answer:** 1,000", "1,000", "phrase"),
        ("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.", "\\frac{3}{4}", "phrase"),
        ("so $x = \\boxed{\\frac{\\sqrt{2}}{2}}$.", "\\frac{\\sqrt{2}}{2}", "boxed"),
        ("\\boxed{1} then wait: \\boxed{\\{1, 2\\}}", "\\{1, 2\\}", "boxed"),
        ("<think>the answer is 3</think> The answer is 4.", "4", "phrase"),
        ("The answer is 18 dollars.", "18", "phrase"),
        ("She makes $18 a day.\nThe answer is $18.", "$18", "phrase"),
        ("first \\boxed{5}, and then #### 6", "6", "####"),
        # two answer phrases on one line: the later one is final (the first one's tail runs over it)
        ("The answer is $5! = 120$. So the answer is $\\frac{2}{3}$.", "\\frac{2}{3}", "phrase"),
        ("Hence, the answer is $3$ primes. So the answer is $12$.", "12", "phrase"),
        # "final answer is" after a box wins, in any case and beside text outside ASCII
        ("First \\boxed{200}. THE FINAL ANSWER IS $7$.", "7", "phrase"),
        ("First \\boxed{200} – so the Final answer is $7$.", "7", "phrase"),
        ("First \\boxed{200} – then more work.", "200", "boxed"),
        ("The final answer is 7 before the box: \\boxed{200}", "200", "boxed"),
    ],
)
def test_extraction(text: str, answer: str, how: str) -> None:
    assert extract_answer(text) == (answer, how)


def test_strict_needs_a_marker_and_a_closed_think() -> None:
    assert extract_answer("She has 18 eggs.", mode="strict") == (None, "none")
    assert extract_answer("She has 18 eggs.", mode="flexible") == ("18", "last_number")
    assert extract_answer("<think> 5 is it", mode="strict") == (None, "unfinished_think")
    r = math_compute_score("math", "She has 18 eggs.", "18", mode="strict")
    assert r.status == Status.UNPARSEABLE and r.score == 0.0


@pytest.mark.parametrize(
    ("gold", "pred", "verdict"),
    [
        ("18", "18.00", True),
        ("1000", "1,000", True),
        ("18", "\\$18", True),
        ("50", "50\\%", True),
        ("90", "90^\\circ", True),
        ("\\frac{14}{3}", "14/3", True),
        ("0.5", "\\dfrac{1}{2}", True),
        ("9", "16-3-4", True),
        ("5", "x=5", True),
        ("12", "12\\text{ cm}", True),
        ("\\text{Evelyn}", "\\text{Evelyn}", True),
        ("18", "19", False),
        ("\\frac{1}{3}", "0.333", None),  # a decimal may approximate: math-verify decides
        ("\\sqrt{2}", "1.414", None),  # a closed form against a decimal: math-verify decides
        ("\\sqrt{2}", "1.4142136", None),  # within math-verify's rounding: left to it
        ("2\\sqrt{3}", "\\sqrt{12}", True),
        # Gaussian rationals: exact, with i as the imaginary unit
        ("6-5i", "-5i+6", True),
        ("(1+2i)^2", "-3+4i", True),
        ("1+274i", "-3", False),  # two exact constants (complex), far apart
        ("\\frac{1}{2}+i", "0.5+i", None),  # decimals with i: left to math-verify
        # one constant against a tuple, interval or set of several elements, or a union: never equal
        ("(-2,1)", "4", False),
        ("12\\pi", "(5,\\infty)", False),
        ("3 \\sqrt{5}", "(15,-29)", False),
        ("\\frac{20000}{\\pi}", "x \\in [-2,7]", False),
        ("\\frac{1}{2}", "\\left(-1, 6\\right]", False),
        ("4", "(-\\infty, 2) \\cup (3, \\infty)", False),
        ("1440", "\\{1\\pm\\sqrt{5},-2\\}", False),
        ("3", "\\{3\\}", None),  # one element: math-verify decides
        # two exact constants without decimals, far apart: surely different
        ("3\\sqrt{13}", "4", False),
        ("\\pi", "28", False),
        ("6+9i", "13535", False),
        ("\\frac{\\sqrt{21}}{5}", "\\frac{11}{2}", False),
        ("90^\\circ", "\\frac{\\pi}{2}", None),  # degrees against radians: math-verify decides
        ("\\sqrt{2}", "1.41", None),  # a decimal may approximate
        ("5", "[5, 5]", None),
        ("0", "\\begin{pmatrix} -2 \\\\ -14 \\end{pmatrix}", False),  # a constant is no vector
        ("1000", "(1,000)", None),  # may be a number with a thousands separator
        ("(a+5)(b+2)", "850", False),  # not a list (the first bracket closes early): an expression in a, b
        ("(1,2)", "\\{1,2\\}", None),  # two lists: math-verify's business
    ],
)
def test_fast_verdict(gold: str, pred: str, verdict: bool | None) -> None:
    assert fast_verdict(gold, pred) is verdict


def test_math_verify_decides_latex_equivalence() -> None:
    r = math_compute_score("math", "so \\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}")
    assert (r.score, r.status, r.info["path"]) == (1.0, Status.OK, "fast")  # constants: read as floats
    r = math_compute_score("math", "so \\boxed{\\frac{a}{2}}", "\\frac{1}{2}a")
    assert (r.score, r.status, r.info["path"]) == (1.0, Status.OK, "math_verify")
    r = math_compute_score("math", "so \\boxed{\\sqrt{3}}", "\\frac{1}{\\sqrt{2}}")
    assert (r.score, r.status) == (0.0, Status.OK)


def test_format_score_and_unparseable() -> None:
    assert math_compute_score("gsm8k", "#### 17", "18", format_score=0.1).score == 0.1
    r = math_compute_score("gsm8k", "I do not know.", "18")
    assert r.status == Status.UNPARSEABLE and r.score == 0.0
    assert (
        math_fast("gsm8k", "#### 18", "") is not None
        and math_fast("gsm8k", "#### 18", "").status == Status.ERROR
    )


def test_gold_extraction() -> None:
    assert extract_gold("blah <<1+1=2>>\n#### 1,200") == "1,200"
    assert extract_gold("so \\boxed{\\frac12}.") == "\\frac12"
    assert extract_gold(42) == "42"


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-(10**9), max_value=10**9))
def test_spellings_of_an_integer_are_equal_and_neighbours_are_not(n: int) -> None:
    # Property: every common spelling of n is n; n+1 never is.
    spellings = [str(n), f"{n}.0", f"{n:,}", f"\\boxed{{{n}}}", f"${n}$", f"{n}.", f"\\frac{{{2 * n}}}{{2}}"]
    for s in spellings:
        assert fast_verdict(str(n), extract_answer(f"The answer is {s}")[0] or "") is True, s
    assert fast_verdict(str(n), str(n + 1)) is False


def test_every_gsm8k_solution_scores_1_on_its_answer_and_0_on_another() -> None:
    rows = _rows("gsm8k/test.jsonl")
    answers = [r["answer"].rsplit("####", 1)[1].strip().replace(",", "") for r in rows]
    for i, (r, gt) in enumerate(zip(rows, answers, strict=True)):
        own = math_compute_score("openai/gsm8k", r["answer"], gt)
        assert own.score == 1.0 and own.status == Status.OK, (i, gt, own)
        other = next(a for a in answers[i + 1 :] + answers[:i] if float(a) != float(gt))
        assert math_compute_score("openai/gsm8k", r["answer"], other).score == 0.0, (i, gt, other)


def test_every_math500_solution_scores_1_on_its_answer() -> None:
    rows = _rows("math500/test.jsonl")
    for r in rows:
        res = math_compute_score("HuggingFaceH4/MATH-500", r["solution"], r["answer"])
        assert res.score == 1.0 and res.status == Status.OK, (r["unique_id"], r["answer"], res)


def test_normalize_is_idempotent() -> None:
    for s in ["$1,000$", "\\left( 3, \\frac{\\pi}{2} \\right)", "90^\\circ", "x = 5", "12\\text{ cm}."]:
        assert normalize(normalize(s)) == normalize(s)


def test_values_that_differ_skip_simplify_but_keep_math_verify_verdicts() -> None:
    """An expression in a variable against a number (or another variable's expression) is decided
    by evaluating both at fixed points; equal values still go to verify."""
    from math_verify import parse, verify

    for gold, pred in [("x^3+3x-6", "1"), ("6r^2-4r-24", "66"), ("p - q", "\\frac{14}{3}"), ("2k", "2m")]:
        r = math_compute_score("math", f"so \\boxed{{{pred}}}", gold)
        assert (r.score, r.status) == (0.0, Status.OK), (gold, pred)
        assert not verify(parse(f"${gold}$"), parse(f"$\\boxed{{{pred}}}$"))
    r = math_compute_score("math", "so \\boxed{(x+1)^2}", "x^2+2x+1")
    assert r.score == 1.0 and r.info["path"] == "math_verify"


def test_number_against_several_elements_or_a_polynomial_skips_verify_keeping_its_verdict() -> None:
    """``_mv_sure_false`` skips verify only where verify says False: a number against a set, tuple or
    interval of several elements, a union, or a non-constant polynomial; one element or a polynomial
    that is constant after expansion still goes to verify."""
    from math_verify import parse, verify

    from stepcredit.reward.verifiers.math import _mv_sure_false

    skipped = [
        ("x^8+x+1", "14"),
        ("(1,2)", "1"),
        ("[1,2]", "2"),
        ("\\{3,4\\}", "3"),
        ("(0,9)\\cup(9,36)", "1"),
        # a gold constant against an exact rational more than 1e-6 (relative) away
        ("2\\sqrt{5}", "7"),
        ("\\sqrt{2}", "\\frac{99}{70}"),
        ("\\frac{\\pi}{6}", "\\frac{1}{2}"),
        ("3^{1/3}", "1"),
        # an equation against a gold number: by its last right side
        ("5", "x = 3"),
        ("5", "a = b = 7"),
        ("\\frac{1}{2}", "2 + 3 = 4"),
        # a gold constant against a decimal more than 1e-6 (relative) away
        ("70 \\sqrt{2}", "1.25"),
        ("\\pi", "3.14"),
        ("x + 1", "2.5"),
    ]
    # ... but not one that equals it, and no rational that approximates it closer than 1e-6
    kept = [
        ("(x+1)^2-x^2-2x", "1"),
        ("\\{3\\}", "3"),
        ("x^2", "y^2"),
        ("\\sqrt{4}", "2"),
        ("\\sqrt{2}", "\\frac{665857}{470832}"),
        ("\\cos(x)", "1"),
        ("5", "2 + 3 = 5"),
        ("5", "x = y = 5"),
        ("5", "x = \\sqrt{25}"),
        ("\\sqrt{2}", "1.414214"),
        ("\\pi", "3.1415926"),
    ]
    for gold, pred in skipped + kept:
        g, p = tuple(parse(f"${gold}$")), tuple(parse(f"${pred}$"))
        assert _mv_sure_false(g, p) == ((gold, pred) in skipped), (gold, pred)
        if (gold, pred) in skipped:
            assert not verify(list(g), list(p)), (gold, pred)


@pytest.mark.parametrize(
    ("text", "answer", "how"),
    [
        ("So the result is $\\frac13$.", "\\frac13", "latex"),  # the last math, not the digits "13"
        ("First $x = 2$, and in the end $$ y = 7 $$", "y = 7", "latex"),
        ("Hence \\(k = 3\\) and so on.", "k = 3", "latex"),
        ("We find\n\\[\nx = 4\n\\]", "x = 4", "latex"),
        ("so $x=1$ or $x=2$", "x=1, x=2", "latex"),  # several answers joined, as math-verify does
        ("it is $x \\ge \\frac{11}{10} = 1.1$, and $r = 10\\%$.", "r = 10\\%", "latex"),
        ("a total of $6$ possible values of $x.$", "6", "latex"),  # a variable named in prose
        ("9 and 50 $\\emph{do}$ divide $1\\,100$ so", "1\\,100", "latex"),
        (
            "the answer $t=17$ fits. Much later we check $17\\cdot 19 = 323 = 14\\cdot 23 + 1$.",
            "t=17",
            "phrase",
        ),
        ("She pays $5 each, so $15 in total.", "15", "last_number"),  # money, not math
        ("one million lire equals $\\frac{3}{2}\\cdot10,\\!000/12=$1250$$ dollars.", "1250", "latex"),
        ("Final Answer: The largest $n$ is 34.", "34", "phrase"),
        ("The line is $ax + by = 3$ here", "ax + by = 3", "latex"),  # "by" is a product, not a word
        ("Final Answer: Jane started growing Sphere 3 hours ago. I hope it is correct.", "3", "phrase"),
        (
            "so $\\boxed{200}$, then $\\boxed{255}$. The final answer is $10,455$. I hope it is correct.",
            "10,455",
            "phrase",
        ),
        ("In total she has 1 000 apples.", "1 000", "last_number"),
        ("It costs 1000,99 euros.", "1000,99", "last_number"),
        ("It is .4 of the whole.", ".4", "last_number"),
        ("so 1/3 of the cake", "1/3", "last_number"),
        ("The code is AZYUK2A.", None, "bare"),  # one token, no number standing on its own
        ("\\frac{1}{3}", "\\frac{1}{3}", "bare"),
        ("x \\geq 5", "x \\geq 5", "bare"),
    ],
)
def test_extraction_without_anchor(text: str, answer: str | None, how: str) -> None:
    got, got_how = extract_answer(text)
    if answer is None:
        assert got is None or fast_verdict("2", got) is not True
    else:
        assert (got, got_how) == (answer, how)


@pytest.mark.parametrize(
    ("response", "gold", "score"),
    [
        # The examples, unboxed.
        ("So the result is $\\frac13$.", "1/3", 1.0),
        ("So $k = \\frac{1}{3}$.", "\\frac{1}{3}", 1.0),
        ("We get $\\dfrac{1}{3}$.", "\\frac13", 1.0),
        ("We get $\\sqrt3$.", "\\sqrt{3}", 1.0),
        ("We get 1 000 apples.", "1000", 1.0),
        ("It costs 1000,99 euros.", "1000.99", 1.0),
        ("It is .4 here.", "0.4", 1.0),
        ("so $x \\geq 5$", "x >= 5", 1.0),
        ("so $5 \\leq x$", "x \\ge 5", 1.0),
        ("so $5 \\geq x$", "x \\ge 5", 0.0),
        ("so $[0,1)$", "[0,1)", 1.0),
        ("so $(0,1]$", "[0,1)", 0.0),
        ("so $\\begin{pmatrix}1\\\\2\\end{pmatrix}$", "\\begin{bmatrix}1\\\\2\\end{bmatrix}", 1.0),
        (
            "so $\\left[\\begin{array}{c}1\\\\2\\end{array}\\right]$",
            "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
            1.0,
        ),
        ("so $\\begin{pmatrix}1\\\\3\\end{pmatrix}$", "\\begin{bmatrix}1\\\\2\\end{bmatrix}", 0.0),
        ("so $\\frac{1}{3} \\text{meters}$", "\\frac13", 1.0),
        ("so $\\left( \\frac{1}{3} \\right)$", "\\frac13", 1.0),
        ("so $y=-\\frac{1}{2}x+\\frac{3}{4}$", "2x+4y-3=0", 1.0),  # up to a factor: math-verify
        ("so $x = 5+5+1 = 1/3 \\approx 11$", "1/3", 1.0),
        ("the code is AZYUK2A", "2", 0.0),
        ("so $\\{1,2,3\\}$", "\\{3,2,1\\}", 1.0),
        ("so $(1,2,3)$", "(3,2,1)", 0.0),
        ("so $x=1$ or $x=2$", "1,2", 1.0),
        ("the area is $54\\text{ cm}^2$.", "54", 1.0),
        ("so $d = 15\\frac{39}{40}$", "\\frac{639}{40}", 1.0),  # a mixed number
        ("so $x \\in (-\\infty, 2) \\cup (3, \\infty)$", "(-\\infty, 2) \\cup (3, \\infty)", 1.0),
        ("so $x \\in (-\\infty, 2) \\cup [3, \\infty)$", "(-\\infty, 2) \\cup (3, \\infty)", 0.0),
        ("so $50\\%$", "0.5", 1.0),
        ("so $1\\,000$ and we are done", "1000", 1.0),
        ("is $\\boxed{32, 349}$", "32349", 0.0),  # a comma and a space: a list, not a separator
        ("is $\\boxed{32,\\! 349}$", "32349", 1.0),
        ("Soucis : 2,74 $ a..", "2.74", 1.0),  # a sentence is not a bare answer; its number is
    ],
)
def test_unboxed_latex_responses(response: str, gold: str, score: float) -> None:
    r = math_compute_score("math", response, gold)
    assert r.score == score, (r.extracted, r.info)
    assert r.status in ((Status.OK,) if score else (Status.OK, Status.UNPARSEABLE))


@pytest.mark.parametrize("text", ["blah", "I do not know.", "It is x, or maybe y", "so it is infinity"])
def test_text_without_digits_dollars_or_backslashes_is_unparseable_inline(text: str) -> None:
    """math-verify's default reading needs a digit, a ``$`` or a LaTeX command; without any, the fast
    path says unparseable (no pool) and math-verify agrees it reads nothing."""
    from math_verify import parse

    r = math_fast("math", text, "42")
    assert r is not None and r.status == Status.UNPARSEABLE
    assert parse(text) == []


def test_unclosed_openers_are_read_in_linear_time() -> None:
    """A response of unclosed ``\\[`` or ``\\(`` openers (the extraction runs inline, in the trainer's
    thread) used to take seconds: every opener scanned to the end of the text."""
    import time

    from stepcredit.reward.verifiers.math import extract_answer

    for opener in ("\\[", "\\("):
        t0 = time.perf_counter()
        assert extract_answer(opener * 40_000) == (None, "none")
        # quiet: 0.05 s (linear); the quadratic scan took 1.2 s at 5,000 openers, so ~77 s here:
        # the bound is 100x the one and 1/15 of the other
        assert time.perf_counter() - t0 < 5.0
    # a closed environment after them is still read
    assert extract_answer("\\[" * 50 + " so \\[ x = 5 \\]")[0] == "x = 5"
