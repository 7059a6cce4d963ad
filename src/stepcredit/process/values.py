"""V(prefix) value estimators: the request and result types, the registry and its one signature.

How likely is the policy to reach the gold answer from a prefix of its own response? Estimators are
registered in :data:`VALUE_ESTIMATORS` with their capabilities (does it need the verifier? does it
generate?) as metadata, under one signature::

    estimator(ctx: ValueContext) -> list[list[float]]

(:class:`ValueContext`: the model, tokenizer, requests, settings, and the verifier, rollout cache and
tool rollout where there are any; an estimator registered with ``takes_tools`` reads ``ctx.tools``, so
that on a tool rollout its values see each call's result). They return new values and never write into
their inputs. The built-in ones live apart:

* :mod:`stepcredit.process.forced` - ``forced_answer_logprob``, the mean log-probability of the gold
  answer forced after the prefix (three execution strategies with the same numbers);
* :mod:`stepcredit.process.continuation` - ``monte_carlo`` (VinePPO) and ``greedy_continuation``
  (Math-Shepherd's hard estimate): continuations sampled from the prefix, scored by the verifier;
* :mod:`stepcredit.process.tree` - a tree rollout's node values; :mod:`stepcredit.process.group_prefix` -
  a flat group's values where its responses share a prefix; :mod:`stepcredit.process.oracle` - exact step
  values where the task can check every step.

:func:`stepcredit.process.stage.prefix_values` is the process stage that calls them at rollout time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict, Unpack

from stepcredit.config import ProcessConfig
from stepcredit.errors import ConfigError
from stepcredit.registry import Registry
from stepcredit.rollout.tool_context import ToolContext
from stepcredit.types import RolloutCache, Sample

ScoreFn = Callable[[Sequence[Sample], Sequence[str]], list[float]]
"""A batched verifier: (samples, full response texts) -> one reward per text (NaN: could not be scored).
Estimators call it once per batch with every text they need scored, so a slow reward (a sandbox, a
judge) sees one submission and runs it in parallel."""


def score_each(fn: Callable[[Sample, str], float]) -> ScoreFn:
    """A batched :data:`ScoreFn` from a per-text verifier ``fn(sample, text) -> score`` (called in order)."""

    def score(samples: Sequence[Sample], texts: Sequence[str]) -> list[float]:
        return [float(fn(s, t)) for s, t in zip(samples, texts, strict=True)]

    return score


@dataclass(frozen=True)
class PrefixRequest:
    """One response whose prefixes are to be valued."""

    sample: Sample
    prompt_ids: list[int]
    """Prompt tokens without padding."""
    response_ids: list[int]
    """Response tokens without padding (eos included when generated)."""
    prefix_lens: list[int]
    """Response tokens visible to each evaluation: 0 (V_0), then one per episode end."""
    answer: str
    """The gold answer text (``str(sample.ground_truth)``)."""
    complete: bool = False
    """The response ended by itself (eos): monte_carlo scores the whole response instead of sampling."""
    observed: list[bool] = field(default_factory=list)
    """Per response token, a tool result's, as the rollout recorded it when it appended the result
    (``Batch.observation_BT``); empty for a response without tools. Turn boundaries and a
    continuation's calls so far are read from these marks, never re-parsed from the text."""
    logp: list[float] = field(default_factory=list)
    """Per response token, its log-probability when it was sampled (the behaviour log-probs), or empty
    when not known: greedy continuations read which tokens were surely the policy's greedy choice
    (:mod:`stepcredit.process.continuation_plan`)."""


@dataclass(frozen=True)
class ValueContext:
    """Everything a value estimator may read: one object for every estimator, as
    :class:`~stepcredit.advantages.core.AdvantageInputs` is for advantage estimators, so a new capability
    is one field here and no signature changes."""

    model: Any
    """The policy (in eval mode, under ``torch.no_grad``, when the process stage calls)."""
    tokenizer: Any
    requests: Sequence[PrefixRequest]
    """The responses whose prefixes are valued."""
    cfg: ProcessConfig
    """The process settings (``process.*``)."""
    score_fn: ScoreFn | None = None
    """The batched verifier; given whenever the estimator's registry entry says ``needs_verifier``."""
    body: RolloutCache | None = None
    """The rollout's KV cache over exactly these responses (read, never modified), if it was kept."""
    tools: ToolContext | None = None
    """The responses are a tool rollout's: how its continuations run (None: no tools)."""

    @property
    def verifier(self) -> ScoreFn:
        """``score_fn``, which the caller checked against the registry entry (:meth:`ValueEstimatorSpec.__call__`)."""
        if self.score_fn is None:
            raise ConfigError(
                "config key process.value_estimator: this estimator needs a verifier (score_fn)"
            )
        return self.score_fn


ValueEstimator = Callable[[ValueContext], list[list[float]]]
"""A value estimator: ``fn(ctx) -> values``, one list per request, one value per prefix length."""


