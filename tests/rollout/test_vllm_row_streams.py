"""Per-row random streams through the ``vllm`` engine (issue 44's validation common random numbers): one
request seed per prompt, so a prompt's sampled answer does not depend on the other prompts of the call.

Runs in ``.venv-vllm``."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from stepcredit.config import ArithConfig, ModelConfig, TinyModelConfig  # noqa: E402
from stepcredit.data import row_to_sample  # noqa: E402
from stepcredit.data.arith import make_rows  # noqa: E402
from stepcredit.models import load_policy  # noqa: E402
from stepcredit.rollout.batching import generate_batch  # noqa: E402
from stepcredit.rollout.engines import GenerationSpec  # noqa: E402
from stepcredit.rollout.engines.vllm import VLLMEngine  # noqa: E402

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=1, intermediate_size=64))


def test_row_seeds_pair_each_prompt_with_its_own_stream() -> None:
    model, tok = load_policy(SMALL, seed=0)
    engine = VLLMEngine(model, seed=0)
    try:
        rows = make_rows(ArithConfig(), 3, seed=0, split="val")
        samples = [row_to_sample(r, f"v:{i}") for i, r in enumerate(rows)]
        spec = GenerationSpec(n=1, max_new_tokens=12, temperature=1.0, with_logprobs=False)
        # the one batch generation every engine shares, on vLLM's sampling
        all3 = generate_batch(engine, model, tok, samples, replace(spec, row_seeds=(11, 12, 13)))
        two = generate_batch(engine, model, tok, [samples[2], samples[0]], replace(spec, row_seeds=(13, 11)))
        assert two.texts == [all3.texts[2], all3.texts[0]]
    finally:
        engine.close()
