"""Multiple-choice extraction: stepcredit's verifier vs a reference extractor on real model outputs, same run.

The reference is OpenCompass's ``first_option_postprocess`` as its documentation and behaviour describe it
(re-implemented here, :func:`reference_first_option`): an ordered list of patterns ("The answer is (X)",
"The correct answer is X", "the answer to the question is X", a letter standing alone between spaces or
punctuation, "1. ...", then the "cushion" patterns ``X:`` and any option letter at all); the first
pattern that matches anywhere in the text wins, and the first option letter (in A, B, C order) inside
its match is the answer.

Data: ``benchmarks/data/mc_outputs/mmlu_pro_sample.jsonl.gz`` (real MMLU-Pro chain-of-thought outputs of
several models, each with the letter its final answer names or null, see the README there). A verdict
is ``extracted == gold``; ``agree`` is the share of rows whose verdict equals the label's
(``label == gold``); ``wrong_credit`` counts rows credited although the label is not the gold letter;
``regex_unreadable`` restricts to rows MMLU-Pro's own regex ("answer is (X)") cannot read.
Throughput: both extractors over all responses, alternated (``--repeats`` rounds), load recorded
(``benchmarks/_harness.py``: ``"valid": false`` means the figures cannot be trusted).

    python benchmarks/mc_extract.py [--json] [--limit N] [--repeats 3] [--show N]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from _harness import Monitor, add_args, emit, spread

SAMPLE = Path(__file__).resolve().parent / "data" / "mc_outputs" / "mmlu_pro_sample.jsonl.gz"
MMLU_PRO_RE = re.compile(r"answer is \(?([A-J])\)?")


def reference_first_option(text: str, options: str) -> str:
    """OpenCompass's ``first_option_postprocess(text, options, cushion=True)`` (own implementation of its
    documented behaviour): '' when nothing matches."""
    o = f"[{options}]"
    patterns = [
        rf"答案是?\s*({o})",
        rf"答案选项应该是\s*({o})",
        rf"答案应该?是\s*({o})",
        rf"答案选项为?\s*({o})",
        rf"选项\s*({o})是?正确",
        rf"[Tt]he answer is:?\s+\(?({o})\)?",
        rf"[Tt]he answer is option:?\s+\(?({o})\)?",
        rf"[Tt]he correct answer is:?\s+\(?({o})\)?",
        rf"[Tt]he correct answer is option:?\s+\(?({o})\)?",
        rf"[Tt]he answer to the question is:?\s+\(?({o})\)?",
        rf"^选项\s?({o})",
        rf"^({o})\s?选?项",
        rf"(\s|^){o}[\s。，,：:\.$]",
        rf"(\s|^){o}(\s|$)",
        r"1.\s?(.*?)$",
        rf"({o}):",  # the cushion: any "X:", then any option letter at all
        rf"{o}",
    ]
    text = text.strip()
    for p in patterns:
        m = re.search(p, text, re.DOTALL)
        if m:
            hit = m.group(0)
            for c in options:
                if c in hit:
                    return c
    return ""


def load(limit: int = 0) -> list[dict[str, Any]]:
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return rows[:limit] if limit else rows


def ours(row: dict[str, Any]) -> str:
    from stepcredit.reward.verifiers.multiple_choice import extract_choice

    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[: len(row["options"])]
    got, _ = extract_choice(
        row["response"], letters=letters, options=dict(zip(letters, row["options"], strict=True))
    )
    return got[0] if len(got) == 1 else ""


def reference(row: dict[str, Any]) -> str:
    return reference_first_option(row["response"], "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[: len(row["options"])])


def score(rows: list[dict[str, Any]], preds: list[str]) -> dict[str, Any]:
    """Agreement with the labels' verdicts, wrong credits, missed credits, and letter-level agreement."""
    n = len(rows)
    agree = sum((p == r["answer"]) == (r["label"] == r["answer"]) for r, p in zip(rows, preds, strict=True))
    wrong = sum(p == r["answer"] != r["label"] for r, p in zip(rows, preds, strict=True))
    missed = sum(p != r["answer"] == r["label"] for r, p in zip(rows, preds, strict=True))
    letter = sum(p == (r["label"] or "") for r, p in zip(rows, preds, strict=True))
    return {
        "n": n,
        "agree": agree / n if n else float("nan"),
        "wrong_credit": wrong,
        "missed_credit": missed,
        "letter_agree": letter / n if n else float("nan"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--limit", type=int, default=0, help="first N rows only (0: all)")
    p.add_argument("--show", type=int, default=0, help="print up to N disagreements of each extractor")
    add_args(p)
    a = p.parse_args()
    rows = load(a.limit)
    mon = Monitor()
    runs = mon.alternate(
        {"ours": lambda: [ours(r) for r in rows], "reference": lambda: [reference(r) for r in rows]},
        repeats=a.repeats,
    )
    preds = {k: v[-1] for k, v in runs.items()}
    times = {k: [w["wall_s"] for w in mon.windows if w["side"] == k] for k in runs}
    hard = [i for i, r in enumerate(rows) if not MMLU_PRO_RE.search(r["response"])]
    res: dict[str, Any] = {
        "benchmark": "mc_extract",
        "rows": len(rows),
        "models": len({r["model"] for r in rows}),
    }
    for k, pr in preds.items():
        res[k] = {
            "all": score(rows, pr),
            "regex_unreadable": score([rows[i] for i in hard], [pr[i] for i in hard]),
            "responses_per_s": spread([len(rows) / t for t in times[k]]),
        }
        print(
            f"{k:>9}: agree {res[k]['all']['agree']:.4f} (wrong credits {res[k]['all']['wrong_credit']}, "
            f"missed {res[k]['all']['missed_credit']}); on {len(hard)} rows MMLU-Pro's regex cannot read: "
            f"{res[k]['regex_unreadable']['agree']:.4f}; {res[k]['responses_per_s']['median']:.0f} responses/s"
        )
        if a.show:
            bad = [
                (r, q)
                for r, q in zip(rows, pr, strict=True)
                if (q == r["answer"]) != (r["label"] == r["answer"])
            ]
            kinds = Counter("wrong credit" if q == r["answer"] else "missed" for r, q in bad)
            print(f"   {dict(kinds)}")
            for r, q in bad[: a.show]:
                print(
                    f"   - {r['model']} q{r['question_id']} label {r['label']} gold {r['answer']} got {q!r}: "
                    f"{r['response'][-160:]!r}"
                )
    res["ratio_ours_over_reference"] = (
        res["ours"]["responses_per_s"]["median"] / res["reference"]["responses_per_s"]["median"]
    )
    emit(
        mon.finish(
            res, {"ours": {"extractor": "extract_choice"}, "reference": {"extractor": "first_option"}}
        ),
        a.json,
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
