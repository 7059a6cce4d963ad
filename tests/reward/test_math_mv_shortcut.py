"""The fast path's reading of what math-verify would read (``_mv_first_number``) against math-verify itself.

When the answer math-verify would try first is a plain number (or an ``= N`` chain it compares by N),
the fast path calls "incorrect" without math-verify's LaTeX parser. Both halves are checked here on
responses as a policy writes them (MATH-500 solutions ending in another row's answer, boxed and
unboxed) and on hostile spellings made to sit on the edges of math-verify's extraction: whatever the
shortcut reads is the number ``math_verify.parse`` returns, and whatever it calls incorrect, math-verify
(default configuration, and the slow path's own reading) calls incorrect too.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import sympy

from stepcredit.reward.verifiers.math import (
    _mv_first_number,
    _plain_number,
    _raw_golds,
    _reads_whole,
    extract_answer,
    math_fast,
    math_verify_verdict,
)

mv = pytest.importorskip("math_verify")
from math_verify.grader import is_equation, take_last_relation  # noqa: E402

DATA = Path(os.environ.get("STEPCREDIT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
MATH500 = DATA / "math500" / "test.jsonl"

HOSTILE = [
    # (response, gold)
    ("So the total is $x = 3$.", "27"),
    ("Hence $28.$", "27"),
    ("We get $96+48 = 78$.", "144"),
    ("We get $96+48 = 78$.", "78"),
    ("Thus $a = b = 7$.", "5"),
    ("Thus $f(2) = 3 = 4$.", "3"),
    ("So $e = 5$.", "2"),
    ("So $i = 5$.", "2"),
    ("So $x = 5$ and then 7 apples remain.", "5"),
    ("So $x = 5$ and then 7 apples remain.", "7"),
    ("The answer is 12, not $15$.", "12"),
    ("Answer: $15$ (we checked $12$).", "12"),
    ("So $15\\%$ of them.", "15"),
    ("So $15$ percent of them.", "0.15"),
    ("So $1,000$ people.", "1000"),
    ("So $1{,}5$.", "1.5"),
    ("So $0.333333$.", "\\frac{1}{3}"),
    ("So $0.25$.", "\\frac{1}{4}"),
    ("So $0.3$.", "\\frac{1}{4}"),
    ("So $\\frac{14}{3}$.", "p - q"),
    ("So $10$.", "x=5"),
    ("So $5$.", "x=5"),
    ("So $3$.", "y = 2x + 1"),
    ("So $4$.", "x = y = 4"),
    ("So $n = 144.$", "1,-2"),
    ("So $n = 144.$", "n = 144"),
    ("So $n = 144.$", "(144, 1)"),
    ("So $72.$", "3, 5, 7"),
    ("So $9$.", "9\\%"),
    ("So $2$.", "\\text{even}"),
    ("So $42$.", "\\text{Evelyn}"),
    ("So $6$.", "6"),
    ("Therefore $3! \\times 5! = 720$.", "720"),
    ("Therefore $5! = 720 = 12$.", "720"),
    ("Therefore $x \\le 5 = 4$.", "5"),
    ("Therefore $x = 1 or 2 = 3$.", "2"),
    ("We find $5 \\text{ cm} = 7$.", "5"),
    ("We find $m = 7$.", "5"),
    ("We find $\\frac{1}{2} = 0.5$, so $\\frac{1}{3}$.", "\\frac{1}{2}"),
    ("$x$ is $-\\frac{1}{2}$", "\\frac{1}{2}"),
    ("$x$ is $-\\dfrac{1}{2}$", "-\\frac{1}{2}"),
    ("<think>it is $5$</think> So $6$.", "5"),
    ("The final answer is $7$. I hope it is correct. Also $5$.", "5"),
    ("\\[ 2 + 3 = 6 \\]", "5"),
    ("So the value is [ 6 ] here.", "5"),
    ("Then \\( y = 12 \\)", "13"),
    ("total $5$ and $6$", "6"),
    ("total $5$, $6$", "5"),
    ("It costs $5.", "5"),
    ("It costs \\$5 or 7 dollars", "5"),
    ("So $x=3$. $$y = 4$$", "3"),
    ("So we have 3 + 4 = 8", "7"),
    ("There are 007 items", "7"),
    ("There are .5 items", "0.5"),
    ("There are -.5 items", "-0.5"),
    ("Thus $2 = 3 = 4$.", "4"),
    ("Thus $AB = 12$.", "13"),
    ("Thus $AB = 12$.", "AB = 13"),
    ("Thus $\\pi r^2 = 12$", "12\\pi"),
    ("So $x = 5.$", "6"),
    ("So $x = 5.$ And 6 more.", "6"),
    ("So $\\frac{1}{2}.$ Then 3", "3"),
    ("So $n = \\frac{3}{4}.$", "\\frac{1}{2}"),
    ("So $a = b = 7.$", "6"),
    ("So $3 + 4 = 7.$", "8"),
    ("So $2.5.$", "2"),
    ("So $5 .$", "4"),
    ("So $x^2.$", "4"),
    ("So $3\\sqrt{13}$", "4"),
    ("So $3\\sqrt{13}$", "3\\sqrt{13}"),
    ("So $3\\sqrt{13}.$", "3"),
    ("So $\\sqrt{51}$", "p - q"),
    ("So $\\sqrt{51}$", "x = 7"),
    ("So $-\\frac{\\pi}{6}$", "12"),
    ("So $-\\frac{\\pi}{6}$", "-\\frac{\\pi}{6}"),
    ("So $(2+3)^2$", "24"),
    ("So $\\sqrt{4}$", "2"),
    ("So $\\sqrt{4}$", "3"),
    ("So $\\sqrt{2}$", "(1, 2)"),
    ("So $\\sqrt{2}$", "x > 1"),
    ("So $\\sqrt{2}$", "1.41421356"),
    ("So $\\sqrt{2}$", "\\frac{\\sqrt{8}}{2}"),
    ("So $2\\pi$", "6.28"),
    ("So $\\pi r^2 = 2\\pi$", "\\pi"),
    ("So $x = \\sqrt{3}$", "x = 2"),
    ("The answer is \\boxed{12}", "13"),
    ("The answer is \\boxed{12} and \\boxed{13}", "13"),
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5"),
    ("The answer is \\boxed{0.5}", "\\frac{1}{3}"),
    ("The answer is \\boxed{2}", "x=2"),
    ("The answer is \\boxed{3}", "x=2"),
    ("The answer is \\boxed{3}", "\\{1, 3\\}"),
    ("The answer is \\boxed{3}", "3\\%"),
]


def _policy_like(limit: int) -> list[tuple[str, str]]:
    """MATH-500 solutions ending in another row's answer, boxed and with the box removed."""
    if not MATH500.exists():
        pytest.skip(f"{MATH500} not found (set STEPCREDIT_SHARED_DATA)")
    rows = [json.loads(line) for line in MATH500.open()]
    random.Random(5).shuffle(rows)
    rows = rows[:limit]
    out = []
    for i, row in enumerate(rows):
        other = rows[(i + 1) % len(rows)]["answer"]
        sol = row["solution"]
        start = sol.rfind("\\boxed{")
        if start < 0:
            continue
        depth, end = 0, start + len("\\boxed")
        for end in range(start + len("\\boxed"), len(sol)):
            depth += {"{": 1, "}": -1}.get(sol[end], 0)
            if depth == 0:
                break
        out.append((sol[:start] + f"\\boxed{{{other}}}" + sol[end + 1 :], row["answer"]))
        before = sol[:start]
        inner = other if before.count("$") % 2 == 1 else f"${other}$"
        out.append((before + inner + sol[end + 1 :], row["answer"]))
    return out


