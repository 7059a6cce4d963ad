"""Reward failures where the user looks: the terminal, the step line, the run directory, the breaker.

A reward that raises becomes a result with status ``error`` and the exception in ``info`` (``message``:
``"ValueError: ..."``, ``traceback``: its last frames; :func:`stepcredit.reward.run.chunks.run_items`).
The failure policy then masks it, which is right for the training maths and wrong for the person who
wrote the function: without this module the exception is never shown. So:

* :func:`failure_message` / :func:`failure_kind` read one failed result (the message, and what makes two
  failures "the same error": the raising line when there is a traceback, else the message with its
  numbers blanked, so ``row 12`` and ``row 13`` count as one);
* :func:`top_failures` / :func:`format_top` count them: ``110 x ImportError: No module named math_verify``
  (the breaker's stop message, ``score``'s summary and the run's summary use these);
* :class:`FailureLog` is a training run's record: each distinct error printed once on stderr with its
  traceback and row, every failure appended to ``RUN_DIR/reward_errors.jsonl``, per-step counts, and
  (when the breaker is off) a warning per step that had failures.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from stepcredit.types import RewardResult, Sample

ERRORS_FILE = "reward_errors.jsonl"
"""The run directory's record of every failed reward (one JSON object per line)."""

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""stepcredit's own source folder: its frames (the worker loop that called the function) are not the
user's, and a traceback shown to them leaves them out."""


def user_traceback(e: BaseException, frames: int = 3) -> str:
    """The last ``frames`` frames of ``e``'s traceback that are not stepcredit's own (the reward
    function and what it called), formatted as :func:`traceback.format_exception` does; all of the last
    ``frames`` when every frame is stepcredit's (its own bug)."""
    stack = traceback.extract_tb(e.__traceback__)
    mine = [f for f in stack if not os.path.abspath(f.filename).startswith(_PACKAGE + os.sep)]
    shown = traceback.StackSummary.from_list((mine or list(stack))[-frames:])
    exc = traceback.format_exception_only(type(e), e)
    return "".join(["Traceback (most recent call last):\n", *shown.format(), *exc])


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)', re.MULTILINE)
_NUMBER = re.compile(r"\d+")


def failure_message(r: RewardResult, limit: int = 200) -> str:
    """The first line of a failed result's message (``ValueError: bad row``), or its status when it
    carries none; cut at ``limit`` characters."""
    msg = str(r.info.get("message", "") or "").strip()
    line = msg.splitlines()[0] if msg else r.status.value
    return line if len(line) <= limit else line[: limit - 3] + "..."


def failure_kind(r: RewardResult) -> tuple[str, ...]:
    """What makes two failures one error: source, status and the raising line (file and line number of
    the traceback's last frame) with the exception type, or without a traceback the message with every
    number blanked (``judge HTTP 500 on request 17`` and ``... 18`` are one error)."""
    msg = failure_message(r)
    frames = _FRAME.findall(str(r.info.get("traceback", "") or ""))
    if frames:
        path, line = frames[-1]
        return (r.source, r.status.value, msg.split(":", 1)[0], path, line)
    return (r.source, r.status.value, _NUMBER.sub("N", msg))


def top_failures(results: Iterable[RewardResult], n: int = 3) -> list[tuple[int, str]]:
    """The ``n`` most frequent errors among the failed ``results`` as (count, message), the message of
    each error's first occurrence; most frequent first (ties: first seen first)."""
    counts: Counter[tuple[str, ...]] = Counter()
    first: dict[tuple[str, ...], str] = {}
    for r in results:
        if r.ok:
            continue
        kind = failure_kind(r)
        counts[kind] += 1
        first.setdefault(kind, failure_message(r))
    return [(c, first[k]) for k, c in counts.most_common(n)]


def format_top(top: Sequence[tuple[int, str]]) -> str:
    """``110 x ImportError: No module named math_verify; 3 x timeout`` (empty for none)."""
    return "; ".join(f"{c} x {m}" for c, m in top)


def _row(sample: Sample, response: str, r: RewardResult, step: int) -> dict[str, Any]:
    return {
        "step": step,
        "source": r.source,
        "status": r.status.value,
        "message": str(r.info.get("message", "") or r.status.value),
        "traceback": str(r.info.get("traceback", "") or ""),
        "row": sample.uid,
        "data_source": sample.data_source,
        "ground_truth": sample.ground_truth if _jsonable(sample.ground_truth) else repr(sample.ground_truth),
        "prompt": sample.prompt[-1]["content"] if sample.prompt else "",
        "response": response,
    }


