"""Labelled traces: solutions split into steps, each with the index of its first wrong step (or none).

This is ProcessBench's row (Zheng et al. 2024, "ProcessBench: Identifying Process Errors in
Mathematical Reasoning"): ``problem``, ``steps`` (a list of strings), ``label`` (the 0-based index of
the earliest wrong step, -1 when every step is right). ProcessBench does not carry the gold answer,
which every value estimator that continues a prefix needs. Where a row has none it is found, in this
order: the row's ``answer`` or ``ground_truth``; the registered dataset whose problem text is the row's
(:data:`stepcredit.data.prepare.DATASETS`: GSM8K's train and test splits, MATH-500, read from the shared
data directory; whitespace and Unicode forms folded), with that dataset's ``data_source``; the trace's
own final answer when the row marks it correct (ProcessBench's ``final_answer_correct``), taken only
from a ``\\boxed{}``, ``####`` or an answer phrase. A row none of these gives is refused, named. A
verl-schema row (``prompt``, ``data_source``, ``reward_model.ground_truth``) with ``steps`` and
``label`` added carries its own. A ProcessBench row's prompt is the problem with the MATH instruction
(answer in ``\\boxed{}``), scored by the ``math`` verifier unless the row or the matched dataset names
its ``data_source``. ``stepcredit probe --traces FILE`` values them.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepcredit.data.io import numbered_rows, row_to_sample
from stepcredit.data.prepare import DATASETS, MATH_INSTRUCTION, shared_data_dir
from stepcredit.errors import DataError
from stepcredit.types import Sample

__all__ = ["GoldLookup", "LabelledTrace", "NoGold", "gold_sources", "load_labelled_traces", "problem_key"]


@dataclass(frozen=True)
class LabelledTrace:
    """One solution, its steps and where it first goes wrong."""

    sample: Sample
    """The problem as a prompt row, with its gold answer."""
    steps: tuple[str, ...]
    """The solution's steps, in order (the response is them joined by the probe's separator)."""
    label: int
    """0-based index of the earliest wrong step; -1 when every step is right."""
    gold_from: str = "row"
    """Where the gold answer came from: ``row`` (the row's own), a dataset's name (its problem text
    matched), ``final_answer`` (the trace's own answer, which the row marks correct)."""

    @property
    def erroneous(self) -> bool:
        return self.label >= 0


def problem_key(text: str) -> str:
    """A problem's text as the gold lookup compares it: Unicode compatibility forms folded, white space
    collapsed, ends stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


@dataclass
class GoldLookup:
    """The gold answers of the registered datasets' problems (:data:`DATASETS`, every split) under
    ``src`` (the shared data directory when None), read on first use. A missing file is left out, and
    so is one that cannot be read (it is named in :attr:`searched`): a bad GSM8K file must not stop a
    row that MATH-500 or its own marked answer can serve."""

    src: Path | None = None
    _index: dict[str, tuple[str, str, str]] | None = field(default=None, repr=False)
    """problem_key -> (gold answer, data_source, dataset name)."""
    _read: list[str] = field(default_factory=list, repr=False)
    _unreadable: list[str] = field(default_factory=list, repr=False)

    @property
    def root(self) -> Path:
        return self.src if self.src is not None else shared_data_dir()

    @property
    def searched(self) -> str:
        """What :meth:`find` looked in, for messages."""
        self.index()
        if not self._read:
            found = f"no GSM8K or MATH-500 file under {self.root} (--data-dir)"
        else:
            found = f"{', '.join(self._read)} under {self.root} (--data-dir)"
        if self._unreadable:
            found += f" ({'; '.join(self._unreadable)})"
        return found

    def index(self) -> dict[str, tuple[str, str, str]]:
        if self._index is None:
            self._index = {}
            for name, ds in DATASETS.items():
                for split in ds.splits:
                    path = self.root / ds.directory / f"{split}.jsonl"
                    if not path.is_file():
                        continue
                    try:
                        rows = ds.rows(path, split)
                    except DataError as e:
                        self._unreadable.append(f"left out, unreadable: {e}")
                        continue
                    self._read.append(f"{name} {split}")
                    for r in rows:
                        q = (r.get("extra_info") or {}).get("question")
                        if isinstance(q, str):
                            gold = str(r["reward_model"]["ground_truth"])
                            self._index.setdefault(problem_key(q), (gold, r["data_source"], name))
        return self._index

    def find(self, problem: str) -> tuple[str, str, str] | None:
        """(gold answer, data_source, dataset name) of ``problem``; None when no dataset has it."""
        return self.index().get(problem_key(problem))


class NoGold(DataError):
    """A labelled trace whose gold answer no source gives (the row, a dataset, its own marked answer)."""


def _present(gold: Any) -> bool:
    return gold is not None and not (isinstance(gold, str) and not gold.strip())


FinalAnswer = Callable[[str], "str | None"]
"""A trace's own final answer read from its text, or None (the probe passes the math verifier's
``marked_answer``: a box, ``####`` or an answer phrase only)."""


def _sample(
    row: dict[str, Any], where: str, lookup: GoldLookup, final_answer: FinalAnswer | None
) -> tuple[Sample, str]:
    if "prompt" in row:  # a verl-schema row with steps added
        return row_to_sample(row, where), "row"
    problem = row.get("problem", row.get("question"))
    if not isinstance(problem, str) or not problem.strip():
        raise DataError(f"{where}: needs 'problem' (a ProcessBench row) or 'prompt' (a verl-schema row)")
    source = row.get("data_source")
    if source is not None and not isinstance(source, str):
        raise DataError(f"{where}: 'data_source' must be a string")
    given = [g for g in (row.get("answer"), row.get("ground_truth")) if _present(g)]
    gold, gold_from = (given[0], "row") if given else (None, "")
    if gold is None:
        known = lookup.find(problem)
        marked = row.get("final_answer_correct") is True
        own = final_answer("\n\n".join(row["steps"])) if marked and final_answer is not None else None
        if known is not None:
            gold, found_source, gold_from = known
            source = source or found_source
        elif own is not None:
            gold, gold_from = own, "final_answer"
        else:
            if row.get("final_answer_correct") is not True:
                why = "the row does not mark its final answer correct (final_answer_correct)"
            elif final_answer is None:
                why = "no reader of a trace's own final answer was given"
            else:
                why = "its final answer is not marked plainly (a box, #### or an answer phrase)"
            raise NoGold(
                f"{where}: no gold answer: the row has no 'answer' or 'ground_truth', its problem is in "
                f"none of {lookup.searched}, and {why}; add 'answer' (the values continue each prefix "
                "and score it against the gold answer), or pass --skip-no-gold"
            )
    verl = {
        "prompt": [{"role": "user", "content": f"{problem.strip()} {MATH_INSTRUCTION}"}],
        "data_source": source or "math",
        "reward_model": {"ground_truth": str(gold)},
        "extra_info": {k: row[k] for k in ("id", "generator") if k in row},
    }
    return row_to_sample(verl, where), gold_from


def _steps_and_label(row: dict[str, Any], where: str) -> tuple[tuple[str, ...], int]:
    steps = row.get("steps")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) for s in steps):
        raise DataError(f"{where}: 'steps' must be a non-empty list of strings")
    if any(not s.strip() for s in steps):
        k = next(i for i, s in enumerate(steps) if not s.strip())
        raise DataError(f"{where}: step {k} is empty (a step with no text has no prefix of its own)")
    label = row.get("label")
    if isinstance(label, bool) or not isinstance(label, int) or not -1 <= label < len(steps):
        raise DataError(
            f"{where}: 'label' must be an integer from -1 (no wrong step) to {len(steps) - 1} "
            f"(the index of the first wrong step of {len(steps)}), got {label!r}"
        )
    return tuple(steps), label