def _mv_value(parsed: list[object]) -> object:
    """The value math-verify compares with a gold that is no equation: an equation's last right side."""
    x = parsed[0]
    return take_last_relation(x).rhs if isinstance(x, sympy.Basic) and is_equation(x) else x


@pytest.mark.parametrize("source", ["hostile", "policy"])
def test_shortcut_reads_what_math_verify_reads_and_never_contradicts_it(source: str) -> None:
    pairs = (
        HOSTILE
        if source == "hostile"
        else _policy_like(int(os.environ.get("STEPCREDIT_SHORTCUT_ROWS", "250")))
    )
    read = decided = 0
    for response, gold in pairs:
        got = _mv_first_number(response.rsplit("</think>", 1)[-1])
        if got is not None:
            read += 1
            parsed = mv.parse(response.rsplit("</think>", 1)[-1])
            assert parsed, (response, got)
            value = _mv_value(parsed)
            if isinstance(got[0], complex):  # an exact constant, read as its value
                assert abs(complex(sympy.sympify(value).evalf(30)) - got[0]) < 1e-9, (response, parsed)
            else:
                exact = sympy.Rational(got[0].numerator, got[0].denominator)
                assert sympy.nsimplify(value) == exact, (response, parsed)
        fast = math_fast("math", response, gold)
        pred, how = extract_answer(response)
        shortcut = got is not None or (
            how == "boxed" and pred is not None and _plain_number(pred) is not None
        )
        if fast is None or fast.score == 1.0 or not shortcut:
            continue  # the other fast verdicts have their own differential tests (labelled pairs)
        decided += 1
        # whatever the fast path calls incorrect, math-verify calls incorrect too: by default (but for
        # the documented deliberate difference, a bare gold its default reads only in part) ...
        partial = "$" not in gold and not _reads_whole(tuple(mv.parse(gold)), gold)
        assert partial or not mv.verify(mv.parse(gold), mv.parse(response)), (response, gold)
        # ... and as the slow path would read the pair
        body = response.rsplit("</think>", 1)[-1]
        for g in _raw_golds(gold):
            verdict, _ = math_verify_verdict(g, body, pred, how)
            assert not verdict, (response, gold)
    # the shortcut is exercised, not skipped over
    assert read >= (20 if source == "hostile" else 100)
    assert decided >= (15 if source == "hostile" else 100)


