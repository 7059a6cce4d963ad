"""Length shaping of outcome scores: a term added to each real verdict's score before the domain's
masking and normalisation (:mod:`stepcredit.reward.postprocess`).

It is a reward term, as verl's DAPO reward manager adds ``overlong_reward`` to the verifier's score
before any advantage is computed: GRPO's group normalisation then sees the shaped score, so within a
group the long responses lose against the short ones even when all are right. A failed reward (status
not a verdict) is never shaped: whatever the failure policy makes of it stays what it was.

Forms are a registry (:data:`LENGTH_PENALTIES`); each is a pure function of the response lengths that
returns a penalty in [-1, 0], multiplied by ``penalty_factor``. Add one with::

    @LENGTH_PENALTIES.register("my_form")
    def my_form(length_B, *, max_len, buffer_len): ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from stepcredit.config import Config, LengthPenaltyConfig, PostprocessConfig
from stepcredit.errors import ConfigError
from stepcredit.registry import Registry

PenaltyFn = Callable[..., torch.Tensor]
LENGTH_PENALTIES: Registry[PenaltyFn] = Registry("length penalty form")
"""``fn(length_B, *, max_len, buffer_len) -> penalty_B`` in [-1, 0] (``none`` adds nothing)."""


@LENGTH_PENALTIES.register("none")
def no_penalty(length_B: torch.Tensor, *, max_len: int, buffer_len: int) -> torch.Tensor:
    """The identity form: adds 0. A domain with this form is skipped altogether (no buffer check, no
    ``reward/overlong_*`` metrics), which is why callers test for this entry itself."""
    return torch.zeros_like(length_B, dtype=torch.float32)


@LENGTH_PENALTIES.register("overlong")
def overlong_penalty(length_B: torch.Tensor, *, max_len: int, buffer_len: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13), with L_max =
    ``max_len`` and L_cache = ``buffer_len``::

        R_length(y) = 0                                   if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                    = -1                                   if L_max < |y|

    verl's ``overlong_buffer`` computes ``min(-(|y| - (L_max - L_cache)) / L_cache, 0)`` (times the
    factor), which is the same up to L_max, where its generation stops; here it is also clipped at -1.
    """
    if buffer_len < 1 or buffer_len > max_len:
        raise ValueError(f"buffer_len must be in [1, max_len={max_len}], got {buffer_len}")
    expected = max_len - buffer_len
    x = (expected - length_B.double()) / buffer_len
    return x.clamp(-1.0, 0.0).to(torch.float32)


def resolved_max_len(c: LengthPenaltyConfig, max_new_tokens: int) -> int:
    """L_max: ``c.max_len``, or the rollout's ``max_new_tokens`` when 0."""
    return c.max_len or max_new_tokens


def shape_lengths(
    score_B: torch.Tensor,
    verdict_B: torch.Tensor,
    length_B: torch.Tensor,
    *,
    domain_B: Sequence[str],
    cfg: PostprocessConfig,
    max_new_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``score_B + penalty_factor * penalty(length_B)`` on the responses whose score is a real verdict
    (``verdict_B``), each domain with its own ``postprocess`` entry. Returns the shaped scores and the
    added term per response (0 where nothing was added), or None for it when no domain shapes."""
    added_B: torch.Tensor | None = None
    out = score_B
    for d in dict.fromkeys(domain_B):
        c = cfg.for_domain(d).length_penalty
        fn = LENGTH_PENALTIES.get(c.form)
        if fn is no_penalty:
            continue
        rows = torch.tensor([x == d for x in domain_B], dtype=torch.bool) & verdict_B.bool()
        if added_B is None:
            added_B = torch.zeros_like(score_B, dtype=torch.float32)
            out = score_B.clone()
        pen = c.penalty_factor * fn(
            length_B[rows], max_len=resolved_max_len(c, max_new_tokens), buffer_len=c.buffer_len
        )
        added_B[rows] = pen
        out[rows] = out[rows] + pen.to(out.dtype)
    return out, added_B


def length_penalty_metrics(added_B: torch.Tensor, verdict_B: torch.Tensor) -> dict[str, float]:
    """``reward/overlong_penalty_mean`` (the mean added term over shaped responses) and
    ``reward/overlong_frac`` (the share of them that were penalised at all)."""
    pen = added_B[verdict_B.bool()]
    if not pen.numel():
        return {}
    return {
        "reward/overlong_penalty_mean": float(pen.mean()),
        "reward/overlong_frac": float((pen < 0).float().mean()),
    }


def check_config(cfg: Config) -> None:
    """At start-up: every domain's form is registered, and its buffer fits inside L_max."""
    entries = {
        "outcome": cfg.postprocess.outcome,
        **{f"domains.{d}": c for d, c in cfg.postprocess.domains.items()},
    }
    for name, oc in entries.items():
        c = oc.length_penalty
        key = f"postprocess.{name}.length_penalty"
        if c.form not in LENGTH_PENALTIES:
            valid = ", ".join(LENGTH_PENALTIES.names())
            raise ConfigError(f"config key {key}.form: unknown form {c.form!r} (valid: {valid})")
        if LENGTH_PENALTIES.get(c.form) is no_penalty:
            continue
        max_len = resolved_max_len(c, cfg.rollout.max_new_tokens)
        if not 1 <= c.buffer_len <= max_len:
            raise ConfigError(
                f"config key {key}.buffer_len: must be in [1, {max_len}] (L_max = "
                f"{'max_len' if c.max_len else 'rollout.max_new_tokens'} = {max_len}), got {c.buffer_len}"
            )
