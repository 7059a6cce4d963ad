"""Reward backends that fail loudly: a start-up check of every route, a circuit breaker, status counts.

A reward that cannot be computed is masked (``reward.failure_policy``), which is right for a stray
timeout and wrong for a backend that is down: bubblewrap missing, a judge that answers nothing, a reward
model that fails to load would mask every sample of their source, and the run would go on learning from
the rest. So:

* :func:`probe_routes` scores one probe per reward route the data uses before training starts (the
  sandbox judges a known-good program, the judge answers one request, the reward model scores one row)
  and raises one line naming the route if it did not give a verdict;
* :class:`CircuitBreaker` watches the share of failed rewards per source over the last few steps and
  raises one line naming the source, its status counts and its most frequent errors (``110 x
  ImportError: No module named math_verify``) when it passes ``reward.breaker``'s limit;
* :func:`status_counts` / :func:`format_counts` count statuses for logs and validation.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from typing import Any

from stepcredit.config import BreakerConfig
from stepcredit.errors import UserError
from stepcredit.reward.base import TrainingProgress
from stepcredit.reward.run.failures import ERRORS_FILE, format_top, top_failures
from stepcredit.types import RewardResult, Sample


class RewardBackendError(UserError):
    """A reward route failed its start-up check, or a source tripped the circuit breaker."""


def is_failure(r: RewardResult) -> bool:
    """A reward that is not a verdict on the response (a program that crashes *is* a verdict)."""
    return not r.ok


def clip_words(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else cut at the last space before it with "..."
    (a message cut mid-word reads as a different word, a URL cut mid-path as a different URL)."""
    if len(text) <= limit:
        return text
    head = text[: limit - 3]
    return (head.rsplit(" ", 1)[0] if " " in head else head) + "..."


def status_counts(results: Iterable[RewardResult]) -> dict[str, int]:
    """How many results have each status, e.g. ``{"ok": 60, "error": 3, "sandbox_error": 1}``."""
    return dict(Counter(r.status.value for r in results))


def format_counts(counts: dict[str, int]) -> str:
    """``ok=60 error=3`` with the most frequent first (ties by name), for one-line messages."""
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _default_probe(sample: Sample) -> tuple[Sample, str, float | None]:
    # A route without its own probe is asked about its first row, answered with the ground truth:
    # any verdict (right or wrong) shows the backend works; only "could not score" fails the check.
    gt = sample.ground_truth
    text = gt if isinstance(gt, str) else "42"
    return sample, f"The answer is \\boxed{{{text}}}.\n{text}", None


def _probe_of(rewarder: Any, sample: Sample) -> tuple[str, tuple[Sample, str, float | None]]:
    route = rewarder.route(sample)
    entry = route.entry
    if entry.factory is not None:
        # Scorers may offer a known-good probe (the sandbox: a program that must pass).
        probe = getattr(rewarder.scorer(entry), "probe", None)
        if probe is not None:
            gt, response, expected = probe()
            return entry.name, (sample.with_(ground_truth=gt), response, expected)
    return entry.name, _default_probe(sample)


def probe_routes(
    rewarder: Any, samples: Sequence[Sample], progress: TrainingProgress | None = None
) -> dict[str, RewardResult]:
    """Score one probe per reward route used by ``samples``; raise :class:`RewardBackendError` (one
    line naming the route, the row and what failed) if a route gives no verdict or fails its known-good
    probe. Call after the rewarder is built and before any training (``progress``: the training's start,
    as its first batch will be scored). Returns the probe result per route."""
    probes: dict[str, tuple[Sample, str, float | None]] = {}
    for s in samples:
        try:
            name, probe = _probe_of(rewarder, s)
        except UserError as e:
            raise RewardBackendError(
                f"reward start-up check: row {s.uid or '?'} has no reward route: {e}"
            ) from None
        probes.setdefault(name, probe)
    out: dict[str, RewardResult] = {}
    names = list(probes)
    results = rewarder.score_batch(
        [probes[n][0] for n in names], [probes[n][1] for n in names], progress=progress
    )
    for name, r in zip(names, results, strict=True):
        sample, _, expected = probes[name]
        msg = str(r.info.get("message", "") or "").splitlines()
        why = clip_words(msg[0], 500) if msg else ""
        if is_failure(r):
            raise RewardBackendError(
                f"reward start-up check: route {name!r} (row {sample.uid or '?'}) gave no verdict: "
                f"{r.status.value}{': ' + why if why else ''}; fix the backend or remove its rows"
            )
        if expected is not None and abs(r.score - expected) > 1e-6:
            raise RewardBackendError(
                f"reward start-up check: route {name!r} scored its known-good probe {r.score:g} "
                f"(expected {expected:g}): {why or r.info}"
            )
        out[name] = r
    return out


class CircuitBreaker:
    """Per-source failure share over the last ``window_steps`` steps; :meth:`update` raises one line
    naming the source and its status counts when the share passes ``max_failure_share``."""

    def __init__(self, cfg: BreakerConfig | None = None) -> None:
        self.cfg = cfg or BreakerConfig()
        self._steps: deque[dict[str, Counter[str]]] = deque(maxlen=self.cfg.window_steps)
        # the failed results of the window per step, so the stop message can name the errors
        self._failed: deque[list[RewardResult]] = deque(maxlen=self.cfg.window_steps)

    def update(
        self, results: Sequence[RewardResult], *, step: int | None = None
    ) -> dict[str, dict[str, int]]:
        """Add one step's scored results; return the window's status counts per source (or raise)."""
        per_source: dict[str, Counter[str]] = {}
        for r in results:
            per_source.setdefault(r.source or "?", Counter())[
                r.status.value if r.ok else "!" + r.status.value
            ] += 1
        self._steps.append(per_source)
        self._failed.append([r for r in results if not r.ok])
        window = self.window_counts()
        if not self.cfg.enabled:
            return window
        for source, counts in window.items():
            n = sum(counts.values())
            failed = sum(v for k, v in counts.items() if k.startswith("!"))
            if n >= self.cfg.min_samples and failed / n > self.cfg.max_failure_share:
                at = f" at step {step}" if step is not None else ""
                shown = format_counts({k.lstrip("!"): v for k, v in _merge_marks(counts).items()})
                top = format_top(
                    top_failures(r for rs in self._failed for r in rs if (r.source or "?") == source)
                )
                raise RewardBackendError(
                    f"reward source {source!r} failed {failed}/{n} rewards over the last {len(self._steps)} "
                    f"step(s){at} ({shown}): {top}; the run stops (limit: reward.breaker.max_failure_share="
                    f"{self.cfg.max_failure_share:g}; every failure is in the run directory's {ERRORS_FILE})"
                )
        return window

    def window_counts(self) -> dict[str, dict[str, int]]:
        """Status counts per source over the window (failed statuses prefixed with ``!``)."""
        total: dict[str, Counter[str]] = {}
        for step in self._steps:
            for source, c in step.items():
                total.setdefault(source, Counter()).update(c)
        return {k: dict(v) for k, v in total.items()}


def _merge_marks(counts: dict[str, int]) -> dict[str, int]:
    # "error" can be a verdict (a crashing program) or a failure (a crashing judge); show them apart.
    out: dict[str, int] = {}
    for k, v in counts.items():
        key = k.lstrip("!") + (" (failed)" if k.startswith("!") and k.lstrip("!") in counts else "")
        out[key] = out.get(key, 0) + v
    return out
