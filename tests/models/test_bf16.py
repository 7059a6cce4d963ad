"""``model.dtype=bfloat16``: bf16 autocast over float32 parameters. Its log-probs stay close to the
float32 ones, and a run through ``stepcredit train`` trains (finite loss and gradients, weights move)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import torch

from stepcredit.cli.common import load_preset
from stepcredit.cli.main import main
from stepcredit.config import ModelConfig, TinyModelConfig, from_dict
from stepcredit.models import load_policy, token_logprobs

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def test_bf16_log_probs_are_close_to_float32() -> None:
    fp32, _ = load_policy(ModelConfig(tiny=TINY), seed=0)
    bf16, _ = load_policy(ModelConfig(tiny=TINY, dtype="bfloat16"), seed=0)
    assert all(p.dtype == torch.float32 for p in bf16.parameters())  # master weights stay float32
    ids = torch.randint(8, 100, (4, 30), generator=torch.Generator().manual_seed(0))
    attn = torch.ones_like(ids)
    with torch.no_grad():
        a, _ = token_logprobs(fp32, ids, attn, n_response=20)
        b, _ = token_logprobs(bf16, ids, attn, n_response=20)
        ref = copy.deepcopy(bf16)  # the frozen reference is a deep copy: it keeps autocast, on itself
        c, _ = token_logprobs(ref, ids, attn, n_response=20)
    assert not torch.equal(a, b)  # bf16 really ran
    # bf16 keeps ~3 significant digits: log-probs near log(1/vocab) ~ -4.6 agree to a few hundredths
    assert float((a - b).abs().max()) < 0.05
    assert torch.equal(b, c)


def length_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """A reward with signal even for an untrained model (responses differ in length)."""
    return len(solution_str) / 16


def test_a_bf16_run_trains(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--preset", "smoke", "model.dtype=bfloat16", "sft.steps=0", "trainer.steps=2"]
    args += [f"reward.custom.path={__file__}:length_score", "reward.custom.isolate=false"]
    args += ["reward.agent.backend=thread"]
    assert main(["train", *args, "trainer.val_every=0", "trainer.threads=1", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("step", 0) >= 1]
    assert len(rl) == 2
    for r in rl:
        assert math.isfinite(r["pg_loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
    smoke = from_dict(load_preset("smoke")).model.tiny  # the preset's model, as the run built it
    start, _ = load_policy(ModelConfig(tiny=smoke), seed=0)
    trained, _ = load_policy(ModelConfig(path=str(out / "checkpoints" / "final" / "model")))
    moved = [not torch.equal(p, q) for p, q in zip(start.parameters(), trained.parameters(), strict=True)]
    assert sum(moved) == len(moved)  # every weight took an update ...
    # ... of AdamW's size (lr 2e-5): below bf16's resolution, so kept only by float32 master weights
    pairs = zip(start.parameters(), trained.parameters(), strict=True)
    assert max(float((p - q).abs().max()) for p, q in pairs) < 1e-3