@dataclass(frozen=True)
class ValueEstimatorSpec:
    """A registered value estimator: the function and what the caller must know about it."""

    fn: ValueEstimator
    """The estimator: ``fn(ctx: ValueContext) -> list[list[float]]``."""
    name: str = ""
    """Its registry name (for errors)."""
    needs_verifier: bool = False
    """It scores text with the verifier: pass ``score_fn`` to :func:`compute_prefix_values`."""
    generates: bool = False
    """It samples continuations from the policy (costs generation, not just forward passes)."""
    terminal_is_reward: bool = False
    """V is a chance of reaching the gold answer and V after the whole (complete) response is its
    reward, so the utilities add up to R - V_0 (what ``vineppo``-style advantages need)."""
    needs_step_values: bool = False
    """It reads the data source's exact step values (``stepcredit.data.STEP_VALUES``): every process row's
    data source must have them."""
    from_outcomes: bool = False
    """In training its values come from the group's own verified outcomes once they are scored (a
    tree rollout's node values: :func:`stepcredit.process.tree.tree_values`), not from ``fn`` at
    rollout time; ``fn`` values fixed traces (probe, explain). Needs a rollout mode that
    ``shares_prefixes``."""
    from_group: bool = False
    """In training its values come from the group's own verified outcomes once they are scored, on any
    rollout: V(prefix) is the mean outcome of the group's responses that begin with that prefix token for
    token (:func:`stepcredit.process.group_prefix.group_prefix_values`); no generation, no verifier call.
    ``fn`` values fixed traces (probe, explain), which have no group."""
    success_probability: bool = False
    """Every V is a probability of success in [0, 1] on the outcome's scale (a mean verifier score, an
    exact step value), not a likelihood or a score on its own scale (a forced answer's log-probability):
    credit forms that compare V with a certain success (``blame``'s V_0 := 1) need it."""
    takes_tools: bool = False
    """It reads ``ctx.tools`` (:class:`ToolContext`), which the caller sets on a tool rollout, so that its
    value of a prefix that ends at a call sees the call's result: continuations run as tool rollouts
    (``monte_carlo``, ``greedy_continuation``), a forced answer is forced after the result."""

    def __call__(self, ctx: ValueContext) -> list[list[float]]:
        """The estimator's values; the one place that checks the verifier it needs is there."""
        if self.needs_verifier and ctx.score_fn is None:
            raise ConfigError(f"config key process.value_estimator: {self.name} needs a verifier (score_fn)")
        if not self.takes_tools and ctx.tools is not None:
            ctx = replace(ctx, tools=None)  # it values a tool rollout's text as it stands
        return self.fn(ctx)


VALUE_ESTIMATORS: Registry[ValueEstimatorSpec] = Registry("value estimator")


class Capabilities(TypedDict, total=False):
    """What :func:`register_value_estimator` takes: the :class:`ValueEstimatorSpec` fields after ``fn``
    and ``name`` (each documented there; every one False unless given)."""

    needs_verifier: bool
    generates: bool
    terminal_is_reward: bool
    from_outcomes: bool
    from_group: bool
    needs_step_values: bool
    success_probability: bool
    takes_tools: bool


def register_value_estimator(
    name: str, /, **capabilities: Unpack[Capabilities]
) -> Callable[[ValueEstimator], ValueEstimator]:
    """Decorator: add ``fn`` to :data:`VALUE_ESTIMATORS` with its capabilities (say ``needs_verifier``
    and ``generates`` even when False: they are what a caller reads first)."""

    def deco(fn: ValueEstimator) -> ValueEstimator:
        VALUE_ESTIMATORS.add(name, ValueEstimatorSpec(fn, name=name, **capabilities))
        return fn

    return deco


@contextlib.contextmanager
def evaluating(model: Any) -> Iterator[None]:
    """The policy in eval mode under ``torch.no_grad`` for the block, then back in the mode it was in."""
    import torch

    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        if was_training:
            model.train()


def estimate(ctx: ValueContext, name: str | None = None) -> list[list[float]]:
    """The values of estimator ``name`` (default: ``ctx.cfg.value_estimator``), :func:`evaluating` the
    policy: how every stage calls an estimator."""
    spec = VALUE_ESTIMATORS.get(name or ctx.cfg.value_estimator)
    with evaluating(ctx.model):
        return spec(ctx)


@dataclass
class Spent:
    """What valuing prefixes cost beyond the rollout, counted while :func:`spending` is open: the
    compute accounting an experiment compares arms by (the estimators' signature stays as it is)."""

    generated_tokens: int = 0
    """Tokens the estimator sampled from the policy (continuations: up to and including eos)."""
    verifier_calls: int = 0
    """Texts the estimator had the verifier score."""


_SPENT: ContextVar[Spent | None] = ContextVar("stepcredit_process_spent", default=None)


@contextlib.contextmanager
def spending() -> Iterator[Spent]:
    """Count what the value estimators called inside the block generate (:func:`count_generated`)."""
    spent = Spent()
    token = _SPENT.set(spent)
    try:
        yield spent
    finally:
        _SPENT.reset(token)


def count_generated(n: int) -> None:
    """An estimator sampled ``n`` tokens (counted when a :func:`spending` block is open)."""
    spent = _SPENT.get()
    if spent is not None:
        spent.generated_tokens += int(n)


def count_verified(n: int) -> None:
    """An estimator had ``n`` texts scored by the verifier (counted when a :func:`spending` block is open)."""
    spent = _SPENT.get()
    if spent is not None:
        spent.verifier_calls += int(n)
