"""The reward registry, references that let a worker process find a function, and result coercion.

A reward function has VeRL's signature
``fn(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`` and returns a
:class:`~stepcredit.types.RewardResult`, a float, a dict with ``"score"`` or a tuple whose first item
is the score (:func:`to_result` turns each into a result). It is registered once under its
``data_source`` names with :func:`register_reward`; names may be shell patterns (``aime*``).
A user's own function (``reward.custom``) is loaded by its style's entry of :data:`CUSTOM_STYLES`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import importlib.util
import inspect
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from stepcredit.errors import ConfigError
from stepcredit.registry import Registry
from stepcredit.types import RewardResult, Sample, Status
from stepcredit.user_code import load_file, loaded_by_path

PerSampleFn = Callable[..., Any]
FastFn = Callable[..., "RewardResult | None"]


@dataclass(frozen=True)
class TrainingProgress:
    """Where training stood for a batch being scored: what TRL hands a reward function as
    ``trainer_state`` (its ``global_step`` and ``max_steps``), for curricula that change with the step."""

    global_step: int
    """Policy updates made before the batch was generated (validation: updates made so far)."""
    max_steps: int
    """The run's RL steps (``trainer.steps``)."""


_PROGRESS = threading.local()


@contextlib.contextmanager
def scoring_progress(progress: TrainingProgress | None) -> Iterator[None]:
    """Within this block, in this thread, :func:`current_progress` is ``progress`` (the reward agent
    sets it around a scorer's call for a batch submitted with one)."""
    before = getattr(_PROGRESS, "value", None)
    _PROGRESS.value = progress
    try:
        yield
    finally:
        _PROGRESS.value = before


def current_progress() -> TrainingProgress | None:
    """The training progress of the batch this thread scores, for a scorer keyed to the step (None
    outside training: ``score``, ``eval``). Set around a scorer's call by the reward agent, and by a Ray
    scorer actor from its job."""
    return getattr(_PROGRESS, "value", None)


@runtime_checkable
class Scorer(Protocol):
    """A whole-batch reward (reward model, judge, sandbox) built by a registered factory.

    ``score_batch`` returns one result per response, in order; it is called from a helper thread of
    the rewarder (so a slow scorer overlaps the pool's work) and must not raise for one bad sample.
    ``close`` (optional) releases models, connections and processes.
    """

    def score_batch(self, samples: list[Sample], responses: list[str]) -> list[RewardResult]: ...


ScorerFactory = Callable[[Any], Scorer]


@dataclass(frozen=True)
class FnRef:
    """How a fresh worker process finds a callable: ``module`` + attribute, or a ``.py`` file + attribute."""

    kind: str
    """``module`` or ``file``."""
    target: str
    """A dotted module name, or an absolute path to a ``.py`` file."""
    attr: str
    """The attribute (dotted for nested, e.g. ``Class.method`` is not supported: use a function or class)."""

    def __str__(self) -> str:
        return f"{self.target}:{self.attr}"


@dataclass(frozen=True)
class RewardFn:
    """One registered reward function and how the rewarder runs it."""

    name: str
    """The registry name (also the ``source`` of its results)."""
    fn: PerSampleFn | None = None
    """Per-sample function with VeRL's signature (None for a batch function)."""
    fast: FastFn | None = None
    """Optional cheap pre-check with the same signature, run inline; a None return sends the sample to ``fn``."""
    isolate: bool = True
    """Run ``fn`` in the kill-safe process pool (False: inline in the calling thread, no hard deadline)."""
    factory: ScorerFactory | None = None
    """For scorers (reward models, judges, sandboxes): ``factory(reward_config) -> Scorer``, built once
    per rewarder on first use; the scorer enforces its own timeouts and concurrency limits."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to ``fast`` and ``fn`` on every call."""
    ref: FnRef | None = None
    """Where a worker process finds ``fn`` (derived from ``fn`` when not given)."""
    post_process: Callable[[list[float]], list[float]] | None = None
    """Optional ``post_process_scores(scores_of_one_group) -> scores`` of a stateful custom scorer."""
    reruns: bool = True
    """A failed or lost call may run again (the agent's retries, and re-submission after its worker
    died); False for a function with side effects that must run at most once (a tool call): a death is
    then its result."""
    validate: Callable[[Sample], None] | None = None
    """Optional check of a row before it is scored (``validate(sample)`` raises a UserError naming the
    row, e.g. an IFEval instruction id no checker knows); run when data is loaded and when routed."""
    requires: tuple[str, ...] = ()
    """Modules it imports beyond the core install, checked once per route when the data is first routed
    (before SFT, before ``score`` writes a row): a missing one stops the run with the pip command."""


REWARDS: Registry[RewardFn] = Registry("reward function")
"""Reward functions keyed by ``data_source`` (exact names, or shell patterns such as ``aime*``)."""

CustomLoader = Callable[[Any], RewardFn]

CUSTOM_STYLES: Registry[CustomLoader] = Registry("reward.custom.style")
"""How ``reward.custom.path`` is loaded and called, keyed by ``reward.custom.style``: each entry is
``load(reward.custom) -> RewardFn`` (``verl``: VeRL's signatures, in the rewarder; ``trl``: TRL's
batch signature, :mod:`stepcredit.reward.custom`). A missing file or function is a ConfigError."""


