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
Throughput, alternated (``--repeats`` rounds), load recorded (``benchmarks/_harness.py``: ``"valid": false``
means the figures cannot be trusted), of four readers over all responses and over the tests' hand-written
cases (``tests/reward/test_multiple_choice.py`` and ``tests/reward/verifiers/test_mc_real_outputs.py``,
each pass ``--case-loops`` times over them):

* ``ours``: today's reader (``extract_choice``);
* ``before``: the reader as commit 0c0a670 wrote it, before it read from the end (``_mc_reader_0c0a670.py``,
  a frozen copy);
* ``old``: the reader of commit 205d728, before the accuracy rewrite, loaded from the git history
  (``_git_module.py``; left out with a note when the history is not there);
* ``reference``: the re-implementation of ``first_option_postprocess`` above.

Each prints responses/s (median of the rounds, with min and max in the JSON) and the ratios to ``old`` and
``before`` measured in the same run; compare only ratios from one run.

    python benchmarks/mc_extract.py [--json] [--limit N] [--repeats 3] [--case-loops 50] [--show N]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import re
import sys
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import Monitor, add_args, emit, spread

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "data" / "mc_outputs" / "mmlu_pro_sample.jsonl.gz"
OLD_COMMIT = "205d728"  # the reader before the accuracy rewrite (0c0a670)
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


def _file_module(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def before_reader() -> types.ModuleType:
    """The reader as commit 0c0a670 wrote it (a frozen copy beside this script)."""
    return _file_module(HERE / "_mc_reader_0c0a670.py", "mc_reader_0c0a670")


def old_reader() -> types.ModuleType:
    """The reader of commit 205d728, from the git history (RuntimeError with one line without it)."""
    from _git_module import module_at

    return module_at(OLD_COMMIT, "src/stepcredit/reward/verifiers/multiple_choice.py", "mc_reader_205d728")


def reader(extract_choice: Callable[..., tuple[list[str], str]]) -> Callable[[dict[str, Any]], str]:
    """A row's answer by ``extract_choice`` (a module's): its one letter, '' for none or several."""

    def read(row: dict[str, Any]) -> str:
        letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[: len(row["options"])]
        got, _ = extract_choice(
            row["response"], letters=letters, options=dict(zip(letters, row["options"], strict=True))
        )
        return got[0] if len(got) == 1 else ""

    return read


def ours(row: dict[str, Any]) -> str:
    from stepcredit.reward.verifiers.multiple_choice import extract_choice

    return reader(extract_choice)(row)


def test_cases() -> list[dict[str, Any]]:
    """The tests' hand-written responses as rows (``response``, ``options``); [] without the tests."""
    tests = HERE.parent / "tests" / "reward"
    out: list[dict[str, Any]] = []
    for path, cases, opts in (
        (tests / "test_multiple_choice.py", "CASES", "OPTS"),
        (tests / "verifiers" / "test_mc_real_outputs.py", "ADVERSARIAL", "OPTS"),
    ):
        if path.is_file():
            mod = _file_module(path, f"mc_cases_{path.stem}")
            out += [{"response": r, "options": getattr(mod, opts)} for r, _ in getattr(mod, cases)]
    return out


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
    p.add_argument("--case-loops", type=int, default=50, help="passes over the tests' cases per round")
    p.add_argument("--show", type=int, default=0, help="print up to N disagreements of each extractor")
    add_args(p)
    a = p.parse_args()
    rows = load(a.limit)
    from stepcredit.reward.verifiers.multiple_choice import extract_choice

    readers: dict[str, Callable[[dict[str, Any]], str]] = {
        "ours": reader(extract_choice),
        "before": reader(before_reader().extract_choice),
    }
    try:
        readers["old"] = reader(old_reader().extract_choice)
    except RuntimeError as e:
        print(f"old reader left out: {e}")
    readers["reference"] = reference
    cases = test_cases()
    sides: dict[str, Callable[[], Any]] = {k: (lambda f=f: [f(r) for r in rows]) for k, f in readers.items()}
    if cases:
        for k, f in readers.items():
            sides[f"{k} (tests' cases)"] = lambda f=f: [f(r) for _ in range(a.case_loops) for r in cases]
    mon = Monitor()
    runs = mon.alternate(sides, repeats=a.repeats)
    times = {k: [w["wall_s"] for w in mon.windows if w["side"] == k] for k in runs}
    hard = [i for i, r in enumerate(rows) if not MMLU_PRO_RE.search(r["response"])]
    res: dict[str, Any] = {
        "benchmark": "mc_extract",
        "rows": len(rows),
        "models": len({r["model"] for r in rows}),
        "test_cases": len(cases),
    }
    for k in readers:
        pr = runs[k][-1]
        res[k] = {
            "all": score(rows, pr),
            "regex_unreadable": score([rows[i] for i in hard], [pr[i] for i in hard]),
            "responses_per_s": spread([len(rows) / t for t in times[k]]),
        }
        if cases:
            res[k]["tests_responses_per_s"] = spread(
                [len(cases) * a.case_loops / t for t in times[f"{k} (tests' cases)"]]
            )
        print(
            f"{k:>9}: agree {res[k]['all']['agree']:.4f} (wrong credits {res[k]['all']['wrong_credit']}, "
            f"missed {res[k]['all']['missed_credit']}); on {len(hard)} rows MMLU-Pro's regex cannot read: "
            f"{res[k]['regex_unreadable']['agree']:.4f}; {res[k]['responses_per_s']['median']:.0f} responses/s"
            + (f", tests' cases {res[k]['tests_responses_per_s']['median']:.0f}/s" if cases else "")
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
    for key in ("responses_per_s", "tests_responses_per_s"):
        for num, den in (("ours", "reference"), ("ours", "old"), ("ours", "before"), ("before", "old")):
            if key in res[num] and key in res.get(den, {}):
                name = f"ratio_{num}_over_{den}" + ("_tests" if key.startswith("tests") else "")
                res[name] = res[num][key]["median"] / res[den][key]["median"]
                print(f"{name}: {res[name]:.2f}")
    settings = {
        "ours": {"extractor": "extract_choice"},
        "before": {"extractor": "extract_choice at 0c0a670"},
        "old": {"extractor": f"extract_choice at {OLD_COMMIT}"},
        "reference": {"extractor": "first_option"},
        "case_loops": a.case_loops,
    }
    emit(mon.finish(res, settings), a.json)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
