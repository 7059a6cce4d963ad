"""The multiple-choice verifier on real model outputs and on adversarial forms.

Real outputs: ``benchmarks/data/mc_outputs/mmlu_pro_sample.jsonl.gz`` (MMLU-Pro chain-of-thought outputs of
14 models, each labelled with the letter its final answer names or null; see the README there). The
verifier's verdicts agree with the labels' on at least 99 % of rows and it never credits a row whose label
is not the gold letter. The reference extractor (OpenCompass's ``first_option_postprocess`` behaviour, in
``benchmarks/mc_extract.py``) runs beside it as a check that the sample is not trivial.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stepcredit.reward.verifiers.multiple_choice import extract_choice, mc_compute_score

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"


def _bench() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("mc_extract", BENCH / "mc_extract.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_real_outputs_agree_with_labels_and_never_credit_a_wrong_letter() -> None:
    b = _bench()
    rows = b.load()
    assert len(rows) > 1500 and len({r["model"] for r in rows}) >= 10
    ours = b.score(rows, [b.ours(r) for r in rows])
    assert ours["agree"] >= 0.99, ours
    assert ours["wrong_credit"] == 0, ours
    hard = [r for r in rows if not b.MMLU_PRO_RE.search(r["response"])]
    assert len(hard) > 200 and b.score(hard, [b.ours(r) for r in hard])["agree"] >= 0.95
    ref = b.score(rows, [b.reference(r) for r in rows])
    assert ref["agree"] < ours["agree"]  # the sample separates the extractors


OPTS = ["Berlin", "Madrid", "Paris", "Rome", "Lisbon", "Vienna", "Prague", "Oslo", "Athens", "Dublin"]
LETTERS = "ABCDEFGHIJ"

# (response, the single letter its final answer names, or None: none, several, or a hedge)
ADVERSARIAL = [
    # the last answer phrase wins, also on the line of an earlier phrase
    ("Hmm, the answer should be the capital. So the answer is (C).", "C"),
    ("The answer is (A). Wait, no: the answer is (C).", "C"),
    ("the answer might be Berlin, but the correct answer is C", "C"),
    # phrases stay on their own line
    ("the correct answer is:\n\nThe answer is G.", "G"),
    ("The answer is:\n\n(C) Paris", "C"),
    ("Let me find the answer\nA: Germany", None),
    # LaTeX delimiters
    ("The answer is \\( I \\).", "I"),
    ("The answer is \\[ C \\]", "C"),
    ("The answer is $C$.", "C"),
    ("The answer is $$C$$", "C"),
    ("Final answer: $\\boxed{\\text{C}}$", "C"),
    ("The answer is \\(\\text{C}\\)", "C"),
    ("The answer is \\( \\text{B. } Madrid \\).", "B"),
    # last lines
    ("Reasoning about capitals.\n\nOption (I).", "I"),
    ("Reasoning.\n(C) Paris, because it is the capital of France.", "C"),
    ("Reasoning.\n**C**", "C"),
    ("A. Berlin is in Germany.\nB. Madrid is in Spain.", None),  # a list of options analysed
    ("Reasoning.\nA) is wrong because Berlin is German.", None),
    # common phrasings
    ("My choice is D", "D"),
    ("This value corresponds to option (E).", "E"),
    ("None match exactly; the closest options are (G).", "G"),
    ("I would choose C.", "C"),
    ("I'll go with (C).", "C"),
    ("The best option is C.", "C"),
    ("Answer: C", "C"),
    ("**Answer:** **C**", "C"),
    ("Therefore, the correct statement is C.", "C"),
    ("The capital is known as C. Paris", "C"),
    ("Among these, the most likely city is (C).", "C"),
    ("The answer is closest to (C).", "C"),
    ("The answer is (C) Paris, because the others are not French.", "C"),
    # hedges: never credited
    ("The answer is A or B.", None),
    ("The answer is either A or C.", None),
    ("The answer is either (E) Lisbon or (D) Rome.", None),
    ("The answer is (A) and (C).", None),
    ("Final answer: A/C", None),
    ("\\boxed{AC}", None),
    ("The policy targets (H) Athens and (I) Dublin.", None),
    ("The answer would be (B) if Spain were meant.", None),
    # no answer: abstain, never guess
    ("I cannot determine the answer from the options.", None),
    ("The answer is (None of the above).", None),
    ("It is closest to (B), but not a match. The answer is (None of the provided options).", None),
    ("The force is $F = ma$, which is F = 10 N.", None),
    ("I think the capital is on the Seine.", None),
    ("Final answer: G<EOS_TOKEN>", "G"),
]


@pytest.mark.parametrize(("response", "label"), ADVERSARIAL)
def test_adversarial_forms(response: str, label: str | None) -> None:
    got, how = extract_choice(response, letters=LETTERS, options=dict(zip(LETTERS, OPTS, strict=True)))
    if label is None:
        assert len(got) != 1, (got, how)
    else:
        assert got == [label], (got, how)
    for gold in LETTERS:  # no wrong letter and no hedge is ever credited
        r = mc_compute_score("mmlu_pro", response, gold, {"options": OPTS})
        assert r.score == (1.0 if gold == label else 0.0)


def test_extraction_is_linear_in_the_response() -> None:
    # a long response of near-misses: answer words without answers, letters inside words, open brackets
    unit = "the answer is about the answer; (A Berlin or the option C-3 $x$ \\( y \\) corresponds to "
    small, big = unit * 200, unit * 2000
    for text in (small, big):
        extract_choice(text + "\nThe answer is (C).", letters=LETTERS)
    # the fastest of 5 alternating runs of each size: other work on the machine only adds time, so
    # the minimum is each size's own cost, and a burst of load during one run does not decide
    t_small, t_big = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        extract_choice(small + "\nThe answer is (C).", letters=LETTERS)
        t1 = time.perf_counter()
        got, _ = extract_choice(big + "\nThe answer is (C).", letters=LETTERS)
        t_small.append(t1 - t0)
        t_big.append(time.perf_counter() - t1)
    assert got == ["C"]
    assert min(t_big) < 40 * max(min(t_small), 1e-4)  # 10x the text: far below 100x the time


def test_dict_options_in_any_order_index_from_a() -> None:
    shuffled = {"C": "Paris", "A": "Berlin", "B": "Madrid", "D": "Rome"}
    assert mc_compute_score("mc", "The answer is C", 2, {"options": shuffled}).score == 1.0
