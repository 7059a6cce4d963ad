"""Shared by the rollout tests: the small random policy they sample from, arithmetic prompts, and a spy
on the model's prefills."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from stepcredit.config import ArithConfig, ModelConfig, TinyModelConfig
from stepcredit.data import row_to_sample
from stepcredit.data.arith import make_rows
from stepcredit.models import load_policy
from stepcredit.rollout import left_pad, render_prompts
from stepcredit.types import Sample

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
"""A 2-layer tiny Llama with the built-in character tokenizer."""


def arith_samples(k: int, *, max_steps: int | None = None) -> list[Sample]:
    """The first ``k`` training rows of the arithmetic task (seed 0) as samples ``t:0`` .. ``t:k-1``;
    ``max_steps`` bounds the rows' steps (prompts of different lengths)."""
    cfg = ArithConfig() if max_steps is None else ArithConfig(max_steps=max_steps)
    return [row_to_sample(r, f"t:{i}") for i, r in enumerate(make_rows(cfg, k, seed=0, split="train"))]


@pytest.fixture(scope="module")
def policy() -> tuple[Any, Any]:
    """The small policy (seed 0) in eval mode, made to stop now and then (a raised eos logit): rows
    finish at different steps, leaves differ in length and some are truncated."""
    model, tok = load_policy(SMALL, seed=0)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] += 0.2
    return model.eval(), tok


@pytest.fixture
def samples() -> Callable[..., list[Sample]]:
    """:func:`arith_samples`."""
    return arith_samples


@pytest.fixture
def decode_policy() -> tuple[Any, Any]:
    """A fresh small policy (seed 1) in eval mode, for tests that change its weights or spy on it."""
    model, tok = load_policy(SMALL, seed=1)
    return model.eval(), tok


@pytest.fixture
def prompt_batch() -> Callable[[Any, int], tuple[torch.Tensor, torch.Tensor]]:
    """``prompt_batch(tok, k)``: ``k`` rendered arithmetic prompts of at most 5 steps (different
    lengths), left-padded with 0: (ids, bool mask)."""

    def make(tok: Any, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return left_pad(render_prompts(tok, arith_samples(k, max_steps=5)), 0)

    return make


@pytest.fixture
def prefill_widths(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], list[int]]:
    """``prefill_widths(model)``: a list that receives, from now on, the input width of each of the
    model's forward passes over more than one token (its prefills)."""

    def spy_on(model: Any) -> list[int]:
        widths: list[int] = []
        forward = type(model).forward

        def spy(self: Any, *args: Any, **kw: Any) -> Any:
            if kw.get("input_ids") is not None and kw["input_ids"].shape[1] > 1:
                widths.append(int(kw["input_ids"].shape[1]))
            return forward(self, *args, **kw)

        monkeypatch.setattr(type(model), "forward", spy)
        return widths

    return spy_on
