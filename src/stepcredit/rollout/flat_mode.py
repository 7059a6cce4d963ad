"""Sampling through the bound engine (:func:`generate`) and the rollout mode ``flat``: ``rollout.n``
independent responses per prompt."""

from __future__ import annotations

import dataclasses
from typing import Any

from stepcredit.rollout.batching import generate_batch
from stepcredit.rollout.engines import GenerationSpec, engine_for
from stepcredit.rollout.modes import RolloutRequest
from stepcredit.types import Batch, Sample


def generate(
    model: Any,
    tok: Any,
    samples: list[Sample],
    spec: GenerationSpec | None = None,
    *,
    times: dict[str, float] | None = None,
    **fields: Any,
) -> Batch:
    """Sample ``spec.n`` responses per prompt (greedy when ``spec.temperature == 0``) with the engine bound
    to ``model`` (:func:`stepcredit.rollout.engines.engine_for`; none bound: the model itself), as
    :func:`~stepcredit.rollout.batching.generate_batch` describes. ``spec``: a
    :class:`~stepcredit.rollout.engines.GenerationSpec`, or its fields as keywords
    (``generate(model, tok, samples, n=4, max_new_tokens=32)``). Generation runs on the model's device;
    the returned batch is on the CPU (its cache stays on the device)."""
    if fields.get("row_seeds", ()) is None:  # None: the engine's shared stream, as ()
        del fields["row_seeds"]
    if spec is None:
        spec = GenerationSpec(**fields)
    elif fields:
        spec = dataclasses.replace(spec, **fields)
    return generate_batch(engine_for(model), model, tok, samples, spec, times=times)


def flat_rollout(model: Any, tok: Any, request: RolloutRequest) -> tuple[Batch, dict[str, float]]:
    """``rollout.n`` independent responses per prompt."""
    times: dict[str, float] = {}
    batch = generate(model, tok, request.samples, request.generation(), times=times)
    tokens = float(batch.response_mask_BT.sum())
    return batch, {
        **times,
        "rollout/responses": float(len(batch)),
        "rollout/generated_tokens": tokens,
        "rollout/response_tokens": tokens,
    }
