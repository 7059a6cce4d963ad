"""IFEval verdicts are a function of (response, row): every supported instruction scored under different
global random states (``random``, numpy) gives the same verdicts, strict and loose, and leaves those states
alone; a letter outside a-z is counted as itself; kwargs the checker library would fill at random are a
DataError naming the row, at validation and at scoring."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from stepcredit.errors import DataError
from stepcredit.reward.verifiers.ifeval import check, checkers, ifeval_compute_score, validate

# Complete kwargs for every instruction the registry knows (the test fails when one is added without them).
FULL: dict[str, dict[str, Any]] = {
    "keywords:existence": {"keywords": ["river", "stone"]},
    "keywords:frequency": {"keyword": "river", "frequency": 2, "relation": "at least"},
    "keywords:forbidden_words": {"forbidden_words": ["ocean"]},
    "keywords:letter_frequency": {"letter": "e", "let_frequency": 5, "let_relation": "at least"},
    "language:response_language": {"language": "en"},
    "length_constraints:number_sentences": {"num_sentences": 3, "relation": "less than"},
    "length_constraints:number_paragraphs": {"num_paragraphs": 2},
    "length_constraints:number_words": {"num_words": 20, "relation": "at least"},
    "length_constraints:nth_paragraph_first_word": {
        "num_paragraphs": 2,
        "nth_paragraph": 2,
        "first_word": "the",
    },
    "detectable_content:number_placeholders": {"num_placeholders": 1},
    "detectable_content:postscript": {"postscript_marker": "P.S."},
    "detectable_format:number_bullet_lists": {"num_bullets": 2},
    "detectable_format:constrained_response": {},
    "detectable_format:number_highlighted_sections": {"num_highlights": 1},
    "detectable_format:multiple_sections": {"section_spliter": "Section", "num_sections": 2},
    "detectable_format:json_format": {},
    "detectable_format:title": {},
    "combination:two_responses": {},
    "combination:repeat_prompt": {"prompt_to_repeat": "Describe the river."},
    "startend:end_checker": {"end_phrase": "Is there anything else?"},
    "change_case:capital_word_frequency": {"capital_frequency": 2, "capital_relation": "at least"},
    "change_case:english_capital": {},
    "change_case:english_lowercase": {},
    "punctuation:no_comma": {},
    "startend:quotation": {},
}

RESPONSES = [
    "Describe the river.\n<<The River>>\nSection 1\nThe river runs past the stone, *a highlighted part*.\n\n"
    "Section 2\nthe river is wide and the RIVER is OLD [place].\n* one\n* two\nP.S. Is there anything else?",
    '"the water flows; the stone stays. we watched it for hours, and the river sang."',
    "Mi casa es tu casa. ****** ¡Hola! #hashtags ! ! # done",
    "",
]


def _scores() -> list[list[dict[str, Any]]]:
    ids = sorted(FULL)
    return [check(r, ids, [FULL[i] for i in ids], prompt="Describe the river.") for r in RESPONSES]


def test_every_instruction_has_full_kwargs() -> None:
    assert set(FULL) == set(checkers())


@pytest.mark.parametrize("seeds", [(0, 1), (12345, 987)])
def test_same_verdicts_under_different_global_random_states(seeds: tuple[int, int]) -> None:
    runs = []
    for seed in seeds:
        random.seed(seed)
        np.random.seed(seed)
        before = (random.getstate(), np.random.get_state()[1].tolist())
        runs.append(_scores())
        # scoring draws nothing from the process's generators (a user's random stream is not shifted)
        assert (random.getstate(), np.random.get_state()[1].tolist()) == before
    assert runs[0] == runs[1]
    verdicts = {(v["strict"], v["loose"]) for rows in runs[0] for v in rows}
    assert verdicts >= {(True, True), (False, False)}  # the responses exercise both outcomes


@pytest.mark.parametrize(
    ("letter", "relation", "frequency", "expected"),
    [
        # "!" occurs 3 times and "#" twice in RESPONSES[2]; a random letter would give other counts
        ("!", "at least", 3, True),
        ("!", "less than", 3, False),
        ("#", "at least", 2, True),
        ("#", "at least", 3, False),
        ("H", "at least", 2, True),  # case-folded as the reference: "hola", "hashtags"
    ],
)
def test_letter_outside_a_to_z_is_counted_as_itself(
    letter: str, relation: str, frequency: int, expected: bool
) -> None:
    kw = {"letter": letter, "let_frequency": frequency, "let_relation": relation}
    for _ in range(20):  # the library's random swap would flip some of these calls
        random.seed(random.randrange(1 << 30))
        (v,) = check(RESPONSES[2], ["keywords:letter_frequency"], [kw])
        assert v["strict"] is expected


@pytest.mark.parametrize(
    ("iid", "kwargs", "says"),
    [
        ("length_constraints:number_words", {}, "lack num_words, relation"),
        ("length_constraints:number_words", {"num_words": -5, "relation": "less than"}, "out of range"),
        (
            "keywords:letter_frequency",
            {"letter": "ab", "let_frequency": 2, "let_relation": "at least"},
            "out of range",
        ),
        ("keywords:existence", {"keywords": []}, "out of range"),
        (
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 2, "nth_paragraph": 3},
            "lack first_word",
        ),
        ("detectable_content:postscript", {}, "lack postscript_marker"),
        ("language:response_language", {}, "lack language"),
    ],
)
def test_kwargs_left_to_chance_are_rejected_naming_the_row(
    iid: str, kwargs: dict[str, Any], says: str
) -> None:
    row = {"instruction_id_list": [iid], "kwargs": [kwargs]}
    with pytest.raises(DataError, match=rf"^rows\.jsonl:7: instruction '{iid}'.*{says}"):
        validate(row, {}, where="rows.jsonl:7")
    with pytest.raises(DataError, match=r"^ifeval row 3: "):
        ifeval_compute_score("ifeval", "Some answer.", row, {"index": 3})
