"""Split a response into episodes (reasoning steps) on its token ids.

The text is recovered from the ids once, with the character span of every token, so a boundary found
in the text maps back to a token index and nothing is re-tokenised. An episode starts at a discourse
marker ("Wait,", "So ", ...) that opens a sentence or a line, and (``split_lines``) at every new line,
the step delimiter of GSM8K, PRM800K and Math-Shepherd traces; with no marker within
``max_episode_tokens`` it is cut at the last sentence end before that limit (or at the limit itself),
and episodes shorter than ``min_episode_tokens`` are merged into their neighbour.

A multi-turn response (``rollout.mode=tools``) is split at its turns instead: an episode ends at the
last token of each tool call (just before the call's result), and the last one at the response's end,
so turns are the process channel's steps. Where the results are is what the rollout recorded when it
appended them (``observed``, from ``Batch.observation_BT``), never what the text looks like: a tool
whose output prints a convention's markup cannot add a turn. A trace given as text (``stepcredit
explain``, the probe) has no such record: :func:`trace_observed` reads its result blocks once.
"""

from __future__ import annotations

import bisect
import re
import weakref
from collections.abc import Sequence
from typing import Any

from stepcredit.config import ProcessConfig
from stepcredit.rollout.turns import turn_ends
from stepcredit.tools import PARSERS

# A sentence (or line) starts after a newline, or after . ! ? followed by white space. The white space is
# required, so "3.5" or "e.g.x" never start one: a marker glued to a number or a word is not a boundary.
_SENTENCE_BREAK = re.compile(r"(?:\n|[.!?][ \t\n])\s*")

_WINDOW = 8
"""Tokens of left context used when decoding one token (enough to settle multi-token characters)."""


_SINGLES: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


def _single_token_texts(tokenizer: Any) -> dict[int, str]:
    """The memo of this tokenizer's single-token decodes (a fresh dict if it cannot be weakly keyed)."""
    try:
        return _SINGLES.setdefault(tokenizer, {})
    except TypeError:
        return {}


