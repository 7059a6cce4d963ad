"""Validation: greedy answers to the validation prompts, scored by the same reward routing."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from stepcredit.config import RolloutConfig
from stepcredit.reward import Rewarder, TrainingProgress
from stepcredit.reward.run.health import status_counts
from stepcredit.rollout import RolloutRequest, ToolContext, generate
from stepcredit.rollout.tool_mode import tools_rollout
from stepcredit.trainer.metrics import waste_metrics
from stepcredit.types import Batch, RewardResult, Sample


def is_correct(r: RewardResult) -> bool:
    """A validation answer counts as correct when it was scored and got full marks."""
    return r.ok and r.score >= 1.0 - 1e-6


def generate_in_chunks(
    model: Any,
    tok: Any,
    samples: list[Sample],
    *,
    n: int = 1,
    max_new_tokens: int,
    temperature: float,
    chunk: int = 64,
    tools: ToolContext | None = None,
    row_seeds: list[int] | None = None,
) -> Iterator[tuple[int, list[Sample], Batch]]:
    """``(start, prompts, batch)`` for each run of ``chunk`` prompts, ``n`` responses each (no log-probs).

    Validation and ``stepcredit eval`` generate through this one loop: left padding depends on a
    chunk's longest prompt, so equal chunks keep their greedy answers identical. ``row_seeds`` (one per
    prompt): each prompt samples from a random stream of its own (:func:`stepcredit.rollout.generate`);
    tool rollouts draw from the shared stream (their turns interleave with tool calls)."""
    for start in range(0, len(samples), chunk):
        part = samples[start : start + chunk]
        if tools is not None:  # multi-turn answers that call tools (rollout.mode=tools)
            rollout = RolloutConfig(n=n, max_new_tokens=max_new_tokens, tools=tools.config)
            request = RolloutRequest(
                part, rollout, lambda ids: [], with_logprobs=False, tools=tools, temperature=temperature
            )
            batch, _ = tools_rollout(model, tok, request)
        else:
            batch = generate(
                model,
                tok,
                part,
                n=n,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                with_logprobs=False,
                row_seeds=None if row_seeds is None else row_seeds[start : start + chunk],
            )
        yield start, part, batch


def validate(
    model: Any,
    tok: Any,
    samples: list[Sample],
    rewarder: Rewarder,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    chunk: int = 64,
    tools: ToolContext | None = None,
    row_seeds: list[int] | None = None,
    progress: TrainingProgress | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Accuracy overall (``val/accuracy``) and per tag (``val/accuracy/{tag}``), how many rewards had
    each status (``val/status/{status}``, e.g. ``val/status/sandbox_error``), plus the answers.
    ``row_seeds``: one per prompt, its own random stream (:func:`generate_in_chunks`); ``progress``: where
    training stands (a TRL reward function's ``trainer_state``)."""
    if not samples:
        return {}, []
    texts: list[str] = []
    n_tokens: list[int] = []
    for _, _, b in generate_in_chunks(
        model,
        tok,
        samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        chunk=chunk,
        tools=tools,
        row_seeds=row_seeds,
    ):
        texts.extend(b.texts)
        n_tokens.extend(b.response_mask_BT.sum(1).tolist())
    results = rewarder.score_batch(samples, texts, progress=progress)
    by_tag: dict[str, list[bool]] = defaultdict(list)
    for s, r in zip(samples, results, strict=True):
        by_tag[s.tag].append(is_correct(r))
    n_ok = sum(sum(v) for v in by_tag.values())
    metrics = {"val/accuracy": n_ok / len(samples)}
    if len(by_tag) > 1 or next(iter(by_tag)) != "default":
        for tag, v in sorted(by_tag.items()):
            metrics[f"val/accuracy/{tag}"] = sum(v) / len(v)
    # Status counts next to accuracy: a failed backend shows as sandbox_error/timeout, not as wrong answers.
    for status, n in sorted(status_counts(results).items()):
        metrics[f"val/status/{status}"] = float(n)
    metrics["val/response_length/mean"] = sum(n_tokens) / len(n_tokens)  # tokens, as in training
    metrics.update(waste_metrics([s.data_source for s in samples], texts, prefix="val/"))
    rows = [
        {
            "prompt": s.prompt[-1]["content"],
            "response": t,
            "ground_truth": s.ground_truth,
            "score": r.score,
            "status": r.status.value,
        }
        for s, t, r in zip(samples, texts, results, strict=True)
    ]
    return metrics, rows
