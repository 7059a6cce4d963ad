"""A stop rule of the sampling loop: a row ends at the token that completes a match of a regular
expression in its own generated text (a task's answer marker, ``stepcredit.data.ANSWER_ENDS``), so
nothing after it is generated.

The check runs in :func:`stepcredit.rollout.sampling.decode` after each token: the last ``WINDOW``
tokens of every active row are decoded in one ``batch_decode`` call and searched. A match first seen at
step t was completed by token t (it was not there one token earlier), so the row keeps that token and
ends; a marker longer than the window is never seen, and its row runs on to eos as it would without
the rule.
"""

from __future__ import annotations

import re
from typing import Any

import torch

WINDOW = 24
"""Tokens of a row's text searched after each step (longer than any answer marker)."""


class PatternStop:
    """``stop(rows_A, out_BT, t, done_A) -> hit_A``: which active rows (original rows ``rows_A``, those
    not ``done_A`` already) completed a match with their token ``t`` (``out_BT[:, t]``); ``ended[b]``:
    row b's length when the rule ended it (0: it did not)."""

    def __init__(self, tok: Any, pattern: str, n_rows: int) -> None:
        self.tok = tok
        self.regex = re.compile(pattern)
        self.ended = [0] * n_rows

    def __call__(
        self, rows_A: torch.Tensor, out_BT: torch.Tensor, t: int, done_A: torch.Tensor
    ) -> torch.Tensor:
        hit_A = torch.zeros(len(rows_A), dtype=torch.bool)
        rows = rows_A.tolist()
        live = [a for a, done in enumerate(done_A.tolist()) if not done]
        if not live:
            return hit_A.to(rows_A.device)
        window = out_BT[rows_A[live], max(0, t + 1 - WINDOW) : t + 1].tolist()
        for a, text in zip(live, self.tok.batch_decode(window, skip_special_tokens=True), strict=True):
            if self.regex.search(text):
                hit_A[a] = True
                self.ended[rows[a]] = t + 1
        return hit_A.to(rows_A.device)
