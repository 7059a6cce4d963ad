"""The IFEval verifier: agreement with the reference checkers' own test vectors (Google's
``instruction_following_eval/instructions_test.py``, short cases re-stated as data), hand-derived
verdicts on IFEval-style responses (strict and loose), the two credit rules, the row layouts, and an
unknown instruction id as an error naming the row."""

from __future__ import annotations

from typing import Any

import pytest

from stepcredit.data import ifgen
from stepcredit.data.domains import check_routes
from stepcredit.data.io import row_to_sample
from stepcredit.errors import DataError
from stepcredit.reward import build_rewarder
from stepcredit.reward.verifiers.ifeval import check, ifeval_compute_score, validate
from stepcredit.types import Status


def verdict(response: str, iid: str, **kwargs: Any) -> tuple[bool, bool]:
    v = check(response, [iid], [kwargs])[0]
    return v["strict"], v["loose"]


# (response, instruction id, kwargs, expected strict verdict): the reference's own vectors
REFERENCE = [
    ("The response is English", "language:response_language", {"language": "en"}, True),
    ("Desayunamos en McDonald's hoy", "language:response_language", {"language": "es"}, True),
    (
        "xx,x. xx,x! xx/x. x{x}x?",
        "length_constraints:number_sentences",
        {"relation": "less than", "num_sentences": 4},
        False,
    ),
    (
        "xxxx. xx,x! xxxx. x(x)x?",
        "length_constraints:number_sentences",
        {"relation": "less than", "num_sentences": 5},
        True,
    ),
    (
        "xxxx. xx,x! xx|x. x&x x?",
        "length_constraints:number_sentences",
        {"relation": "at least", "num_sentences": 4},
        True,
    ),
    (
        "xx-x. xx,x! xx}x. x,xx?",
        "length_constraints:number_sentences",
        {"relation": "at least", "num_sentences": 5},
        False,
    ),
    (
        "My [adjective] [noun] is [adjective] [noun]. I [verb] and [verb].",
        "detectable_content:number_placeholders",
        {"num_placeholders": 7},
        False,
    ),
    ("\n My answer is no.\n", "detectable_format:constrained_response", {}, True),
    ("My answer is no.   ", "detectable_format:constrained_response", {}, True),
    (
        "SECTION 1\n  [content of section 1]\n  SECTION 2\n  [content of section 2]",
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        True,
    ),
    (
        "\n  paragraph 1\n  ***\n  paragraph 2\n  ***\n  paragraph 3",
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 3},
        True,
    ),
    (
        "\n  paragraph 1\n          ***\n      paragraph 2\n          ***\n          ***",
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        False,
    ),
]


@pytest.mark.parametrize(("response", "iid", "kwargs", "expected"), REFERENCE)
def test_reference_vectors(response: str, iid: str, kwargs: dict[str, Any], expected: bool) -> None:
    assert verdict(response, iid, **kwargs)[0] is expected


LOWER = "i like to drink green tea in the morning because it helps me wake up and think clearly."

# Hand-derived: (response, instruction id, kwargs, strict, loose) with the reason in a comment.
HAND = [
    # no comma anywhere / one comma
    ("I like tea and cake.", "punctuation:no_comma", {}, True, True),
    ("I like tea, and cake.", "punctuation:no_comma", {}, False, False),
    # lowercase (and English, by langdetect): a bold title line breaks strict ("**Tea**" has capitals),
    # dropping line 1 fixes loose
    ("**Tea**\n" + LOWER, "change_case:english_lowercase", {}, False, True),
    # fewer than 5 words: 4 words; 6 words
    (
        "one two three four",
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        True,
        True,
    ),
    (
        "one two three four five six",
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        False,
        False,
    ),
    # end phrase: strict needs it last; a trailing sign-off line is dropped by loose
    (
        "Tea is good. Any other questions?",
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        True,
        True,
    ),
    (
        "Tea is good. Any other questions?\n-- bot",
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        False,
        True,
    ),
    # keywords: both present (case-insensitive); one missing
    ("Green TEA and honey.", "keywords:existence", {"keywords": ["tea", "honey"]}, True, True),
    ("Green tea.", "keywords:existence", {"keywords": ["tea", "honey"]}, False, False),
    # forbidden word appears as a whole word; "teapot" is not "tea"
    ("I drink tea.", "keywords:forbidden_words", {"forbidden_words": ["tea"]}, False, False),
    ("I own a teapot.", "keywords:forbidden_words", {"forbidden_words": ["tea"]}, True, True),
    # exactly 2 markdown bullets; 3 bullets (loose drops the last line: 2 left)
    ("* one\n* two", "detectable_format:number_bullet_lists", {"num_bullets": 2}, True, True),
    ("* one\n* two\n* three", "detectable_format:number_bullet_lists", {"num_bullets": 2}, False, True),
    # JSON: fenced JSON is accepted (the fence is stripped); prose is not
    ('```json\n{"a": 1}\n```', "detectable_format:json_format", {}, True, True),
    ("a: 1", "detectable_format:json_format", {}, False, False),
    # title in double angular brackets
    ("<<Tea Time>>\nTea is good.", "detectable_format:title", {}, True, True),
    ("Tea Time\nTea is good.", "detectable_format:title", {}, False, False),
    # wrapped in double quotes
    ('"Tea is good."', "startend:quotation", {}, True, True),
    # postscript P.S.
    (
        "Tea is good.\nP.S. so is cake.",
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        True,
        True,
    ),
    # at least 2 highlighted sections
    ("*one* and *two*", "detectable_format:number_highlighted_sections", {"num_highlights": 2}, True, True),
    # two placeholders in square brackets
    (
        "Dear [name], see you at [place].",
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        True,
        True,
    ),
    # all capitals in English
    ("TEA IS THE BEST DRINK IN THE WORLD.", "change_case:english_capital", {}, True, True),
]


