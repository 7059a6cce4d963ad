"""Write labelled traces for ``stepcredit probe --traces`` from GSM8K's test solutions.

Each row is a verl-schema row (GSM8K's prompt, data source and gold answer) with ProcessBench's ``steps``
(the solution's lines) and ``label``. Every other solution gets one wrong step: a result changed and
carried forward (:func:`stepcredit.data.wrong_step.inject_wrong_step`), labelled with its line; the others
are left as written and labelled -1. A solution with no equation to change stays clean.

    python examples/labelled_traces.py --out gsm8k_labelled.jsonl --n 200
    stepcredit probe --model smollm2 --preset gsm8k_smollm2 --traces gsm8k_labelled.jsonl --step-sep '\\n' \\
        --estimators forced_answer_logprob --threshold 1 --json

The steps are lines, so ``--step-sep '\\n'`` rebuilds the solution as it was written.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from stepcredit.data.prepare import dataset_rows
from stepcredit.data.wrong_step import inject_wrong_step


def labelled_rows(n: int, seed: int, src: Path | None = None) -> list[dict]:
    rows, _ = dataset_rows("gsm8k", src=src)
    rng = random.Random(seed)
    out = []
    for i, row in enumerate(rows[:n]):
        text = row["extra_info"]["answer"]
        label = -1
        inj = inject_wrong_step(text, rng) if i % 2 else None
        if inj is not None:
            text = inj.text
            label = text[: inj.position].count("\n")
        lines = text.split("\n")
        # blank lines are no steps: the label counts the lines that are kept
        label = -1 if label < 0 else sum(1 for x in lines[:label] if x.strip())
        steps = [x for x in lines if x.strip()]
        out.append({**row, "steps": steps, "label": label})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=200, help="solutions, from the first of the test split")
    ap.add_argument("--seed", type=int, default=0, help="which step of a solution is made wrong")
    ap.add_argument("--data-dir", type=Path, help="the raw GSM8K directory (default: ../shared/data)")
    args = ap.parse_args()
    rows = labelled_rows(args.n, args.seed, args.data_dir)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    wrong = sum(r["label"] >= 0 for r in rows)
    print(f"wrote {args.out}: {len(rows)} traces, {wrong} with a wrong step")


if __name__ == "__main__":
    main()