def load_labelled_traces(
    path: str | Path,
    *,
    n: int | None = None,
    src: Path | None = None,
    skip_no_gold: bool = False,
    final_answer: FinalAnswer | None = None,
) -> tuple[list[LabelledTrace], int, list[str]]:
    """The first ``n`` (all when None) labelled traces of a jsonl, json (an array or lines) or parquet
    file, how many rows the file has, and the rows left out. DataError naming the file, row and key on
    a bad row. ``src``: the raw datasets' directory a row without a gold answer is looked up in (the
    shared data directory when None). ``skip_no_gold``: a row whose gold answer no source gives is left
    out and named in the third list (``file:N``) instead of refused; ``n`` counts the traces kept.
    ``final_answer``: reads a trace's own answer, the gold of a row that marks it correct and that no
    dataset has (None: that source is not used)."""
    lookup = GoldLookup(src)
    p = Path(path)
    rows = numbered_rows(p)
    if not rows:
        raise DataError(f"{p}: the file has no rows")
    out: list[LabelledTrace] = []
    skipped: list[str] = []
    for where, row in rows:
        if n is not None and len(out) >= n:
            break
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        steps, label = _steps_and_label(row, where)
        try:
            sample, gold_from = _sample(row, where, lookup, final_answer)
        except NoGold:
            if not skip_no_gold:
                raise
            skipped.append(where)
            continue
        out.append(LabelledTrace(sample, steps, label, gold_from))
    return out, len(rows), skipped


def gold_sources(traces: list[LabelledTrace]) -> str:
    """Where the traces' gold answers came from, for the probe's first line ("200 from gsm8k")."""
    names = {"row": "the rows' own", "final_answer": "the traces' own final answers (marked correct)"}
    counts = Counter(t.gold_from for t in traces)
    return ", ".join(f"{k} from {names.get(g, g)}" for g, k in counts.most_common())
