"""The fast path's newer "incorrect" verdicts, each checked against its label and against math-verify.

Labelled pairs (the label is the mathematical truth): a constant against an expression that is surely not
constant, against a matrix, a tuple or an interval; matrices of other sizes; and, on responses without a
box, every answer math-verify could read there surely wrong (:func:`mv_reads_only_wrong`). Equal pairs
sit beside each rule so that a widening that swallowed them would show. The property is the
differential test's: wherever math-verify (default configuration) is right, we are right.
"""

from __future__ import annotations

import pytest

from stepcredit.reward.verifiers.latex.variables import nonconstant
from stepcredit.reward.verifiers.math import fast_verdict, math_compute_score
from stepcredit.reward.verifiers.math.mv_scan import mv_reads_only_wrong

mv = pytest.importorskip("math_verify")

# (gold, answer, label)
PAIRS = [
    # a constant against a non-constant expression
    ("4", "x^8 + x^7 + x^6 + x^5 + x^4 + x^3 + x^2 + x + 1", False),
    ("203", "x^5 - x^4 + x^3 - x^2 + x - 1", False),
    ("850", "(a+5)(b+2)", False),
    ("\\frac{3\\sqrt{3}}{4}", "\\cot x", False),
    ("3R^2", "6\\sqrt{2}", False),
    ("10", "y = 2x + 3", False),  # a predicted equation: its right side
    ("0", "\\frac{11+9a}{20}", False),
    ("5", "5x", False),
    ("x = 5", "y", False),  # a gold assignment: its right side
    # ... and the equal or undecided spellings beside them
    ("5", "x = 5", True),
    ("x^2+1", "x^2+1", True),
    ("1", "\\sin^2 x + \\cos^2 x", True),  # constant: never called non-constant
    ("0", "(x+1)^2 - x^2 - 2x - 1", True),
    ("1", "x - x + 1", True),
    ("5", "5m", True),  # a unit math-verify drops ("m", meters): not the variable m
    ("2", "2 t", True),
    ("\\frac{1}{2}a", "\\frac{a}{2}", True),
    # a constant against a tuple, an interval, a set given by membership, a matrix
    ("12\\pi", "(2,4)", False),
    ("3 \\sqrt{5}", "(15,-29)", False),
    ("\\frac{20000}{\\pi}", "x \\in [-2,7]", False),
    ("(5,\\infty)", "12\\pi", False),
    ("0", "\\begin{pmatrix} -2 \\\\ -14 \\\\ -7 \\end{pmatrix}", False),
    ("2\\sqrt{5}", "\\begin{pmatrix} -7 \\\\ 16 \\\\ 5 \\end{pmatrix}", False),
    ("\\begin{pmatrix} 3 \\end{pmatrix}", "3", True),
    ("(2,4)", "(2,4)", True),
    # matrices of other sizes, or with an entry that differs
    ("\\begin{pmatrix} -2 \\\\ -14 \\\\ -7 \\end{pmatrix}", "\\left( \\frac{3}{2}, -13 \\right)", False),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}", False),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{bmatrix} 1 \\\\ 2 \\end{bmatrix}", True),
    (
        "\\begin{pmatrix} 1/2 \\\\ 2 \\end{pmatrix}",
        "\\begin{pmatrix} \\frac{1}{2} \\\\ 2 \\end{pmatrix}",
        True,
    ),
]


@pytest.mark.parametrize(("gold", "answer", "label"), PAIRS)
def test_widened_verdicts_follow_the_label_and_never_lose_to_math_verify(
    gold: str, answer: str, label: bool
) -> None:
    verdict = fast_verdict(gold, answer)
    assert verdict is label or (verdict is None and label), (gold, answer, verdict)
    for response in (f"So the answer is $\\boxed{{{answer}}}$.", f"Therefore the result is ${answer}$."):
        ours = math_compute_score("math", response, gold).score == 1.0
        theirs = bool(mv.verify(mv.parse(f"${gold}$"), mv.parse(response)))
        assert not (theirs == label != ours), (gold, response, ours, theirs)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("x", True),
        ("2k+2", True),
        ("\\cotx", True),  # as normalize writes "\cot x"
        ("a_1+z_{2002}", True),
        ("3", False),
        ("x-x", False),
        ("\\sin^2x", False),  # a power of a function: readers differ
        ("\\sinxy", False),  # sin(xy) or sin(x)y: readers differ
        ("e^x", False),  # e is Euler's number to math-verify
        ("2i", False),
        ("east", False),  # a word
        ("4210_{5}", False),  # a base subscript, no variable
        ("(x+10^{8})^2-x^2-2\\cdot10^{8}x-10^{16}", False),  # zero up to float error: not sure
        ("\\alpha+1", False),
    ],
)
def test_nonconstant(expr: str, expected: bool) -> None:
    assert nonconstant(expr) is expected


