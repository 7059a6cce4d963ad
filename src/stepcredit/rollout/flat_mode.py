"""Sampling through the bound engine (:func:`generate`) and the rollout mode ``flat``: ``rollout.n``
independent responses per prompt."""

from __future__ import annotations

from typing import Any

import torch

from stepcredit.rollout.engines import engine_for
from stepcredit.rollout.modes import RolloutRequest
from stepcredit.types import Batch, Sample


@torch.no_grad()
def generate(
    model: Any,
    tok: Any,
    samples: list[Sample],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    group_offset: int = 0,
    with_logprobs: bool = True,
    policy_version: int = 0,
    keep_cache: bool = False,
    logprobs_from_sampling: bool = False,
    times: dict[str, float] | None = None,
    row_seeds: list[int] | None = None,
) -> Batch:
    """Sample ``n`` responses per prompt (greedy when ``temperature == 0``) with the engine bound to
    ``model`` (:func:`stepcredit.rollout.engines.engine_for`; none bound: the model itself).

    Responses of prompt ``i`` get group id ``group_offset + i``. Runs under ``torch.no_grad`` (not
    inference mode: its tensors would break the later backward pass). ``with_logprobs=False`` skips the
    behaviour log-prob pass (``behaviour_logp_BT`` is then None). ``keep_cache``: the behaviour
    log-prob pass keeps its KV cache in ``batch.kv_cache`` (a :class:`~stepcredit.types.RolloutCache`)
    so the process stage values prefixes without running the responses through the model again.
    Generation runs on the model's device; the returned batch is on the CPU (the cache stays on the device).
    ``logprobs_from_sampling`` (``hf`` only): the behaviour log-probs are those the sampling loop computed
    from its own logits, with no pass of their own, where that is the training pass's distribution to
    float rounding (:func:`sampling_logprobs_exact`; else, or with ``keep_cache``, the pass runs).
    ``times`` (a dict) gets ``time/behaviour_logp_s``, the behaviour log-probs' own cost. An external
    engine (vLLM) also fills ``engine_logp_BT`` with its own log-probs of the sampled tokens.
    ``row_seeds`` (one int per prompt): each prompt's responses draw from a random stream of their own
    (validation's common random numbers: a row's tokens depend on its seed and the model alone); None:
    the engine's shared stream.
    """
    return engine_for(model).generate(
        model,
        tok,
        samples,
        n=n,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        group_offset=group_offset,
        with_logprobs=with_logprobs,
        policy_version=policy_version,
        keep_cache=keep_cache,
        logprobs_from_sampling=logprobs_from_sampling,
        times=times,
        **({"row_seeds": row_seeds} if row_seeds is not None else {}),
    )


def flat_rollout(model: Any, tok: Any, request: RolloutRequest) -> tuple[Batch, dict[str, float]]:
    """``rollout.n`` independent responses per prompt."""
    cfg = request.cfg
    times: dict[str, float] = {}
    batch = generate(
        model,
        tok,
        request.samples,
        n=cfg.n,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        group_offset=request.group_offset,
        policy_version=request.policy_version,
        with_logprobs=request.with_logprobs,
        keep_cache=request.keep_cache,
        logprobs_from_sampling=cfg.logprobs_from_sampling,
        times=times,
    )
    tokens = float(batch.response_mask_BT.sum())
    return batch, {
        **times,
        "rollout/responses": float(len(batch)),
        "rollout/generated_tokens": tokens,
        "rollout/response_tokens": tokens,
    }