def ref_of(fn: Callable[..., Any]) -> FnRef:
    """A reference a worker can import: the function's module, or its file when the module is not importable."""
    module = getattr(fn, "__module__", None) or ""
    qual = getattr(fn, "__qualname__", "") or getattr(fn, "__name__", "")
    if "<" in qual:
        raise ConfigError(f"reward function {fn!r} must be defined at module level to run in a worker")
    mod = sys.modules.get(module)
    spec = getattr(mod, "__spec__", None)
    if module and module != "__main__" and spec is not None and spec.origin and not loaded_by_path(module):
        return FnRef("module", module, qual)
    path = inspect.getsourcefile(fn) or ""
    if not path:
        raise ConfigError(f"cannot locate the source file of reward function {fn!r}")
    return FnRef("file", os.path.abspath(path), qual)


def load_ref(ref: FnRef) -> Any:
    """Import the object a reference names, or raise a ConfigError saying what is missing."""
    match ref.kind:
        case "file":
            obj = load_file(ref.target, what="reward function")
        case _:
            try:
                obj = importlib.import_module(ref.target)
            except ImportError as e:
                raise ConfigError(f"reward function module {ref.target!r} cannot be imported: {e}") from None
    for part in ref.attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None)))
            raise ConfigError(
                f"reward function {ref}: {ref.target} has no {part!r} "
                f"(callables there: {', '.join(names[:10]) or 'none'})"
            )
        obj = getattr(obj, part)
    return obj


def parse_spec(spec: str, *, base_dir: str | None = None) -> FnRef:
    """``file.py:fn``, ``dir/file.py`` (fn defaults to VeRL's ``compute_score``) or ``pkg.module:fn``."""
    target, _, attr = spec.rpartition(":") if ":" in spec else (spec, "", "compute_score")
    attr = attr or "compute_score"
    if not target:
        raise ConfigError(f"reward.custom.path {spec!r}: expected file.py:fn or pkg.module:fn")
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = os.path.abspath(os.path.join(base_dir or os.getcwd(), os.path.expanduser(target)))
        return FnRef("file", path, attr)
    return FnRef("module", target, attr)


def register_reward(
    name: str,
    *aliases: str,
    fast: FastFn | None = None,
    isolate: bool = True,
    override: bool = False,
    validate: Callable[[Sample], None] | None = None,
    reruns: bool = True,
    requires: tuple[str, ...] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register a per-sample reward function under ``data_source`` names (or patterns like
    ``aime*``). ``fast``: an inline pre-check with the same signature (None = undecided, run the
    function); ``isolate``: run the function in the kill-safe pool; ``validate``: a check of each row
    (raises a UserError naming it); ``reruns=False``: never run a call twice (:attr:`RewardFn.reruns`);
    ``requires``: the modules it needs beyond the core install (:attr:`RewardFn.requires`). Returns the
    function unchanged."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        entry = RewardFn(
            name=name,
            fn=fn,
            fast=fast,
            isolate=isolate,
            ref=ref_of(fn) if isolate else None,
            validate=validate,
            reruns=reruns,
            requires=tuple(requires),
        )
        REWARDS.register(name, *aliases, override=override)(entry)
        return fn

    return deco


def register_scorer(
    name: str, *aliases: str, override: bool = False, requires: tuple[str, ...] = ()
) -> Callable[[ScorerFactory], ScorerFactory]:
    """Decorator: register ``factory(reward_config) -> Scorer`` under ``data_source`` names (or a row
    style such as ``model``); ``requires`` as for :func:`register_reward`. Returns the factory unchanged."""

    def deco(factory: ScorerFactory) -> ScorerFactory:
        REWARDS.register(name, *aliases, override=override)(
            RewardFn(name=name, factory=factory, isolate=False, requires=tuple(requires))
        )
        return factory

    return deco


def resolve_source(data_source: str) -> RewardFn:
    """The registered reward function of a ``data_source``: exact name first, then the longest matching pattern."""
    if data_source in REWARDS:
        return REWARDS.get(data_source)
    patterns = [n for n in REWARDS.names() if any(c in n for c in "*?[")]
    for pat in sorted(patterns, key=len, reverse=True):
        if fnmatch.fnmatchcase(data_source, pat):
            return REWARDS.get(pat)
    return REWARDS.get(data_source)  # raises a ConfigError listing the valid names


def to_result(value: Any, *, source: str = "") -> RewardResult:
    """Turn what a reward function returned (result, float, dict with ``score``, tuple) into a result."""
    if isinstance(value, RewardResult):
        res = value
    elif isinstance(value, dict):
        if "score" not in value:
            return RewardResult.failure(
                Status.ERROR, f"reward function returned a dict without 'score' (keys: {sorted(value)})"
            )
        rest = dict(value)
        res = _from_score(rest.pop("score"), rest)
        pred = value.get("pred", value.get("extracted"))
        if pred is not None:
            res.extracted = str(pred)
    elif isinstance(value, tuple):
        if not value:
            return RewardResult.failure(Status.ERROR, "reward function returned an empty tuple")
        res = _from_score(value[0], {"rest": list(value[1:])} if len(value) > 1 else {})
    else:
        res = _from_score(value, {})
    if not res.source:
        res.source = source
    return res


def _from_score(score: Any, info: dict[str, Any]) -> RewardResult:
    if isinstance(score, bool) or hasattr(score, "item"):
        score = score.item() if hasattr(score, "item") else float(score)
    if not isinstance(score, (int, float)):
        return RewardResult.failure(
            Status.ERROR, f"reward function returned {type(score).__name__} {score!r}, expected a number"
        )
    if not math.isfinite(float(score)):
        return RewardResult.failure(Status.ERROR, f"reward function returned a non-finite score {score!r}")
    return RewardResult(score=float(score), status=Status.OK, info=_plain(info))


def _plain(info: dict[str, Any]) -> dict[str, Any]:
    # Keep what JSON and pickle carry; anything exotic becomes its repr.
    out: dict[str, Any] = {}
    for k, v in info.items():
        out[str(k)] = v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else repr(v)
    return out
