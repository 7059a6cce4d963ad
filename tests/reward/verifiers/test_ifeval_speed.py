"""The IFEval verifier's per-call work: nothing loads or builds again once warm, loose variants that repeat
are checked once with the same verdicts, and the checkers that call langdetect are seeded.

Rows: the throughput benchmark's (``benchmarks/ifeval_speed.py``: real English chain-of-thought outputs,
1-3 instructions each, every instruction with complete kwargs), plus short responses with ``*`` and line
breaks so that the loose variants differ.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from stepcredit.reward.verifiers import ifeval

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"


def _bench() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("ifeval_speed", BENCH / "ifeval_speed.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def bench() -> Any:
    return _bench()


SHORT = [
    "*Title*\nthe river runs.\n**P.S.** done",
    "THE RIVER\n*RUNS* TO THE SEA\nEND",
    "one line only, with a comma",
    '"quoted *text*"',
    "first\n\nsecond paragraph *here*\n\nthe third\n",
    "*",
]


def _rows(bench: Any) -> list[tuple[str, dict[str, Any]]]:
    ids = sorted(bench.KWARGS)
    short = [
        (
            r,
            {
                "instruction_id_list": ids,
                "kwargs": [bench.KWARGS[i] for i in ids],
                "prompt": "Answer the question.",
            },
        )
        for r in SHORT
    ]
    return bench.rows(75) + short


def _check_every_variant(
    response: str, ids: list[str], kwargs: list[dict[str, Any]], prompt: str
) -> list[Any]:
    """The loop before the change: every loose variant with content checked, repeats included."""
    variants = [v for v in ifeval.loose_variants(response) if ifeval.has_content(v)]
    out = []
    for iid, kw in zip(ids, kwargs, strict=True):
        checker = ifeval._build(iid, kw, prompt)
        strict = ifeval.has_content(response) and bool(checker.check_following(response))
        loose = strict or any(bool(checker.check_following(v)) for v in variants[1:])
        out.append({"id": iid, "strict": strict, "loose": loose})
    return out


def test_loose_variants_checked_once_give_the_same_verdicts(bench: Any) -> None:
    rows = _rows(bench)
    assert {i for _, gt in rows for i in gt["instruction_id_list"]} == set(ifeval.checkers())
    loose_only = 0
    for response, gt in rows:
        ids, kwargs, prompt = ifeval.constraints(gt, None)
        got = ifeval.check(response, ids, kwargs, prompt)
        assert got == _check_every_variant(response, ids, kwargs, prompt), response[:80]
        loose_only += sum(v["loose"] and not v["strict"] for v in got)
    assert loose_only > 0  # some verdicts come from the loose variants


def test_nothing_loads_or_builds_per_call(bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import langdetect.detector_factory
    import nltk

    rows = _rows(bench)
    first = [bench.verdicts(ifeval, [row]) for row in rows]  # warm: checkers built, models loaded

    def loads(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("loaded during a call")

    monkeypatch.setattr(nltk.data, "load", loads)
    monkeypatch.setattr(nltk.data, "find", loads)
    monkeypatch.setattr(langdetect.detector_factory.DetectorFactory, "load_profile", loads)
    misses = ifeval._built.cache_info().misses
    assert [bench.verdicts(ifeval, [row]) for row in rows] == first
    assert ifeval._built.cache_info().misses == misses  # no checker built again


# Texts on which langdetect without a seed gives different languages from call to call (measured: "the
# casa es grande" en 36 and es 4 times in 40 calls, "die the" af 36 and en 4).
MIXED = ["the casa es grande", "die the", "THE CASA ES GRANDE", "DIE THE"]


@pytest.mark.parametrize("iid", ["change_case:english_lowercase", "change_case:english_capital"])
def test_english_case_checkers_are_seeded(iid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import langdetect
    from if_verifiable.ifeval import instructions_registry

    # the reference checker with langdetect's process-wide factory seeded 0 (as commit 205d728 set it)
    with monkeypatch.context() as m:
        m.setattr(langdetect.DetectorFactory, "seed", 0)
        want = [bool(instructions_registry.INSTRUCTION_DICT[iid](iid).check_following(t)) for t in MIXED]
    monkeypatch.setattr(langdetect.DetectorFactory, "seed", None)  # unseeded: ours must not depend on it
    for n in range(20):  # unseeded, both texts agree 20 times with the seeded verdict with chance ~1.5 %
        random.seed(n)
        got = [ifeval.check(t, [iid], [{}])[0]["strict"] for t in MIXED]
        assert got == want