def test_long_texts_are_left_to_the_pool() -> None:
    """math-verify's regexes are quadratic on unclosed openers: past the bound the shortcut is not run
    inline (the pool reads the text, and kills a hung reading)."""
    from stepcredit.reward.verifiers.math import _MV_REGEX_MAX_CHARS

    short = "Thus $96+48 = 78$."
    assert math_fast("math", short, "144") is not None
    padded = "\\[" * (_MV_REGEX_MAX_CHARS // 2) + short
    assert math_fast("math", padded, "144") is None


def _set_cases(n: int, seed: int) -> list[str]:
    """Tuples, intervals and unions of them as answers spell them: integers of every size, fractions,
    infinities, multiples and fractions of pi, both bracket kinds, with ``\\left``/``\\right`` or not,
    spaces or none, empty and degenerate intervals ("(3,1)", "[2,2]"), "x \\in" before them."""
    rng = random.Random(seed)

    def elem() -> str:
        r = rng.random()
        if r < 0.15:
            return rng.choice(["\\infty", "-\\infty"])
        if r < 0.35:
            frac = rng.choice(["\\frac", "\\dfrac", "\\tfrac"])
            return f"{rng.choice(['', '-'])}{frac}{{{rng.randint(0, 30)}}}{{{rng.randint(1, 12)}}}"
        if r < 0.5:
            pi = rng.choice(["\\pi", f"{rng.randint(0, 12)}\\pi", f"\\frac{{\\pi}}{{{rng.randint(1, 12)}}}"])
            return rng.choice(["", "-"]) + pi
        return str(rng.choice([rng.randint(-5, 5), rng.randint(-(10**6), 10**6), 0]))

    def group() -> str:
        k = rng.choice([2, 2, 2, 3, 4])
        sep = rng.choice([",", " , ", ", "])
        body = sep.join(elem() for _ in range(k))
        pad = rng.choice(["", " "])
        left, right = rng.choice([("", ""), ("\\left", "\\right")])
        return left + rng.choice("([") + pad + body + pad + right + rng.choice(")]")

    out = []
    for _ in range(n):
        if rng.random() < 0.6:
            one = group()
        else:
            one = rng.choice([" \\cup ", "\\cup"]).join(group() for _ in range(rng.choice([2, 3])))
        if rng.random() < 0.2:  # "x \in [a, b]"
            one = rng.choice("abcxyzt") + rng.choice([" \\in ", "\\in "]) + one
        out.append(one)
    fracs = [
        "\\frac{4}{9}",
        "-\\frac{4}{9}",
        "\\dfrac{8}{4}",
        "\\frac{0}{5}",
        "\\tfrac{1}{2}",
        "x \\in [-2,7]",
    ]
    return (
        out + fracs + ["(3,1)", "[3,1]", "(3,1]", "[2,2]", "(2,2)", "(-\\infty,\\infty)", "(-0,3)", "(01,3)"]
    )


def test_set_reading_equals_math_verify() -> None:
    """The direct reading of a tuple/interval/union gold is exactly math-verify's parse of ``$gold$``
    (the same sympy tree, ``srepr``-equal, and the same matched text), on generated spellings and on
    every MATH-500 answer the reader takes; so the slow path's verdicts cannot change."""
    from stepcredit.reward.verifiers.math import _mv_parse, _set_reading

    golds = [json.loads(line)["answer"] for line in MATH500.open()] if MATH500.exists() else []
    cases = _set_cases(60, seed=7) + golds
    checked = 0
    for c in cases:
        direct = _set_reading(c)
        if direct is None:
            continue
        checked += 1
        parsed = tuple(_mv_parse(f"${c}$"))
        assert [x if isinstance(x, str) else sympy.srepr(x) for x in direct] == [
            x if isinstance(x, str) else sympy.srepr(x) for x in parsed
        ], c
    assert checked >= 50
    # forms it does not know are left to the parser
    unknown = [
        "(1,2,3]",
        "e \\in [1,2]",
        "x \\in 5",
        "\\left( 3, \\frac{2\\pi}{3} \\right)",
        "(1.5,2)",
        "(5)",
        "{1,2}",
    ]
    for c in [*unknown, "\\frac{1}{0}"]:
        assert _set_reading(c) is None, c


@pytest.mark.parametrize("source", ["hostile", "policy"])
def test_parse_on_shared_matches_equals_parse(source: str) -> None:
    """The slow path reads a response on the regex matches the fast path found (``_mv_parse_text``):
    exactly what ``math_verify.parse`` returns, value and text, on every response here."""
    from stepcredit.reward.verifiers.math import _mv_parse_text

    pairs = HOSTILE if source == "hostile" else _policy_like(120)
    for response, _ in pairs:
        ours = _mv_parse_text(response)
        theirs = mv.parse(response)
        assert [x if isinstance(x, str) else sympy.srepr(x) for x in ours] == [
            x if isinstance(x, str) else sympy.srepr(x) for x in theirs
        ], response
