"""IFEval constraints against responses that meet them only trivially, and correct responses in common forms.

A response with no letter or digit says nothing: before, ".", "*", "{}", '""' or a zero-width space met
"no commas", "fewer than N words", "JSON format", "wrap in quotation marks" and the like (score 1), so a
policy could learn to answer every such prompt with a full stop. It now meets nothing, as an empty
response did already (IFEval's evaluation code fails a response whose ``strip()`` is empty).
"""

from __future__ import annotations

from typing import Any

import pytest

from stepcredit.reward.verifiers.ifeval import ifeval_compute_score
from stepcredit.types import Status


def _row(iid: str, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"instruction_id_list": [iid], "kwargs": [kwargs or {}]}


TRIVIAL = [
    (".", "punctuation:no_comma", None),
    ("*", "punctuation:no_comma", None),
    ("\u200b", "punctuation:no_comma", None),  # a zero-width space: str.strip keeps it
    ("{}", "detectable_format:json_format", None),
    ('""', "startend:quotation", None),
    (".", "length_constraints:number_words", {"num_words": 50, "relation": "less than"}),
    (".", "length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}),
    ("!", "keywords:forbidden_words", {"forbidden_words": ["apple"]}),
    ("-", "change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": "less than"}),
]


@pytest.mark.parametrize(("response", "iid", "kwargs"), TRIVIAL)
@pytest.mark.parametrize("mode", ["strict", "loose"])
def test_a_response_without_a_letter_or_digit_meets_nothing(
    response: str, iid: str, kwargs: dict[str, Any] | None, mode: str
) -> None:
    r = ifeval_compute_score("ifeval", response, _row(iid, kwargs), mode=mode)
    assert r.score == 0.0 and r.status == Status.UNPARSEABLE


@pytest.mark.parametrize(
    ("response", "iid", "kwargs"),
    [
        ("The sky is blue. Grass is green.", "punctuation:no_comma", None),
        ('{"a": 1}', "detectable_format:json_format", None),
        ('```json\n{"a": 1}\n```', "detectable_format:json_format", None),
        ('"Hello there"', "startend:quotation", None),
        ("Short answer.", "length_constraints:number_words", {"num_words": 50, "relation": "less than"}),
        ("word\u3000" * 60, "length_constraints:number_words", {"num_words": 50, "relation": "at least"}),
        ("hello world", "change_case:english_lowercase", None),
        ("7", "keywords:forbidden_words", {"forbidden_words": ["apple"]}),  # a digit is content
        ("日本", "keywords:forbidden_words", {"forbidden_words": ["apple"]}),  # so is a letter outside ASCII
    ],
)
def test_responses_with_content_are_checked_as_before(
    response: str, iid: str, kwargs: dict[str, Any] | None
) -> None:
    r = ifeval_compute_score("ifeval", response, _row(iid, kwargs))
    assert r.score == 1.0 and r.status == Status.OK


@pytest.mark.parametrize(
    ("response", "iid", "kwargs"),
    [
        ('```json\n{"a": 1\n```', "detectable_format:json_format", None),  # invalid JSON in a fence
        ('{"a": 1,}', "detectable_format:json_format", None),
        ("héllo wörld ÉCOLE", "change_case:english_lowercase", None),  # capitals outside ASCII
        ("HELLO WORLD ß THIS IS A TEST", "change_case:english_capital", None),
        ("APPLE pie", "keywords:forbidden_words", {"forbidden_words": ["apple"]}),
    ],
)
def test_constraints_broken_in_other_scripts_or_syntax_stay_broken(
    response: str, iid: str, kwargs: dict[str, Any] | None
) -> None:
    assert ifeval_compute_score("ifeval", response, _row(iid, kwargs)).score == 0.0
