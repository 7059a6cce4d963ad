"""The IFEval verifier against the reference's own verdicts (equivalence with a reference implementation).

``data/ifeval_reference.json`` holds, for every instruction id IFEval registers, crafted responses and the
strict and loose verdicts of lm-eval's unchanged copy of Google's checkers and scoring functions
(``test_instruction_following_strict`` / ``_loose``), written by ``data/make_ifeval_reference.py`` (its
docstring says how; this test needs neither lm-eval nor that script). Every verdict must agree except the
deliberate differences listed in ``DELIBERATE``, each with its reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepcredit.reward.verifiers.ifeval import check, checkers

DATA = json.loads((Path(__file__).parent / "data" / "ifeval_reference.json").read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = DATA["cases"]

# (instruction id, kwargs as sorted JSON, response) -> our (strict, loose), where we differ from the reference on purpose: a
# response (or loose variant) without a letter or digit meets nothing here (module docstring of
# ifeval.py: "." met "no commas" and "[]" met "one placeholder"); the reference fails only an empty one.
DELIBERATE = {
    ("detectable_content:number_placeholders", '{"num_placeholders": 1}', "[]"): (False, False),
    ("punctuation:no_comma", "{}", "."): (False, False),
    # strict fails (a comma); the reference's loose passes on the variant "." (the first line dropped)
    ("punctuation:no_comma", "{}", "Yes, sir\n."): (False, False),
}


def _key(c: dict[str, Any]) -> tuple[str, str, str]:
    return c["id"], json.dumps(c["kwargs"], sort_keys=True), c["response"]


def test_every_registered_instruction_is_covered() -> None:
    assert {c["id"] for c in CASES} == set(checkers())
    assert all(sum(c["id"] == i for c in CASES) >= 6 for i in checkers())


@pytest.mark.parametrize("case", CASES, ids=[f"{c['id']}-{i}" for i, c in enumerate(CASES)])
def test_verdicts_agree_with_the_reference(case: dict[str, Any]) -> None:
    v = check(case["response"], [case["id"]], [case["kwargs"]], case["prompt"])[0]
    got, ref = (v["strict"], v["loose"]), (case["strict"], case["loose"])
    if _key(case) in DELIBERATE:
        assert got == DELIBERATE[_key(case)] != ref, (got, ref)
    else:
        assert got == ref, (case, got)


def test_the_deliberate_differences_are_in_the_data() -> None:
    assert set(DELIBERATE) <= {_key(c) for c in CASES}
