"""End to end through the command line: the four-domain preset (arithmetic, code, generated
instruction-following and multiple-choice rows) trains and logs every domain's reward and validation,
and ``stepcredit score`` routes IFEval and multiple-choice rows to their verifiers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stepcredit.cli.main import main

EXE = [sys.executable, "-m", "stepcredit.cli.main"]
TINY_CHANGES = [
    "data.train_size=32",
    "rollout.prompts_per_step=8",
    "postprocess.dynamic_sampling.enabled=false",
]
"""What this file's runs change in the tiny run's overrides (``tiny_train``, tests/conftest.py)."""
DOMAINS = ("arith", "code", "ifeval", "mc")


@pytest.mark.slow  # ~25 s on the loaded 2-core machine
def test_alldomains_preset_logs_every_domain(tmp_path: Path, tiny_train: list[str]) -> None:
    out = tmp_path / "run"
    args = [
        *tiny_train,
        *TINY_CHANGES,
        "sft.steps=2",
        "trainer.steps=2",
        "trainer.val_every=2",
        "trainer.save_every=0",
    ]
    assert main(["train", "--preset", "alldomains", "--out", str(out), *args]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {f"val/accuracy/{d}" for d in DOMAINS} <= set(rows[0])
    for r in rows[1:]:
        for d in DOMAINS:
            assert isinstance(r[f"{d}/reward/mean"], float), d
            assert f"{d}/status/ok" in r
            # a quarter of the 8 prompts from every domain, n=2 responses each
            assert r[f"{d}/count"] == 2 * 2
    assert {f"val/accuracy/{d}" for d in DOMAINS} <= set(rows[-1])


def test_score_routes_ifeval_and_multiple_choice_rows(tmp_path: Path) -> None:
    gt_if = {
        "instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"],
        "kwargs": [{}, {}],
    }
    rows = [
        # IFEval schema in the ground truth: both constraints met, then one of two (no comma, but capitals)
        {"data_source": "ifeval", "response": "the cat sleeps in the sun.", "ground_truth": gt_if},
        {"data_source": "ifeval", "response": "The cat sleeps in the sun.", "ground_truth": gt_if},
        # Hugging Face's google/IFEval layout: the schema in extra_info, kwargs padded with nulls
        {
            "data_source": "google/IFEval",
            "response": "Hello, world",
            "reward_model": {"ground_truth": ""},
            "extra_info": {
                "instruction_id_list": ["punctuation:no_comma"],
                "kwargs": [{"num_words": None, "relation": None}],
            },
        },
        {"data_source": "multiple_choice", "response": "The answer is (B).", "ground_truth": "B"},
        {"data_source": "mmlu_pro", "response": "The answer is A or B.", "ground_truth": "B"},
        {"data_source": "gpqa_diamond", "response": "I do not know.", "ground_truth": "B"},
        {"data_source": "ifeval", "response": "x", "ground_truth": {"instruction_id_list": ["no:such_id"]}},
    ]
    inp, outp = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run(
        [*EXE, "score", "--in", str(inp), "--out", str(outp)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in outp.read_text().splitlines()]
    assert [g["score"] for g in got[:6]] == [1.0, 0.5, 0.0, 1.0, 0.0, 0.0]
    assert [g["status"] for g in got[:6]] == ["ok", "ok", "ok", "ok", "ok", "unparseable"]
    assert [g["source"] for g in got[:6]] == ["ifeval"] * 3 + ["multiple_choice"] * 3
    # an unknown instruction id is an error naming the row, never a silent 0
    assert got[6]["status"] == "error" and got[6]["score"] is None
    assert "in.jsonl:7" in got[6]["error"] and "no:such_id" in got[6]["error"]
