"""Differential test: our math verdicts against math-verify's on generated (prediction, gold) pairs.

Each category of the issue (fractions, roots, separators, decimal commas, percentages, units and text
wrappers, ``\\left``/``\\right``, assignments, chains and ``\\approx``, relations, intervals, sets, tuples,
matrices, equations up to a factor, several answers, numbers inside words) is spelled many ways, right
and wrong, inside responses with and without ``\\boxed{}``. The label is the mathematical truth of the
pair. The property: on no pair is math-verify right while we are wrong. Pairs are generated from a
fixed seed; nothing is cached between runs.
"""

from __future__ import annotations

import math
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction

import pytest

from stepcredit.reward.verifiers.math import math_compute_score

mv = pytest.importorskip("math_verify")


@dataclass(frozen=True)
class Pair:
    category: str
    response: str
    gold: str
    label: bool
    boxed: bool


# ------------------------------------------------------------------------------------ responses
_LEAD_INS = (
    "First note that $2+3=5$ and that $x$ is positive. ",
    "We have 3 cases to check, and case 2 fails. ",
    "Let $f(x) = x^2$. Then $f(3) = 9$. ",
    "",
)
_UNBOXED = (
    "Therefore the result is ${a}$.",
    "Putting it together, we get $$ {a} $$",
    "Hence \\({a}\\).",
    "So we conclude\n\\[\n{a}\n\\]",
    "which gives ${a}$",
)


def _respond(rng: random.Random, answer: str, *, boxed: bool) -> str:
    lead = rng.choice(_LEAD_INS)
    if boxed:
        return (
            lead + rng.choice(("The answer is $\\boxed{%s}$.", "Thus $\\boxed{%s}$", "\\boxed{%s}")) % answer
        )
    return lead + rng.choice(_UNBOXED).replace("{a}", answer)


# ---------------------------------------------------------------------------------- categories
Spellings = Iterator[tuple[str, list[str], list[str]]]
"""(gold, right spellings, wrong spellings) for one generated value."""


def _frac_tex(q: Fraction, cmd: str = "\\frac") -> str:
    sign = "-" if q < 0 else ""
    return f"{sign}{cmd}{{{abs(q.numerator)}}}{{{q.denominator}}}"


def fractions_(rng: random.Random) -> Spellings:
    while True:
        b = rng.randint(2, 12)
        a = rng.randint(1, 20)
        if math.gcd(a, b) != 1:
            continue
        q = Fraction(a, b)
        right = [_frac_tex(q, c) for c in ("\\frac", "\\dfrac", "\\tfrac", "\\cfrac")]
        right += [f"{a}/{b}", f"\\frac{{{2 * a}}}{{{2 * b}}}", f"\\left( \\frac{{{a}}}{{{b}}} \\right)"]
        if a < 10 and b < 10:
            right += [f"\\frac{a}{b}", f"\\dfrac{a}{b}", f"\\frac{a}{{{b}}}"]
        wrong = [_frac_tex(q + 1), f"\\frac{{{b}}}{{{a}}}" if a != b else "0", f"{a + 1}/{b}"]
        yield _frac_tex(q), right, wrong


def roots(rng: random.Random) -> Spellings:
    while True:
        n = rng.choice((2, 3, 5, 6, 7))
        k = rng.randint(2, 5)
        right = [f"{k}\\sqrt{{{n}}}", f"{k}\\sqrt{n}", f"\\sqrt{{{k * k * n}}}", f"{k} \\sqrt {n}"]
        wrong = [f"{k + 1}\\sqrt{{{n}}}", f"\\sqrt{{{k * n}}}", f"{k}\\sqrt{{{n + 1}}}"]
        yield f"{k}\\sqrt{{{n}}}", right, wrong
        right = [f"\\sqrt{n}", f"\\sqrt{{{n}}}", f"\\frac{{{n}}}{{\\sqrt{{{n}}}}}"]
        yield f"\\sqrt{{{n}}}", right, [f"\\sqrt{{{n + 1}}}", f"{n}"]


def _groups(n: int, sep: str) -> str:
    return f"{n:,}".replace(",", sep)


def separators(rng: random.Random) -> Spellings:
    while True:
        n = rng.randint(1_000, 9_999_999)
        seps = (",", "{,}", "\\,", "\\!", " ", "\u2009")
        right = [_groups(n, s) for s in seps]
        m = n + rng.choice((1, 10, 1000))
        wrong = [_groups(m, s) for s in seps[:3]]
        yield str(n), right, wrong


