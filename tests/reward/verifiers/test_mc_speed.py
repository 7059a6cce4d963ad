"""The multiple-choice reader's speed-ups change no extraction, and its time stays linear in the response.

Equivalence: today's reader reads from the end and runs its phrase patterns only over the stretches of a
response that can hold a match; the reader as commit 0c0a670 wrote it (before that change, kept frozen in
``benchmarks/_mc_reader_0c0a670.py``) scans the whole text. Both give the same ``(letters, how)`` on every
committed real output, on the tests' hand-written cases and on generated texts built from pieces of
real outputs and the forms the patterns look for, with and without the row's options, and also with the
short-text shortcut switched off (so the stretch reading runs on short texts too).

Linear time: 200 KB responses built to make a backtracking pattern or a per-box scan go quadratic (10 KB
of such input used to take seconds, 200 KB minutes) are read in well under a second each on a quiet
machine; the bound allows a loaded one.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stepcredit.reward.verifiers import multiple_choice as mc

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
LETTERS = "ABCDEFGHIJ"
OPTS = ["Berlin", "Madrid", "Paris", "Rome", "Lisbon", "Vienna", "Prague", "Oslo", "Athens", "Dublin"]


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


@pytest.fixture(scope="module")
def bench() -> Any:
    return _bench()


def _before(bench: Any) -> Any:
    """The frozen whole-text reader, reading what a place holds with today's :func:`mc.read_letters`: the
    speed-up changed where the reader looks, not how it reads a letter (later fixes to that, such as the
    hedges "A (or possibly C)" and "(A)(B)", apply to both sides), with today's answer phrases (later words
    such as "I'd say" apply to both sides too)."""
    before = bench.before_reader()
    before.read_letters = mc.read_letters
    before._PHRASE_RE = mc._PHRASE_RE
    return before


def _both(before: Any, text: str, letters: str, options: dict[str, str] | None) -> None:
    want = before.extract_choice(text, letters=letters, options=options)
    got = mc.extract_choice(text, letters=letters, options=options)
    assert got == want, (text[-300:], got, want)


@pytest.mark.parametrize("whole_below", [mc._SCAN_WHOLE_BELOW, 0])
def test_same_extractions_as_the_reader_before_the_speed_up(
    bench: Any, whole_below: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mc, "_SCAN_WHOLE_BELOW", whole_below)
    before = _before(bench)
    rows = bench.load() + bench.test_cases()
    assert len(rows) > 1700
    for r in rows:
        letters = mc.LETTERS[: len(r["options"])]
        _both(before, r["response"], letters, dict(zip(letters, r["options"], strict=True)))
        _both(before, r["response"], mc.LETTERS, None)


# the forms the phrase, weak-phrase, box and last-line readings look for, and characters that make the
# reader scan the whole text (IGNORECASE folds them to ASCII letters)
PIECES = [
    "The answer is", "answer:", "(C)", "C.", "\\boxed{B}", "\\boxed{", "}", "{", "which is (D)",
    "corresponds to option (E)", "\u017f", "\u0130", "\u212a", "\u0131", "I choose", "go  with",
    "none of them", "$B$", "\\( A \\)", "</think>", "**C**", "A or B", "\t", "matches", "is (B)",
    " (B)\n", "which is (B)", "that is C.", " is (D).\n", "leads us to (E)", "closest to \\( F \\)",
    "matches **G**", "aligns with $H$", "points to option I", "list (J)", " of (A) ;", "\n", "\n\n", " ",
]  # fmt: skip


def test_same_extractions_on_generated_texts(bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mc, "_SCAN_WHOLE_BELOW", 0)
    before = _before(bench)
    rows = bench.load()
    lines = [ln for r in rows for ln in r["response"].split("\n") if ln]
    rng = random.Random(0)
    hows: set[str] = set()
    for _ in range(3000):
        parts = []
        for _ in range(rng.randint(1, 8)):
            x = rng.choice(lines) if rng.random() < 0.5 else rng.choice(PIECES)
            if rng.random() < 0.3 and len(x) > 4:
                i = rng.randrange(len(x))
                x = x[i : i + rng.randint(1, 80)]
            parts.append(x)
        text = rng.choice(["", " ", "\n"]).join(parts)
        options = (
            dict(zip(LETTERS, rng.choice(rows)["options"], strict=False)) if rng.random() < 0.5 else None
        )
        _both(before, text, LETTERS, options)
        hows.add(mc.extract_choice(text, letters=LETTERS, options=options)[1])
    assert hows >= {"phrase", "weak_phrase", "boxed", "last_line", "none"}  # every reading was exercised


N = 200_000


def _long(unit: str) -> str:
    """``unit`` repeated to at least N characters."""
    return unit * (N // len(unit) + 1)


# kind -> (a response of at least 200 KB, what it names: its one letter, or None for none or several)
ADVERSARIAL_200KB: dict[str, tuple[str, str | None]] = {
    # many unclosed boxes: each used to scan to the end of the text
    "unclosed boxes": (_long("\\boxed{") + "\nThe answer is (C).", "C"),
    # a letter, a long run of spaces and a lower-case word in a box: "\s*[,/&]?\s*" split the run every way
    "letter and spaces in a box": ("\\boxed{A" + _long(" ") + "x}\nThe answer is (C).", "C"),
    "nested braces": ("\\boxed{" + _long("{") + "}\nThe answer is (C).", "C"),
    # answer words without answers, everywhere: every stretch is read
    "answer words": (_long("the answer, the option. I choose: "), None),
    "answer phrases ending lines": (_long("The answer is:\n\n"), None),
    "answer phrase and spaces": ("The answer is " + _long(" ") + "x", None),
    # weak phrases on one long line
    "weak phrases": (_long("which is the point that is "), None),
    "weak phrases, then an answer": (_long("which is the point that is ") + "so it corresponds to (C)", "C"),
    "weak phrases with brackets": (_long("which is (B) and ") + "so it is (C)", "C"),
    "long last line": ("(C) " + _long("Paris "), "C"),
    "cited options": (_long(" C. Paris"), "C"),
}


@pytest.mark.parametrize("kind", list(ADVERSARIAL_200KB))
def test_200kb_adversarial_responses_are_read_fast(kind: str) -> None:
    text, want = ADVERSARIAL_200KB[kind]
    assert len(text) >= N
    t0 = time.perf_counter()
    got, _ = mc.extract_choice(text, letters=LETTERS, options=dict(zip(LETTERS, OPTS, strict=True)))
    dt = time.perf_counter() - t0
    assert got == ([want] if want else [])
    assert dt < 5.0, f"{kind}: {dt:.2f} s for {len(text)} characters"
