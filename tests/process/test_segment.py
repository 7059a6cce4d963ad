"""Segmentation on hand-written traces (character tokenizer: token index == character index)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepcredit.config import ProcessConfig
from stepcredit.models import build_tokenizer
from stepcredit.process import segment_episodes, token_char_spans

TOK = build_tokenizer()


def ends_of(text: str, **kw: Any) -> list[int]:
    ids = TOK(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    return segment_episodes(ids, TOK, ProcessConfig(**kw))


def before(text: str, marker: str, nth: int = 0) -> int:
    """Index of the last token of the episode that ends right before the nth occurrence of marker."""
    i = -1
    for _ in range(nth + 1):
        i = text.index(marker, i + 1)
    return i - 1


def test_markers_at_sentence_and_line_starts() -> None:
    t = "Let me start with 3. So 3 + 4 = 7. But 7 - 2 = 4.\nWait, 7 - 2 = 5.\nThe answer is 5."
    # episodes: "Let me start with 3. " | "So 3 + 4 = 7. " | "But 7 - 2 = 4.\n" | "Wait, ... 5." (the last
    # line is not a marker, so with lines not split it stays in the last episode); a marker at position 0
    # opens no episode.
    want = [before(t, "So"), before(t, "But"), before(t, "Wait"), len(t) - 1]
    assert ends_of(t, split_lines=False) == want
    # with lines split (the default) "The answer is 5." is an episode of its own
    assert ends_of(t) == [*want[:-1], before(t, "The answer"), len(t) - 1]


def test_every_line_is_a_step() -> None:
    # a GSM8K solution: one step per line, no discourse marker; blank lines and indentation belong to the
    # line before; a line shorter than min_episode_tokens joins the next one
    t = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n\n  #### 72"
    assert ends_of(t) == [before(t, "Natalia", 1), before(t, "####"), len(t) - 1]
    assert ends_of(t, split_lines=False) == [len(t) - 1]
    assert ends_of("ab\ncd\nThe answer is 5.") == [len("ab\ncd\n") - 1, len("ab\ncd\nThe answer is 5.") - 1]


def test_no_markers_is_one_episode() -> None:
    t = "Three plus four is seven. Seven minus two is five."
    assert ends_of(t) == [len(t) - 1]


def test_markers_inside_numbers_and_words_are_not_boundaries() -> None:
    # "3.So" (no space after the period), "also So " mid-sentence, "Butter", "Thereforex",
    # "Therefore5" and "Finally" without its comma are all ignored.
    t = "We get 3.So far so good, also So be it. Butter is 2. Thereforex 1. Therefore5 ok. Finally we stop."
    assert ends_of(t) == [len(t) - 1]
    t2 = t + " Therefore it is 6."
    assert ends_of(t2) == [before(t2, "Therefore it"), len(t2) - 1]


def test_fallback_splits_at_last_sentence_end_before_the_limit() -> None:
    s = "One two three. "  # 15 characters
    t = s * 4  # 60 characters, sentences start at 15, 30, 45
    # max 40: the first episode is cut at the last sentence start <= 40 (30), the rest (30) fits.
    assert ends_of(t, max_episode_tokens=40) == [29, 59]
    # max 20: sentence starts 15, 30, 45 -> episodes of 15 each.
    assert ends_of(t, max_episode_tokens=20) == [14, 29, 44, 59]


def test_fallback_without_any_sentence_end_cuts_at_the_limit() -> None:
    t = "x" * 50
    assert ends_of(t, max_episode_tokens=16) == [15, 31, 49]  # cuts at 16, 32, 48; the tail of 2 < 4 merges
    assert ends_of(t, max_episode_tokens=16, min_episode_tokens=2) == [15, 31, 47, 49]


def test_marker_within_the_limit_wins_over_the_fallback() -> None:
    t = "a" * 10 + ". So " + "b" * 15  # 30 tokens: "a..a. " then "So b..b" (18 <= 20)
    assert ends_of(t, max_episode_tokens=20) == [before(t, "So"), len(t) - 1]


def test_minimum_episode_length_skips_close_markers_and_merges_a_short_tail() -> None:
    t = "So a. So b. So cc. So dddddddd."
    # every "So" is a marker; with min 8 the ones 6 characters after an episode start are skipped
    assert ends_of(t, min_episode_tokens=1) == [
        before(t, "So", 1),
        before(t, "So", 2),
        before(t, "So", 3),
        len(t) - 1,
    ]
    assert ends_of(t, min_episode_tokens=8) == [before(t, "So", 2), len(t) - 1]
    t2 = "Let me think about it. So 5."
    assert ends_of(t2, min_episode_tokens=6) == [len(t2) - 1]  # "So 5." is 5 tokens: merged


def test_eos_and_empty() -> None:
    ids = TOK("Hmm, so. Wait, no.", add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
    ends = segment_episodes(ids, TOK, ProcessConfig())
    assert ends == [8, len(ids) - 1]
    assert segment_episodes([], TOK, ProcessConfig()) == []


def test_custom_markers() -> None:
    t = "Step 1: add. Step 2: subtract. Done."
    assert ends_of(t, markers=("Step ",)) == [before(t, "Step 2"), len(t) - 1]


def _byte_bpe() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    corpus = ["So the answer is 42. But wait, café costs 3€.", "Let me think. Therefore x = 7."] * 20
    core.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    return PreTrainedTokenizerFast(tokenizer_object=core)


def test_byte_level_bpe_offsets_and_boundaries() -> None:
    tok = _byte_bpe()
    t = "Let me price the café: 3€ 🙂. So the answer is 42. But wait, café costs 3€."
    ids = tok(t, add_special_tokens=False)["input_ids"]
    text, spans = token_char_spans(ids, tok)
    assert text == t
    assert all(a == b_prev for (a, _), (_, b_prev) in zip(spans[1:], spans, strict=False))  # contiguous
    assert any(a == b for a, b in spans)  # a token ending inside a multi-byte character gets no text
    assert spans[-1][1] == len(t)
    ends = segment_episodes(ids, tok, ProcessConfig(min_episode_tokens=1))
    # each episode's text ends right before a marker (the marker's leading space may belong to it)
    cuts = [spans[e][1] for e in ends]
    assert cuts[-1] == len(t)
    assert [t[c:].lstrip().split(" ")[0] for c in cuts[:-1]] == ["So", "But"]


@settings(max_examples=40, deadline=None)
@given(
    st.text(alphabet="ab .\nSoBut,W", max_size=120),
    st.integers(1, 8),
    st.integers(0, 40),
)
def test_properties(text: str, min_len: int, extra: int) -> None:
    max_len = min_len + extra
    ends = ends_of(text, min_episode_tokens=min_len, max_episode_tokens=max_len)
    if not text:
        assert ends == []
        return
    assert ends[-1] == len(text) - 1
    assert all(a < b for a, b in itertools.pairwise(ends))
    lengths = [b - a for a, b in zip([-1, *ends], ends, strict=False)]
    # every episode respects the limits, except that a merged short tail may overshoot max by < min
    assert all(n <= max_len for n in lengths[:-1])
    assert lengths[-1] < max_len + min_len
    if len(ends) > 1:
        assert all(n >= min_len for n in lengths)


@pytest.mark.parametrize(
    "marker",
    [
        "Wait,",
        "Alternatively,",
        "Actually,",
        "Hmm,",
        "Let me ",
        "I need to ",
        "So ",
        "But ",
        "Therefore",
        "First,",
        "Next,",
        "Finally,",
    ],
)
def test_every_default_marker(marker: str) -> None:
    t = "We have 4 of them.\n" + marker + " we check it again."
    assert ends_of(t) == [before(t, marker), len(t) - 1]