def token_char_spans(response_ids: Sequence[int], tokenizer: Any) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text and each token's ``[start, end)`` character span in it.

    When the tokens decoded one by one add up to the whole decode (character and most byte-level BPE
    vocabularies), those pieces are the spans. Otherwise incremental decoding, as vLLM's detokenizer
    does: token i's text is what decoding a short window ending at i adds to the same window without
    it; a token that ends inside a multi-byte character gets an empty span and the character goes to
    the token that completes it. If even that does not add up (an unusual decoder), prefix decoding is
    used, which is exact but quadratic.
    """
    ids = [int(i) for i in response_ids]

    backend = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer: no per-call overhead

    def dec(x: list[int]) -> str:
        if backend is not None:
            return str(backend.decode(x, skip_special_tokens=False))
        return str(tokenizer.decode(x, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    full = dec(ids)
    # Fast path: when tokens decode one by one to the full text (character and byte-level BPE
    # vocabularies without split characters), the single-token texts are the spans. They are memoised
    # per tokenizer: a batched decode of a few dozen ids costs more in thread hand-offs than decoding.
    memo = _single_token_texts(tokenizer)
    pieces = []
    for i in ids:
        piece = memo.get(i)
        if piece is None:
            piece = memo[i] = dec([i])
        pieces.append(piece)
    if "".join(pieces) == full:
        return full, _spans(pieces)
    pieces = []
    for i in range(len(ids)):
        s = max(0, i - _WINDOW)
        before = dec(ids[s:i]).rstrip("\ufffd")
        after = dec(ids[s : i + 1])
        if after.endswith("\ufffd") or not after.startswith(before):
            pieces.append("")
        else:
            pieces.append(after[len(before) :])
    if "".join(pieces) != full:
        pieces, prev = [], ""
        for i in range(len(ids)):
            cur = dec(ids[: i + 1])
            common = len(prev) if cur.startswith(prev) else 0
            pieces.append(cur[common:])
            prev = cur
        full = "".join(pieces)
    return full, _spans(pieces)


def _spans(pieces: list[str]) -> list[tuple[int, int]]:
    spans, pos = [], 0
    for p in pieces:
        spans.append((pos, pos + len(p)))
        pos += len(p)
    return spans


def sentence_starts(text: str) -> list[int]:
    """Character positions where a sentence or a line starts (never 0)."""
    return [m.end() for m in _SENTENCE_BREAK.finditer(text) if 0 < m.end() < len(text)]


_LINE_BREAK = re.compile(r"\n\s*")


def line_starts(text: str) -> list[int]:
    """Character positions where a non-blank line starts after a line break (never 0; blank lines and
    indentation belong to the line before)."""
    return [m.end() for m in _LINE_BREAK.finditer(text) if 0 < m.end() < len(text)]


def marker_starts(text: str, markers: Sequence[str]) -> list[int]:
    """Sentence/line starts at which one of ``markers`` begins (as a whole word when it ends in one)."""
    out = []
    for c in sentence_starts(text):
        for m in markers:
            if not text.startswith(m, c):
                continue
            nxt = c + len(m)
            if m[-1].isalnum() and nxt < len(text) and text[nxt].isalnum():
                continue  # "Therefore" must not match "Thereforex"
            out.append(c)
            break
    return out


def trace_observed(response_ids: Sequence[int], tokenizer: Any) -> list[bool]:
    """Per token of a trace given as text (not a rollout, which records its own marks), whether it is
    inside a tool result block of a registered convention (a token across a block's edge is the
    policy's)."""
    text, spans = token_char_spans(response_ids, tokenizer)
    blocks = sorted(b for name in PARSERS.names() for b in PARSERS.get(name).observation_spans(text))
    return [any(a <= s and e <= b and s < e for a, b in blocks) for s, e in spans]


def _plan(n: int, markers: list[int], sentences: list[int], *, max_len: int, min_len: int) -> list[int]:
    """Episode end indices from the token indices where episodes may start (sorted, in [1, n))."""
    ends: list[int] = []
    s = 0
    while True:
        lo, hi = s + min_len, s + max_len
        i = bisect.bisect_left(markers, lo)
        if i < len(markers) and markers[i] <= hi and markers[i] < n:
            k = markers[i]  # the earliest marker far enough from the episode's start
        elif n - s <= max_len:
            break
        else:
            j = bisect.bisect_right(sentences, hi) - 1
            k = sentences[j] if j >= 0 and sentences[j] >= lo else hi
        ends.append(k - 1)
        s = k
    ends.append(n - 1)
    if len(ends) >= 2 and ends[-1] - ends[-2] < min_len:
        ends.pop(-2)  # a short tail joins the episode before it
    return ends


def segment_episodes(
    response_ids: Sequence[int],
    tokenizer: Any,
    cfg: ProcessConfig,
    observed: Sequence[bool] | None = None,
) -> list[int]:
    """Token indices (into ``response_ids``) of each episode's last token.

    The last episode ends at the last token of ``response_ids`` (pass the response without padding).
    An empty response has no episodes. ``observed``: per token, a tool result's as the rollout recorded
    it; a response with results is split at its turns (each call's last token), read from these marks.
    """
    n = len(response_ids)
    if n == 0:
        return []
    if observed is not None and any(observed):
        if len(observed) != n:
            raise ValueError(f"observed marks {len(observed)} tokens of a response of {n}")
        return turn_ends(observed)
    text, spans = token_char_spans(response_ids, tokenizer)
    token_ends = [e for _, e in spans]

    def token_at(c: int) -> int:
        # the token holding character c: the first whose span ends after it, moved back over the empty
        # spans just before it (the leading byte tokens of a multi-byte character such as an emoji or a
        # CJK character at a line start), so an episode never starts in the middle of a character
        k = bisect.bisect_right(token_ends, c)
        while 0 < k < n and spans[k - 1][0] == spans[k - 1][1] == c:
            k -= 1
        return k

    def to_tokens(chars: list[int]) -> list[int]:
        return sorted({k for k in (token_at(c) for c in chars) if 0 < k < n})

    starts = marker_starts(text, cfg.markers)
    if cfg.split_lines:
        starts += line_starts(text)
    return _plan(
        n,
        to_tokens(starts),
        to_tokens(sentence_starts(text)),
        max_len=cfg.max_episode_tokens,
        min_len=cfg.min_episode_tokens,
    )
