"""TRL-style reward functions, unchanged: ``reward.custom.style=trl``.

A TRL reward function (``trl.GRPOTrainer(reward_funcs=[...])``) scores a whole batch::

    def reward(prompts, completions, completion_ids, **columns) -> list[float | None]

where ``columns`` are the dataset's other columns, one list entry per completion. Several functions
add up with weights (``reward.custom.weights``, TRL's ``reward_weights``); a ``None`` means "this
function does not apply to this sample" and is left out of the sum, as TRL's ``nansum`` does. Where
TRL would then give a sample that no function scored a silent 0, here it gets a typed ``unscored``
result that the failure policy decides about.

What each call receives, following TRL's ``GRPOTrainer._calculate_rewards``:

* ``prompts``: the sample's chat messages (``conversational``) or its last message's text (``standard``);
* ``completions``: ``[{"role": "assistant", "content": text}]`` per sample, or the text (``standard``);
* ``completion_ids=None``: stepcredit scores text, a function's token ids are not passed;
* columns: ``ground_truth``, ``data_source``, ``ability``, ``reward_model``, ``extra_info`` and each
  key of ``extra_info`` flattened (a dataset column of a verl-style row; as in TRL, not ``prompt``,
  ``completion`` or ``completion_ids``); ``reward.custom.kwargs`` are passed as they are;
* ``trainer_state``: during training (rollout batches and validation) a ``transformers.TrainerState``
  with ``global_step`` (the policy updates made before the batch was generated: TRL's count when it
  scores a batch) and ``max_steps`` (``trainer.steps``), for curricula keyed to the step; ``None``
  outside training (``stepcredit score``, ``eval``).

The functions run in this process, each on a helper thread, like in TRL: there is no kill-safe pool
for them; an ``async def`` function runs on its own event loop there. A call past
``reward.timeout_s`` is answered ``timeout`` for its samples (the thread cannot be stopped and its
late answer is dropped); one that raises, returns the wrong number of values or a value that is not a
number or None (a string, say) is an ``error`` for its samples. Each result's ``info["rewards"]``
keeps the per-function values.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stepcredit.config import RewardConfig, RewardCustomConfig
from stepcredit.errors import ConfigError
from stepcredit.reward.base import (
    CUSTOM_STYLES,
    RewardFn,
    TrainingProgress,
    current_progress,
    load_ref,
    parse_spec,
)
from stepcredit.reward.run.chunks import call_reward
from stepcredit.reward.run.failures import user_traceback
from stepcredit.types import RewardResult, Sample, Status

TrlFn = Callable[..., Sequence[Any]]

FORMATS = ("standard", "conversational")


def trl_columns(samples: Sequence[Sample]) -> dict[str, list[Any]]:
    """The dataset columns a TRL function sees for ``samples``: one list per column name."""
    keys: dict[str, None] = {}
    for s in samples:
        keys.update(dict.fromkeys(s.extra_info))
    cols: dict[str, list[Any]] = {k: [s.extra_info.get(k) for s in samples] for k in keys}
    # the verl row's own fields win over same-named keys of extra_info
    cols["ground_truth"] = [s.ground_truth for s in samples]
    cols["data_source"] = [s.data_source for s in samples]
    cols["ability"] = [s.ability for s in samples]
    cols["reward_model"] = [{"style": s.style, "ground_truth": s.ground_truth} for s in samples]
    cols["extra_info"] = [dict(s.extra_info) for s in samples]
    return cols


def _standard_inputs(samples: Sequence[Sample], responses: Sequence[str]) -> tuple[list[Any], list[Any]]:
    """TRL's ``standard`` format: the prompt's last message's text and the response, as strings."""
    return [s.prompt[-1]["content"] if s.prompt else "" for s in samples], list(responses)


def _conversational_inputs(
    samples: Sequence[Sample], responses: Sequence[str]
) -> tuple[list[Any], list[Any]]:
    """TRL's ``conversational`` format: the prompt's chat messages and the response as one assistant message."""
    prompts = [[dict(m) for m in s.prompt] for s in samples]
    return prompts, [[{"role": "assistant", "content": r}] for r in responses]


_TRL_INPUTS: dict[str, Callable[[Sequence[Sample], Sequence[str]], tuple[list[Any], list[Any]]]] = {
    "standard": _standard_inputs,
    "conversational": _conversational_inputs,
}
"""``reward.custom.trl_format`` -> how a batch is passed to a TRL reward function."""


def trl_inputs(
    samples: Sequence[Sample], responses: Sequence[str], *, fmt: str
) -> tuple[list[Any], list[Any]]:
    """``(prompts, completions)`` in TRL's ``standard`` (strings) or ``conversational`` (messages) format."""
    return _TRL_INPUTS[fmt](samples, responses)


def combine(
    per_fn: Sequence[Sequence[float | None]], weights: Sequence[float], names: Sequence[str]
) -> list[RewardResult]:
    """Per sample, ``sum_j w_j r_j`` over the functions that scored it (TRL: ``nansum`` of
    ``rewards_per_func * reward_weights``); a sample no function scored is ``unscored``."""
    n = len(per_fn[0]) if per_fn else 0
    out = []
    for i in range(n):
        vals = {name: col[i] for name, col in zip(names, per_fn, strict=True)}
        got = [(w, v) for w, v in zip(weights, vals.values(), strict=True) if v is not None]
        if not got:
            r = RewardResult.failure(Status.UNSCORED, "no TRL reward function scored this sample (all None)")
            r.info["rewards"] = vals
            out.append(r)
            continue
        out.append(RewardResult(score=float(sum(w * v for w, v in got)), info={"rewards": vals}))
    return out