def _jsonable(x: Any) -> bool:
    try:
        json.dumps(x)
        return True
    except (TypeError, ValueError):
        return False


class FailureLog:
    """A training run's record of failed rewards.

    :meth:`record` takes one step's scored responses; for each failure it appends a line to
    ``run_dir/reward_errors.jsonl`` (at most ``max_records`` lines per run: a reward that fails on every
    row would otherwise write the whole run twice) and, the first time an error (:func:`failure_kind`)
    is seen, prints it on ``stream`` with the last frames of its traceback and the row. With ``warn``
    (the breaker is off, so nothing else stops or names a failing reward) every step that had failures
    prints one warning line with the count and the most frequent errors.
    """

    def __init__(
        self,
        run_dir: Path | None,
        *,
        warn: bool = False,
        stream: TextIO | None = None,
        max_records: int = 10_000,
    ) -> None:
        self.path = run_dir / ERRORS_FILE if run_dir is not None else None
        self.warn = warn
        self.stream = stream
        self.max_records = max_records
        self.written = 0
        self.seen: set[tuple[str, ...]] = set()
        self.total: Counter[tuple[str, ...]] = Counter()
        self.first: dict[tuple[str, ...], str] = {}

    def _print(self, text: str) -> None:
        print(text, file=self.stream if self.stream is not None else sys.stderr, flush=True)

    def record(
        self,
        samples: Sequence[Sample],
        responses: Sequence[str],
        results: Sequence[RewardResult],
        *,
        step: int,
    ) -> dict[str, float]:
        """Record one step's results; returns ``{"reward/failed": n, "reward/failed_frac": n / total}``."""
        failed = [(s, t, r) for s, t, r in zip(samples, responses, results, strict=True) if not r.ok]
        rows = []
        for s, t, r in failed:
            kind = failure_kind(r)
            self.total[kind] += 1
            self.first.setdefault(kind, failure_message(r))
            if kind not in self.seen:
                self.seen.add(kind)
                self._print(self._describe(s, t, r, step))
            if self.written < self.max_records:
                rows.append(json.dumps(_row(s, t, r, step), ensure_ascii=False))
                self.written += 1
        if rows and self.path is not None:
            with self.path.open("a") as f:
                f.write("\n".join(rows) + "\n")
        if failed and self.warn:
            top = format_top(top_failures([r for _, _, r in failed]))
            self._print(
                f"warning: step {step}: {len(failed)}/{len(results)} rewards failed ({top}); they are "
                f"masked and the run goes on (reward.breaker.enabled=false)"
            )
        return {
            "reward/failed": float(len(failed)),
            "reward/failed_frac": len(failed) / len(results) if results else 0.0,
        }

    def _describe(self, s: Sample, t: str, r: RewardResult, step: int) -> str:
        head = (
            f"reward {r.source or '?'!r} failed at step {step} on row {s.uid or '?'} "
            f"({r.status.value}): {failure_message(r, 500)}"
        )
        lines = [head]
        tb = str(r.info.get("traceback", "") or "").rstrip().splitlines()
        # the frames only: the header line and the exception line (already in ``head``) are left out
        lines += [f"  {x}" for x in tb if x.startswith("  ")]
        gt = s.ground_truth if isinstance(s.ground_truth, str) else repr(s.ground_truth)
        lines.append(f"  row: data_source={s.data_source!r} ground_truth={_clip(gt, 80)!r}")
        lines.append(f"  response: {_clip(t, 160)!r}")
        where = f" to {self.path.resolve()}" if self.path is not None else ""
        lines.append(f"  (printed once; every failure is counted in the step line and written{where})")
        return "\n".join(lines)

    def top(self, n: int = 3) -> list[tuple[int, str]]:
        """The run's ``n`` most frequent errors so far as (count, message)."""
        return [(c, self.first[k]) for k, c in self.total.most_common(n)]

    def summary(self) -> dict[str, Any]:
        """For ``summary.json``: the number of failed rewards and the most frequent errors."""
        return {
            "failed": sum(self.total.values()),
            "top": [{"count": c, "message": m} for c, m in self.top(5)],
            "file": ERRORS_FILE if self.written else None,
        }


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