def decimals(rng: random.Random) -> Spellings:
    while True:
        whole = rng.randint(0, 5000)
        cents = rng.randint(1, 99)
        gold = f"{whole}.{cents:02d}"
        right = [f"{whole},{cents:02d}"] + ([f".{cents:02d}"] if whole == 0 else [])
        wrong = [f"{whole},{(cents + 1) % 100:02d}", f"{whole + 1},{cents:02d}"]
        yield gold, right, wrong
        d = rng.randint(1, 9)
        yield f"0.{d}", [f".{d}", f"0.{d}0"], [f".{d}1", f"{d}"]


def percentages(rng: random.Random) -> Spellings:
    while True:
        p = rng.randint(1, 99)
        yield str(p), [f"{p}\\%", f"{p}%", f"{p} \\%"], [f"{p + 1}\\%"]
        yield f"{p}\\%", [str(p), f"{p}\\%"], [str(p + 2)]


def units_text(rng: random.Random) -> Spellings:
    while True:
        n = rng.randint(2, 500)
        unit = rng.choice(("meters", "cm", "dollars", "km", "apples"))
        right = [
            f"{n}\\text{{ {unit}}}",
            f"{n} \\text{{{unit}}}",
            f"\\textbf{{{n}}}",
            f"\\mathrm{{{n}}}",
            f"\\text{{{n}}}",
            f"\\mbox{{{n}}} \\mbox{{ {unit}}}",
            f"{n}^\\circ" if unit == "cm" else f"{n}\\,\\text{{{unit}}}",
        ]
        wrong = [f"{n + 1}\\text{{ {unit}}}", f"\\textbf{{{n - 1}}}"]
        yield str(n), right, wrong
        q = Fraction(1, rng.randint(2, 9))
        yield _frac_tex(q), [_frac_tex(q) + f" \\text{{{unit}}}"], [_frac_tex(q + 1) + f"\\text{{ {unit}}}"]


def assignments(rng: random.Random) -> Spellings:
    while True:
        var = rng.choice("xyknabt")
        q = Fraction(rng.randint(-20, 20), rng.choice((1, 1, 2, 3, 7)))
        v = _frac_tex(q) if q.denominator > 1 else str(q.numerator)
        right = [f"{var} = {v}", f"{var}={v}", v]
        wrong = [f"{var} = {_frac_tex(q + 1) if q.denominator > 1 else q.numerator + 1}"]
        yield v, right, wrong
        yield f"{var} = {v}", [f"{var}={v}", v], [f"{var} = {q.numerator + 3}"]


def chains(rng: random.Random) -> Spellings:
    while True:
        a, b, c = (rng.randint(1, 30) for _ in range(3))
        s = a + b + c
        right = [f"x = {a}+{b}+{c} = {s}", f"{a} + {b} + {c} = {s}", f"{a}+{b}+{c}={s}"]
        wrong = [f"x = {a}+{b}+{c} = {s + 1}"]
        yield str(s), right, wrong
        d = rng.choice((3, 7, 9, 11))
        q = Fraction(a, d) if math.gcd(a, d) == 1 else Fraction(1, d)
        approx = f"{float(q):.2f}"
        right = [f"{_frac_tex(q)} \\approx {approx}", f"x = {_frac_tex(q)} \\approx {approx}"]
        wrong = [f"{_frac_tex(q + 1)} \\approx {approx}"]
        yield _frac_tex(q), right, wrong


def relations(rng: random.Random) -> Spellings:
    ge = ("\\geq", "\\ge", ">=", "\\geqslant")
    le = ("\\leq", "\\le", "<=", "\\leqslant")
    while True:
        var = rng.choice("xyt")
        n = rng.randint(-9, 20)
        right = [f"{var} {g} {n}" for g in ge] + [f"{n} {lsym} {var}" for lsym in le]
        wrong = [f"{var} > {n}", f"{var} \\le {n}", f"{var} \\geq {n + 1}", f"{n} \\geq {var}"]
        yield f"{var} \\ge {n}", right, wrong
        lo, hi = n, n + rng.randint(1, 9)
        right = [f"{lo} < {var} \\le {hi}", f"{hi} \\geq {var} > {lo}", f"{lo}<{var}\\leq{hi}"]
        wrong = [f"{lo} \\le {var} \\le {hi}", f"{lo} < {var} < {hi}", f"{lo} < {var} \\le {hi + 1}"]
        yield f"{lo} < {var} \\leq {hi}", right, wrong


