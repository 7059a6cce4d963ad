"""How ``mmlu_pro_sample.jsonl.gz`` was drawn (labels were added afterwards, see README.md).

    python make_sample.py /path/to/TIGER-AI-Lab/MMLU-Pro/.git > candidates.jsonl

Reads the published model outputs from the MMLU-Pro repository's history (``eval_results/`` at commit
964a136 for the zipped 5-shot CoT outputs, ff991b5 for GPT-4o and DeepSeek), keeps chat/instruct models,
and draws per model (seed 0) 100 responses that MMLU-Pro's own regex ``answer is \\(?([A-J])\\)?`` reads and
60 it cannot read, each at most 5,000 characters.
"""

from __future__ import annotations

import io
import json
import random
import re
import subprocess
import sys
import zipfile

ZIPS = "964a136e98ff17f81b0cd11c15c70784f6ee4378"
SPLIT = "ff991b5b7f14a383fd41da3987447ab6c08bf138"
ZIPPED = [
    "Meta-Llama-3_1-8B-Instruct",
    "Meta-Llama-3_1-70B-Instruct",
    "Mixtral-8x7B-Instruct-v0.1",
    "Phi-3-mini-4k-instruct",
    "Qwen1.5-7B-Chat",
    "Qwen1.5-72B-Chat",
    "Yi-6b-Chat",
    "c4ai-command-r-v01",
    "gemini-1.5-flash-002",
    "gemini-1.5-pro-002",
    "jamba-1.5-large",
    "mathstral-7B",
]
PER_SUBJECT = ["gpt4o", "deepseek"]
READ = re.compile(r"answer is \(?([A-J])\)?")


def git(repo: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", repo, *args], check=True, capture_output=True).stdout


def rows_of(repo: str, model: str) -> list[dict]:
    if model in PER_SUBJECT:
        names = git(repo, "ls-tree", "--name-only", SPLIT, f"eval_results/{model}/").decode().splitlines()
        out = []
        for name in sorted(n for n in names if n.endswith("_result.json")):
            out += json.loads(git(repo, "show", f"{SPLIT}:{name}"))
        return out
    blob = git(repo, "show", f"{ZIPS}:eval_results/model_outputs_{model}_5shots.zip")
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        return json.loads(z.read(z.namelist()[0]))


def main() -> None:
    repo = sys.argv[1]
    rng = random.Random(0)
    for model in ZIPPED + PER_SUBJECT:
        rows = []
        for r in rows_of(repo, model):
            text = r.get("model_outputs") or r.get("generated_text") or r.get("response") or ""
            opts = [o for o in (r["options"] if isinstance(r["options"], list) else []) if o != "N/A"]
            if (
                text.strip()
                and len(text) <= 5000
                and "\nQuestion:" not in text
                and len(opts) == len(r["options"])
            ):
                rows.append((r, text, opts))
        rows.sort(key=lambda x: x[0]["question_id"])
        easy = [x for x in rows if READ.search(x[1])]
        hard = [x for x in rows if not READ.search(x[1])]
        for r, text, opts in rng.sample(easy, min(100, len(easy))) + rng.sample(hard, min(60, len(hard))):
            print(
                json.dumps(
                    {
                        "model": model,
                        "category": r["category"],
                        "question_id": r["question_id"],
                        "options": opts,
                        "answer": r["answer"],
                        "response": text,
                    }
                )
            )


if __name__ == "__main__":
    main()
