"""Mutation pass over MATH-500's gold answers: our verdict against math-verify's on every pair.

Every gold is re-spelled in the notations of issue 25 (boxed and unboxed, ``x = ...``, a decimal that
approximates an exact gold to the precision it is written with, set and list orders, an answer spread
over several ``\\boxed{}``, intervals against inequalities, a decimal comma) and perturbed into wrong
answers (a digit changed, another row's gold). The label is the mathematical truth of the pair; the
property is the differential test's: on no pair is math-verify (default configuration) right while we
are wrong, except the documented deliberate difference (a bare gold that math-verify's default reads
only in part).

The suite runs a fixed-seed sample of golds (``SAMPLE``); ``STEPCREDIT_MATH500_ALL=1`` runs all 500
and prints the counts.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stepcredit.reward.verifiers.latex import Seq, const_value, normalize, parse_answer, to_number
from stepcredit.reward.verifiers.math import _reads_whole, fast_verdict, math_compute_score

mv = pytest.importorskip("math_verify")

DATA = Path(os.environ.get("STEPCREDIT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
MATH500 = DATA / "math500" / "test.jsonl"
SAMPLE = 150
"""Golds per suite run (fixed seed); the full pass runs all of them."""


@dataclass(frozen=True)
class Pair:
    kind: str
    response: str
    gold: str
    label: bool


def _boxed(a: str) -> str:
    return f"We simplify step by step. The answer is $\\boxed{{{a}}}$."


def _unboxed(a: str) -> str:
    return f"We simplify step by step, and therefore the result is ${a}$."


def perturb(gold: str) -> str | None:
    """``gold`` with its last digit changed (a wrong answer of the same shape; never a base subscript
    such as ``52_8``, whose digit changes the base); None without digits."""
    digits = [m.start() for m in re.finditer(r"(?<!_)(?<!_\{)\d", gold)]
    if not digits:
        return None
    i = digits[-1]
    return gold[:i] + str((int(gold[i]) + 1) % 10) + gold[i + 1 :]


_INTERVAL_RE = re.compile(
    r"^\s*(?:\\left)?([\[(])\s*(-?\d+|-\\infty)\s*,\s*(-?\d+|\\infty)\s*(?:\\right)?([\])])\s*$"
)
_DECIMAL_RE = re.compile(r"^-?\d+\.\d+$")


def _inequality(lo_b: str, lo: str, hi: str, hi_b: str) -> str:
    """``x`` in the interval written as an inequality."""
    le = "\\le"
    parts = []
    if lo != "-\\infty":
        parts.append(f"{lo} {'<' if lo_b == '(' else le} ")
    parts.append("x")
    if hi != "\\infty":
        parts.append(f" {'<' if hi_b == ')' else le} {hi}")
    return "".join(parts)


def mutations(gold: str, other: str) -> Iterator[Pair]:
    """The right and wrong respellings of one gold (``other``: a different row's gold)."""
    n = normalize(gold)
    wrong = perturb(gold)
    yield Pair("boxed", _boxed(gold), gold, True)
    yield Pair("unboxed", _unboxed(gold), gold, True)
    if fast_verdict(gold, other) is not True and fast_verdict(other, gold) is not True:
        yield Pair("other_gold", _boxed(other), gold, False)  # "x=5" is no other answer than "5"
    if wrong is not None:
        yield Pair("boxed", _boxed(wrong), gold, False)
        yield Pair("unboxed", _unboxed(wrong), gold, False)
    parsed = parse_answer(n)
    if isinstance(parsed, str) and not re.search(r"=|<|>|\\le|\\ge|\\text|,", gold):
        yield Pair("assignment", _boxed(f"x = {gold}"), gold, True)
        yield Pair("assignment", _unboxed(f"x = {gold}"), gold, True)
        if wrong is not None:
            yield Pair("assignment", _boxed(f"x = {wrong}"), gold, False)
    value = const_value(n)
    exact = to_number(n)
    if value is not None and value[0].imag == 0 and not value[1]:
        v = value[0].real
        if not (exact is not None and exact[0].denominator == 1):
            # an exact non-integer gold (fraction, root, pi): its decimal approximation
            for k in (2, 4):
                yield Pair("approximation", _boxed(f"{v:.{k}f}"), gold, True)
            yield Pair("approximation", _unboxed(f"{v:.3f}"), gold, True)
            yield Pair("approximation", _boxed(f"{v + 0.1:.3f}"), gold, False)
    if _DECIMAL_RE.match(gold.strip()):
        yield Pair("decimal_comma", _boxed(gold.strip().replace(".", ",")), gold, True)
        if wrong is not None and _DECIMAL_RE.match(wrong.strip()):
            yield Pair("decimal_comma", _boxed(wrong.strip().replace(".", ",")), gold, False)
    m = _INTERVAL_RE.match(gold)
    if m and ("\\infty" in gold or "[" in gold or "]" in gold):
        # unambiguous intervals only: "(-2, 1)" may be a point
        lo_b, lo, hi, hi_b = m.groups()
        yield Pair("interval_inequality", _boxed(_inequality(lo_b, lo, hi, hi_b)), gold, True)
        flipped = "(" if lo_b == "[" and lo != "-\\infty" else lo_b
        flipped_hi = ")" if hi_b == "]" else ("]" if hi != "\\infty" else hi_b)
        if (flipped, flipped_hi) != (lo_b, hi_b):
            yield Pair("interval_inequality", _boxed(_inequality(flipped, lo, hi, flipped_hi)), gold, False)
    if (
        isinstance(parsed, Seq)
        and 2 <= len(parsed.items) <= 4
        and all(isinstance(x, str) for x in parsed.items)
        and parsed.open + parsed.close in ("()", "{}", "")
    ):
        # a list or set in another order, and spread over several boxes (a tuple keeps its order)
        items = [str(x) for x in parsed.items]
        ordered = not parsed.unordered
        seq = items if ordered else items[::-1]
        yield Pair("several_boxes", "So " + " and ".join(f"$\\boxed{{{x}}}$" for x in seq) + ".", gold, True)
        bad = [*seq[:-1], perturb(seq[-1]) or "0"]
        if bad != seq:
            yield Pair(
                "several_boxes", "So " + " and ".join(f"$\\boxed{{{x}}}$" for x in bad) + ".", gold, False
            )
        if not ordered:
            yield Pair("list_order", _boxed(", ".join(seq)), gold, True)


def load_golds() -> list[str]:
    return [json.loads(line)["answer"] for line in MATH500.open()]


def generate(golds: list[str], sample: int | None, seed: int = 25) -> list[Pair]:
    idx = list(range(len(golds)))
    if sample is not None and sample < len(idx):
        idx = sorted(random.Random(seed).sample(idx, sample))
    pairs: list[Pair] = []
    for i in idx:
        j = next(k % len(golds) for k in range(i + 1, i + len(golds)) if golds[k % len(golds)] != golds[i])
        pairs.extend(mutations(golds[i], golds[j]))
    return pairs


def math_verify_verdict(pair: Pair) -> bool:
    """math-verify's default configuration: ``verify(parse(gold), parse(response))``."""
    pred = mv.parse(pair.response, parsing_timeout=None)
    return bool(mv.verify(mv.parse(pair.gold, parsing_timeout=None), pred, timeout_seconds=None))


def partial_gold_reading(gold: str) -> bool:
    """The deliberate difference (docs/verifiers.md): math-verify's default reads only part of this bare gold."""
    return "$" not in gold and not _reads_whole(tuple(mv.parse(gold, parsing_timeout=None)), gold)


def run_pass(pairs: list[Pair], *, every: bool) -> tuple[Counter[str], list[Pair]]:
    """Counts (pairs, ours right, math-verify right, worse, better, deliberate) and the worse pairs.

    ``every``: run math-verify on every pair (the full pass, for the counts); else only where we are
    wrong, which checks the same property (a pair we get right is never one where we are worse)."""
    counts: Counter[str] = Counter()
    worse: list[Pair] = []
    for pair in pairs:
        ours = math_compute_score("math", pair.response, pair.gold).score == 1.0
        counts["pairs"] += 1
        counts["ours_right"] += ours == pair.label
        if ours == pair.label and not every:
            continue
        theirs = math_verify_verdict(pair)
        counts["math_verify_right"] += theirs == pair.label
        counts["better"] += ours == pair.label != theirs
        if theirs == pair.label != ours:
            if partial_gold_reading(pair.gold):
                counts["deliberate"] += 1
            else:
                counts["worse"] += 1
                worse.append(pair)
    return counts, worse


@pytest.mark.skipif(not MATH500.is_file(), reason="MATH-500 not found (set STEPCREDIT_SHARED_DATA)")
def test_math500_mutations_never_worse_than_math_verify() -> None:
    full = os.environ.get("STEPCREDIT_MATH500_ALL") == "1"
    pairs = generate(load_golds(), None if full else SAMPLE)
    kinds = Counter((p.kind, p.label) for p in pairs)
    for kind in ("boxed", "unboxed", "assignment", "approximation", "several_boxes", "other_gold"):
        assert kinds[(kind, True)] + kinds[(kind, False)] > 0, kind
    counts, worse = run_pass(pairs, every=full)
    if full:
        print(dict(counts), dict(kinds))
        assert counts["ours_right"] >= counts["math_verify_right"], counts
    assert not worse, f"{len(worse)} pairs where math-verify is right and we are wrong: {worse[:10]}"
    # the sample holds respellings we get right and wrong answers we reject, not only misses
    assert counts["ours_right"] >= 0.9 * counts["pairs"], counts


def test_mutations_are_what_they_say() -> None:
    assert perturb("\\frac{14}{3}") == "\\frac{14}{4}"
    assert perturb("\\text{Evelyn}") is None
    assert perturb("4210_{5}") == "4211_{5}"
    kinds = {(p.kind, p.label): p.response for p in mutations("[-2, 7)", "5")}
    assert "-2 \\le x < 7" in kinds[("interval_inequality", True)]
    approx = [p.response for p in mutations("\\frac{14}{3}", "5") if p.kind == "approximation" and p.label]
    assert any("4.67" in r for r in approx) and any("4.6667" in r for r in approx)
    several = [p.response for p in mutations("3, 5, 7", "5") if p.kind == "several_boxes" and p.label]
    assert several == ["So $\\boxed{7}$ and $\\boxed{5}$ and $\\boxed{3}$."]