@dataclass(frozen=True)
class TrlFunction:
    """One loaded TRL reward function."""

    name: str
    """``file.py:fn`` as configured (the key of ``info["rewards"]``)."""
    fn: TrlFn
    """The user's function, called as TRL calls it."""


class TrlScorer:
    """A :class:`~stepcredit.reward.base.Scorer` running TRL-style functions on whole sub-batches."""

    def __init__(self, fns: Sequence[TrlFunction], custom: RewardCustomConfig, timeout_s: float) -> None:
        self.fns = list(fns)
        self.weights = list(custom.weights) or [1.0] * len(self.fns)
        self.fmt = custom.trl_format
        self.kwargs = dict(custom.kwargs)
        self.timeout_s = timeout_s
        self._threads = cf.ThreadPoolExecutor(
            max_workers=max(2, len(self.fns)), thread_name_prefix="trl-reward"
        )

    def score_batch(self, samples: list[Sample], responses: list[str]) -> list[RewardResult]:
        if not samples:
            return []
        t0 = time.perf_counter()
        prompts, completions = trl_inputs(samples, responses, fmt=self.fmt)
        columns = {k: v for k, v in trl_columns(samples).items() if k not in _NOT_COLUMNS}
        call = {
            "prompts": prompts,
            "completions": completions,
            "completion_ids": None,  # stepcredit scores text: no token ids reach a reward function
            **columns,
            "trainer_state": trainer_state(current_progress()),
            **self.kwargs,
        }
        # an ``async def`` function (TRL runs those concurrently) runs on its own loop in its thread
        futs = [self._threads.submit(call_reward, f.fn, (), call) for f in self.fns]
        per_fn: list[list[float | None]] = []
        failed: RewardResult | None = None
        deadline = t0 + self.timeout_s
        for f, fut in zip(self.fns, futs, strict=True):
            try:
                per_fn.append(
                    _values(fut.result(timeout=max(0.0, deadline - time.perf_counter())), len(samples))
                )
            except cf.TimeoutError:
                fut.cancel()
                failed = RewardResult.failure(Status.TIMEOUT, f"{f.name} ran past {self.timeout_s:g} s")
            except Exception as e:
                failed = RewardResult.failure(
                    Status.ERROR, f"{f.name}: {type(e).__name__}: {e}", traceback=user_traceback(e)
                )
            if failed is not None:
                break
        if failed is not None:
            out = [RewardResult(failed.score, failed.status, info=dict(failed.info)) for _ in samples]
        else:
            out = combine(per_fn, self.weights, [f.name for f in self.fns])
        dt = (time.perf_counter() - t0) / len(samples)
        for r in out:
            r.latency_s = dt
        return out

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


def trainer_state(progress: TrainingProgress | None) -> Any:
    """What TRL passes as ``trainer_state`` (its ``Trainer.state``), from the batch's training progress:
    a ``transformers.TrainerState`` with the step and the run's length; None outside training."""
    if progress is None:
        return None
    from transformers import TrainerState

    return TrainerState(global_step=progress.global_step, max_steps=progress.max_steps)


_NOT_COLUMNS = frozenset({"prompt", "completion", "completion_ids", "prompts", "completions"})
"""Keys of ``extra_info`` not passed as columns: TRL leaves out the first three, the other two are
TRL's own arguments."""


def _values(value: Any, n: int) -> list[float | None]:
    """A TRL function's return value as ``n`` floats or None; raises ValueError naming what is wrong."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
        raise ValueError(f"returned {type(value).__name__}, expected a list of {n} floats or None")
    if len(value) != n:
        raise ValueError(f"returned {len(value)} values for {n} completions")
    out: list[float | None] = []
    for i, v in enumerate(value):
        if v is None:
            out.append(None)
            continue
        if isinstance(v, (str, bytes)):  # TRL's torch.tensor(...) refuses text; float("1") would not
            raise ValueError(f"returned {type(v).__name__} {v!r} at index {i}, expected a float or None")
        x = float(v.item() if hasattr(v, "item") else v)
        # TRL turns None into NaN; a NaN the function returns itself means the same
        out.append(None if math.isnan(x) else x)
        if math.isinf(x):
            raise ValueError(f"returned a non-finite reward {x!r}")
    return out


def split_specs(path: str) -> list[str]:
    """The function specs of ``reward.custom.path``: several separated by commas."""
    return [p.strip() for p in path.split(",") if p.strip()]


@CUSTOM_STYLES.register("trl")
def load_trl(custom: RewardCustomConfig) -> RewardFn:
    """The route entry of ``reward.custom.style=trl``: a scorer over the configured functions, each
    loaded now so that a missing file or name is a ConfigError naming ``reward.custom.path``."""
    fns = []
    for spec in split_specs(custom.path):
        try:
            obj = load_ref(parse_spec(spec))
        except ConfigError as e:
            raise ConfigError(f"reward.custom.path={spec}: {e}") from None
        if not callable(obj):
            raise ConfigError(f"reward.custom.path={spec}: {type(obj).__name__} is not callable")
        fns.append(TrlFunction(spec, obj))
    if custom.weights and len(custom.weights) != len(fns):
        raise ConfigError(
            f"reward.custom.weights: {len(custom.weights)} weights for {len(fns)} functions in reward.custom.path"
        )

    def factory(cfg: RewardConfig) -> TrlScorer:
        return TrlScorer(fns, custom, cfg.timeout_s)

    return RewardFn(name="custom", factory=factory, isolate=False, kwargs=dict(custom.kwargs))