def intervals(rng: random.Random) -> Spellings:
    while True:
        a = rng.randint(-10, 10)
        b = a + rng.randint(1, 10)
        lo, hi = rng.choice("[("), rng.choice("])")
        other_lo, other_hi = "(" if lo == "[" else "[", ")" if hi == "]" else "]"
        gold = f"{lo}{a}, {b}{hi}"
        right = [f"{lo}{a},{b}{hi}", f"\\left{lo}{a}, {b}\\right{hi}", f"{lo} {a} , {b} {hi}"]
        wrong = [f"{other_lo}{a}, {b}{hi}", f"{lo}{a}, {b}{other_hi}", f"{lo}{a}, {b + 1}{hi}"]
        yield gold, right, wrong
        yield (
            f"(-\\infty, {a}]",
            [f"(-\\infty,{a}]", f"\\left(-\\infty, {a}\\right]"],
            [f"(-\\infty, {a})", f"[{a}, \\infty)", f"(-\\infty, {a + 1}]"],
        )


def sets(rng: random.Random) -> Spellings:
    while True:
        k = rng.randint(2, 4)
        items = rng.sample(range(-9, 15), k)
        gold = "\\{" + ", ".join(map(str, items)) + "\\}"
        perm = items[:]
        rng.shuffle(perm)
        right = [
            "\\{" + ",".join(map(str, perm)) + "\\}",
            "\\left\\{" + ", ".join(map(str, perm)) + "\\right\\}",
        ]
        changed = [*items[:-1], max(items) + 1]
        wrong = [
            "\\{" + ", ".join(map(str, changed)) + "\\}",
            "\\{" + ", ".join(map(str, items[:-1])) + "\\}",
        ]
        yield gold, right, wrong


def tuples(rng: random.Random) -> Spellings:
    while True:
        a, b = rng.sample(range(-9, 15), 2)
        c = rng.randint(1, 9)
        gold = f"({a}, {b})"
        right = [f"({a},{b})", f"\\left({a}, {b}\\right)", f"\\left( {a} , {b} \\right)"]
        wrong = [f"({b}, {a})", f"({a}, {b + 1})"]
        yield gold, right, wrong
        gold = f"({a}, {b}, \\frac{{1}}{{{c + 1}}})"
        right = [f"({a},{b},\\frac1{c + 1})" if c + 1 < 10 else gold, f"\\left({a}, {b}, 1/{c + 1}\\right)"]
        yield gold, right, [f"({a}, {b}, {c})", f"({b}, {a}, \\frac{{1}}{{{c + 1}}})"]


def _matrix(env: str, rows: list[list[int]]) -> str:
    body = " \\\\ ".join(" & ".join(map(str, r)) for r in rows)
    if env == "array":
        return f"\\left[\\begin{{array}}{{{'c' * len(rows[0])}}} {body} \\end{{array}}\\right]"
    if env == "array(":
        return f"\\left(\\begin{{array}}{{{'c' * len(rows[0])}}} {body} \\end{{array}}\\right)"
    return f"\\begin{{{env}}} {body} \\end{{{env}}}"


def matrices(rng: random.Random) -> Spellings:
    while True:
        r, c = rng.choice(((2, 1), (2, 2), (3, 1), (2, 3)))
        rows = [[rng.randint(-9, 9) for _ in range(c)] for _ in range(r)]
        changed = [row[:] for row in rows]
        changed[-1][-1] += 1
        right = [_matrix(e, rows) for e in ("pmatrix", "bmatrix", "array", "array(")]
        wrong = [_matrix(e, changed) for e in ("pmatrix", "bmatrix")]
        yield _matrix("pmatrix", rows), right, wrong


def equations(rng: random.Random) -> Spellings:
    while True:
        a, b = rng.randint(1, 5), rng.randint(1, 5)
        c = rng.randint(-9, 9)
        k = rng.randint(2, 4)
        gold = f"{a}x + {b}y = {c}"
        right = [
            f"{k * a}x + {k * b}y = {k * c}",
            f"{a}x + {b}y - {c} = 0" if c >= 0 else f"{a}x+{b}y+{-c}=0",
        ]
        wrong = [f"{a}x + {b}y = {c + 1}", f"{b}x + {a}y = {c}" if a != b else f"{a}x - {b}y = {c}"]
        yield gold, right, wrong