# (response without a box, gold, label): math-verify reads its own pick among the math there
UNBOXED = [
    ("We get $a_1 = 14 \\cdot 6^2 = 210$, and so $c = 14$ too.", "504", False),
    ("Let $x$ be the count. Then $x^2 - 4 = 0$ gives $x = 2$.", "7", False),
    ("The vertex is at $(2, 4)$, so the area is $12$.", "12\\pi", False),
    ("For $n = 3$ and $m = 5$ we find $\\frac{11}{36}$.", "\\cot x", False),
    # ... and responses where some candidate is the gold: never decided as wrong inline
    ("For $n = 3$ and $m = 5$ we find $\\frac{11}{36}$.", "5", False),
    ("Since $x = 5$, the answer is $5$.", "5", True),
    ("So $1$ and $2$.", "\\{1,2\\}", True),
    ("The speed is $5 \\text{ m}$.", "5", True),
    ("So the total is $25\\%$ of it.", "\\frac{1}{4}", True),
]


@pytest.mark.parametrize(("response", "gold", "label"), UNBOXED)
def test_only_wrong_readings_are_wrong(response: str, gold: str, label: bool) -> None:
    read = mv_reads_only_wrong(response, [gold])
    # the gold as math-verify documents it for LaTeX (bare, "12\pi" reads as 12: the deliberate difference)
    theirs = bool(mv.verify(mv.parse(f"${gold}$"), mv.parse(response)))
    if read is not None:
        assert not theirs, (response, gold, read)  # math-verify reads something wrong too
    ours = math_compute_score("math", response, gold).score == 1.0
    assert not (theirs == label != ours), (response, gold, ours, theirs)


def test_only_wrong_readings_decide_what_they_should() -> None:
    assert (
        mv_reads_only_wrong("We get $a_1 = 14 \\cdot 6^2 = 210$, and so $c = 14$ too.", ["504"]) is not None
    )
    assert mv_reads_only_wrong("Since $x = 5$, the answer is $5$.", ["5"]) is None
    assert mv_reads_only_wrong("So $1$ and $2$.", ["\\{1,2\\}"]) is None
    assert mv_reads_only_wrong("No math here at all.", ["5"]) is None
    assert mv_reads_only_wrong("So $x = 3$.", ["x = 3"]) is None  # a relation gold: left to math-verify
    r = math_compute_score("math", "Let $x$ be the count. Then $x^2 - 4 = 0$ gives $x = 2$.", "7")
    assert (r.score, r.info["path"]) == (0.0, "fast")


def _math500_responses(limit: int) -> list[tuple[str, str]]:
    """MATH-500 solutions with their last box replaced by its content (inside ``$...$`` unless already in
    math) or by another row's answer: right and wrong responses as a policy writes them without a box."""
    import json
    import os
    from pathlib import Path

    from stepcredit.reward.verifiers.math import last_boxed

    data = Path(
        os.environ.get("STEPCREDIT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")
    )
    path = data / "math500" / "test.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found (set STEPCREDIT_SHARED_DATA)")
    rows = [json.loads(line) for line in path.open()][:limit]
    out = []
    for i, row in enumerate(rows):
        sol, hit = row["solution"], last_boxed(row["solution"])
        if hit is None:
            continue
        start, content = hit
        end = sol.index(content, start) + len(content) + 1
        before = sol[:start]
        in_math = before.count("$") % 2 == 1 or before.rfind("\\[") > before.rfind("\\]")
        for answer in (content, rows[(i + 1) % len(rows)]["answer"]):
            out.append((before + (answer if in_math else f"${answer}$") + sol[end:], row["answer"]))
    return out


def test_only_wrong_readings_agree_with_math_verify_on_math500() -> None:
    """Whatever :func:`mv_reads_only_wrong` calls incorrect in a MATH-500 solution (its own answer or
    another row's, boxed or not), math-verify's slow-path reading calls incorrect too."""
    from stepcredit.reward.verifiers.math import extract_answer, math_verify_verdict

    decided = 0
    for response, gold in _math500_responses(150):
        if "\\boxed" in response or mv_reads_only_wrong(response, [gold]) is None:
            continue
        decided += 1
        pred, how = extract_answer(response)
        verdict, _ = math_verify_verdict(gold, response, pred, how)
        assert not verdict, (response[-200:], gold)
    assert decided >= 50  # exercised, not skipped over
