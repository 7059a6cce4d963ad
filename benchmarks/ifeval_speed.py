"""IFEval verifier throughput: today's ``ifeval.py`` beside the one of commit 205d728, same run, same rows.

Rows: each real English chain-of-thought output of ``benchmarks/data/mc_outputs/mmlu_pro_sample.jsonl.gz``
(MMLU-Pro answers of 14 models) is scored against one, two or three of IFEval's instructions, taken in turn
from :data:`KWARGS` (every instruction the checker registry knows, with complete kwargs), so every checker,
langdetect and NLTK's tokenizers all run. Both verifiers score every row through
``ifeval_compute_score`` (strict and loose verdicts of each instruction), alternated (``--repeats``
rounds), after one untimed warm-up pass of each (the checker registry, NLTK's Punkt model and
langdetect's profiles load once per process), with the machine's load recorded
(``benchmarks/_harness.py``: ``"valid": false`` means the figures cannot be trusted).

* ``ours``: today's verifier;
* ``old``: the verifier of commit 205d728, loaded from the git history (``_git_module.py``).

It prints responses/s of each (median of the rounds) and their ratio measured in this run, and how many
rows' verdicts differ between the two (expected 0 on these rows: their kwargs are complete and the letter
counted is in a-z, where the two agree by design).

    python benchmarks/ifeval_speed.py [--json] [--limit N] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

from _harness import Monitor, add_args, emit, spread

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "data" / "mc_outputs" / "mmlu_pro_sample.jsonl.gz"
OLD_COMMIT = "205d728"

# Complete kwargs for every IFEval instruction (nothing left for the checker library to draw at random).
KWARGS: dict[str, dict[str, Any]] = {
    "keywords:existence": {"keywords": ["energy", "force"]},
    "keywords:frequency": {"keyword": "the", "frequency": 3, "relation": "at least"},
    "keywords:forbidden_words": {"forbidden_words": ["maybe", "guess"]},
    "keywords:letter_frequency": {"letter": "e", "let_frequency": 20, "let_relation": "at least"},
    "language:response_language": {"language": "en"},
    "length_constraints:number_sentences": {"num_sentences": 8, "relation": "less than"},
    "length_constraints:number_paragraphs": {"num_paragraphs": 3},
    "length_constraints:number_words": {"num_words": 100, "relation": "at least"},
    "length_constraints:nth_paragraph_first_word": {
        "num_paragraphs": 2,
        "nth_paragraph": 2,
        "first_word": "the",
    },
    "detectable_content:number_placeholders": {"num_placeholders": 1},
    "detectable_content:postscript": {"postscript_marker": "P.S."},
    "detectable_format:number_bullet_lists": {"num_bullets": 3},
    "detectable_format:constrained_response": {},
    "detectable_format:number_highlighted_sections": {"num_highlights": 2},
    "detectable_format:multiple_sections": {"section_spliter": "Step", "num_sections": 2},
    "detectable_format:json_format": {},
    "detectable_format:title": {},
    "combination:two_responses": {},
    "combination:repeat_prompt": {"prompt_to_repeat": "Answer the question."},
    "startend:end_checker": {"end_phrase": "The answer is (A)."},
    "change_case:capital_word_frequency": {"capital_frequency": 2, "capital_relation": "at least"},
    "change_case:english_capital": {},
    "change_case:english_lowercase": {},
    "punctuation:no_comma": {},
    "startend:quotation": {},
}


def rows(limit: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """(response, ground truth) pairs: the sample's responses, 1-3 instructions each, in turn."""
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as f:
        responses = [json.loads(line)["response"] for line in f]
    if limit:
        responses = responses[:limit]
    ids = sorted(KWARGS)
    out = []
    for i, response in enumerate(responses):
        chosen = list(dict.fromkeys(ids[(3 * i + j * 7) % len(ids)] for j in range(1 + i % 3)))
        gt = {
            "instruction_id_list": chosen,
            "kwargs": [KWARGS[c] for c in chosen],
            "prompt": "Answer the question.",
        }
        out.append((response, gt))
    return out


def verdicts(mod: Any, pairs: list[tuple[str, dict[str, Any]]]) -> list[list[tuple[bool, bool]]]:
    """Each row's (strict, loose) verdict per instruction by ``mod.ifeval_compute_score``."""
    return [
        [(v["strict"], v["loose"]) for v in mod.ifeval_compute_score("ifeval", r, gt).info["instructions"]]
        for r, gt in pairs
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--limit", type=int, default=0, help="first N responses only (0: all)")
    add_args(p)
    a = p.parse_args()
    import stepcredit.reward.verifiers.ifeval as ours
    from _git_module import module_at

    old = module_at(OLD_COMMIT, "src/stepcredit/reward/verifiers/ifeval.py", "ifeval_205d728")
    pairs = rows(a.limit)
    sides = {"ours": lambda: verdicts(ours, pairs), "old": lambda: verdicts(old, pairs)}
    for fn in sides.values():  # warm-up: registry, Punkt model, langdetect profiles
        fn()
    mon = Monitor()
    runs = mon.alternate(sides, repeats=a.repeats)
    times = {k: [w["wall_s"] for w in mon.windows if w["side"] == k] for k in runs}
    res: dict[str, Any] = {
        "benchmark": "ifeval_speed",
        "rows": len(pairs),
        "instructions": sum(len(gt["instruction_id_list"]) for _, gt in pairs),
        "rows_with_different_verdicts": sum(
            x != y for x, y in zip(runs["ours"][-1], runs["old"][-1], strict=True)
        ),
    }
    for k in sides:
        res[k] = {"responses_per_s": spread([len(pairs) / t for t in times[k]])}
        print(f"{k:>5}: {res[k]['responses_per_s']['median']:.0f} responses/s")
    res["ratio_ours_over_old"] = (
        res["ours"]["responses_per_s"]["median"] / res["old"]["responses_per_s"]["median"]
    )
    print(
        f"ratio ours/old: {res['ratio_ours_over_old']:.2f}; rows whose verdicts differ: "
        f"{res['rows_with_different_verdicts']}"
    )
    settings = {"ours": {"verifier": "ifeval.py"}, "old": {"verifier": f"ifeval.py at {OLD_COMMIT}"}}
    emit(mon.finish(res, settings), a.json)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