def several(rng: random.Random) -> Spellings:
    while True:
        a, b = rng.sample(range(-9, 15), 2)
        gold = f"{a}, {b}"
        right = [f"{b}, {a}", f"x = {a}, x = {b}", f"\\{{{a}, {b}\\}}"]
        wrong = [f"{a}, {b + 1}", f"{a}"]
        yield gold, right, wrong


CATEGORIES: dict[str, Callable[[random.Random], Spellings]] = {
    "fraction": fractions_,
    "root": roots,
    "separator": separators,
    "decimal": decimals,
    "percent": percentages,
    "unit_text": units_text,
    "assignment": assignments,
    "chain": chains,
    "relation": relations,
    "interval": intervals,
    "set": sets,
    "tuple": tuples,
    "matrix": matrices,
    "equation": equations,
    "several": several,
}
PER_CATEGORY = {"equation": 6}
"""Values per category (default 30); equations go to math-verify's sympy solve and are slow."""


def _plain_text_pairs(rng: random.Random) -> Iterator[Pair]:
    """Unanchored plain-text answers: numbers in prose, and digits inside words that are no answer."""
    for _ in range(50):
        n = rng.randint(1_000, 99_999)
        spaced = _groups(n, " ")
        yield Pair("plain_text", f"In total she has {spaced} apples.", str(n), True, False)
        yield Pair("plain_text", f"In total she has {_groups(n + 1, ' ')} apples.", str(n), False, False)
        d = rng.randint(1, 9)
        yield Pair("plain_text", f"The code is AZYUK{d}A, remember it.", str(d), False, False)
        yield Pair("plain_text", f"It is .{d} of the whole.", f"0.{d}", True, False)


def generate(seed: int = 13) -> list[Pair]:
    rng = random.Random(seed)
    pairs: list[Pair] = []
    for name, gen in CATEGORIES.items():
        values = gen(rng)
        for _ in range(PER_CATEGORY.get(name, 30)):
            gold, right, wrong = next(values)
            for label, spellings in ((True, right), (False, wrong)):
                for s in spellings:
                    for boxed in (True, False):
                        pairs.append(Pair(name, _respond(rng, s, boxed=boxed), gold, label, boxed))
    pairs.extend(_plain_text_pairs(rng))
    return pairs


def math_verify_verdict(pair: Pair) -> bool:
    """math-verify as its documentation uses it: the gold as LaTeX in ``$...$``, the response as is."""
    gold = mv.parse(f"${pair.gold}$", parsing_timeout=None)
    return bool(mv.verify(gold, mv.parse(pair.response, parsing_timeout=None), timeout_seconds=None))


def test_generated_pairs_cover_the_categories() -> None:
    pairs = generate()
    assert len(pairs) >= 5000
    per = Counter((p.category, p.label, p.boxed) for p in pairs)
    for name in [*CATEGORIES, "plain_text"]:
        assert per[(name, True, False)] > 0 and per[(name, False, False)] > 0, name
    assert generate() == pairs  # deterministic


SAMPLE_EVERY = 20
"""math-verify is run on every pair we get wrong, and on every 20th pair to check the labels.

Why not on all of them: math-verify takes ~24 ms per pair here (each new LaTeX string costs a fresh
ANTLR parse, often 50-100 ms for tuples, sets and matrices), ~120 s for the 5,000 pairs, while ours
take ~11 s. A pair we get right can never be one where math-verify is right and we are wrong, so
running it only where we are wrong checks the same property. ``STEPCREDIT_FULL_DIFFERENTIAL=1`` runs
it on every pair."""


def test_never_wrong_where_math_verify_is_right() -> None:
    full = os.environ.get("STEPCREDIT_FULL_DIFFERENTIAL") == "1"
    worse: list[tuple[str, str, str, bool]] = []
    sampled: Counter[bool] = Counter()
    for i, pair in enumerate(generate()):
        ours = math_compute_score("math", pair.response, pair.gold).score == 1.0
        if ours == pair.label and not full and i % SAMPLE_EVERY:
            continue
        theirs = math_verify_verdict(pair)
        sampled[theirs == pair.label] += 1
        if theirs == pair.label != ours:
            worse.append((pair.category, pair.response, pair.gold, pair.label))
    assert not worse, f"{len(worse)} pairs where math-verify is right and we are wrong: {worse[:10]}"
    # The labels are the mathematical truth, not our own verdicts: math-verify agrees with most of them.
    assert sampled[True] >= 0.85 * (sampled[True] + sampled[False]), sampled