@pytest.mark.parametrize(("response", "iid", "kwargs", "strict", "loose"), HAND)
def test_hand_derived_verdicts(
    response: str, iid: str, kwargs: dict[str, Any], strict: bool, loose: bool
) -> None:
    assert verdict(response, iid, **kwargs) == (strict, loose)


GT = {
    "instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase", "startend:end_checker"],
    "kwargs": [{}, {}, {"end_phrase": "bye."}],
}


def test_share_all_strict_loose() -> None:
    # strict: comma-free yes, lowercase no (title line), ends with "bye." yes -> 2/3; loose: 3/3
    resp = f"**Tea**\n{LOWER} bye."
    r = ifeval_compute_score("ifeval", resp, GT)
    assert r.status == Status.OK and r.score == pytest.approx(2 / 3)
    assert r.info["strict_share"] == r.score and r.info["loose_share"] == 1.0
    assert [v["strict"] for v in r.info["instructions"]] == [True, False, True]
    assert ifeval_compute_score("ifeval", resp, GT, mode="loose").score == 1.0
    assert ifeval_compute_score("ifeval", resp, GT, credit="all").score == 0.0
    assert ifeval_compute_score("ifeval", resp, GT, mode="loose", credit="all").score == 1.0
    # an empty answer meets nothing, and says so
    empty = ifeval_compute_score("ifeval", "<think>hmm</think>  ", GT)
    assert empty.score == 0.0 and empty.status == Status.UNPARSEABLE


def test_a_thinking_models_reply_is_checked_alone() -> None:
    """After ``</think>`` a chat template writes a blank line: the reply's first paragraph is still its
    own. A ``<think>`` that never closes leaves no reply; the reasoning must not earn the credit a reply
    would (it is lowercase, comma-free and long enough here)."""
    gt = {
        "instruction_id_list": ["length_constraints:nth_paragraph_first_word"],
        "kwargs": [{"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "summer"}],
    }
    reply = "Summer is here.\n\nThe sun is warm."
    for think in ("", "<think>plan the two paragraphs</think>\n\n"):
        r = ifeval_compute_score("ifeval", think + reply, gt)
        assert (r.status, r.score) == (Status.OK, 1.0), (think, r.info)
    words = {
        "instruction_id_list": ["length_constraints:number_words", "punctuation:no_comma"],
        "kwargs": [{"num_words": 100, "relation": "at least"}, {}],
    }
    r = ifeval_compute_score("ifeval", "<think>" + "reasoning " * 150, words)
    assert (r.status, r.score) == (Status.UNPARSEABLE, 0.0) and "unfinished" in r.info["why"]
    r = ifeval_compute_score("ifeval", "<think>ok</think>" + "reasoning " * 150, words)
    assert (r.status, r.score) == (Status.OK, 1.0)


def test_row_layouts_agree() -> None:
    resp = "i like tea. bye."
    as_json = ifeval_compute_score(
        "ifeval", resp, '{"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}'
    )
    in_extra = ifeval_compute_score(
        "ifeval", resp, "", {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{"num_words": None}]}
    )
    assert as_json.score == in_extra.score == 1.0


def test_unknown_instruction_id_names_the_row() -> None:
    with pytest.raises(DataError, match=r"rows.jsonl:4: unknown instruction id 'no:such'"):
        validate({"instruction_id_list": ["no:such"], "kwargs": [{}]}, {}, where="rows.jsonl:4")
    # at load time, through the reward route: the trainer's check_routes stops on it
    row = {
        "data_source": "ifeval",
        "prompt": "Say hi.",
        "reward_model": {"ground_truth": {"instruction_id_list": ["no:such"], "kwargs": [{}]}},
    }
    with build_rewarder() as rw, pytest.raises(DataError, match=r"train\.jsonl:9"):
        check_routes([row_to_sample(row, "train.jsonl:9")], rw.route)


def test_generated_rows_reference_solutions_meet_every_constraint() -> None:
    rows = ifgen.make_rows(60, seed=3, split="train")
    for r in rows:
        res = ifeval_compute_score("ifeval", r["extra_info"]["solution"], r["reward_model"]["ground_truth"])
        assert res.score == 1.0, (r, res.info)
    assert len({tuple(r["reward_model"]["ground_truth"]["instruction_id_list"]) for r in rows}) > 5
