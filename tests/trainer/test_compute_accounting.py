"""The compute accounting an experiment compares arms by (issue 44): tokens sampled by the rollout and
by the process stage's continuations, counted by hand on a stub model and on a tiny run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from stepcredit.config import ProcessConfig
from stepcredit.process.continuation import continuation_values
from stepcredit.process.values import PrefixRequest, ValueContext, spending
from stepcredit.rollout import engines
from stepcredit.rollout.engines import Completion
from stepcredit.types import Sample

EOS, PAD = 99, 0


class StubModel(torch.nn.Module):
    """A policy bound to itself as its rollout engine (every stage samples through the bound engine):
    row r of a call (contexts x n, context-major) is (r % 3) + 1 tokens (7s) and an eos."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.calls: list[int] = []
        engines.bind(self, self)  # type: ignore[arg-type]

    def sample(self, model: Any, tok: Any, contexts: Sequence[Sequence[int]], spec: Any, **_: Any) -> list:
        rows = len(contexts) * spec.n
        self.calls.append(rows)
        return [Completion([7] * (r % 3 + 1) + [EOS]) for r in range(rows)]


class StubTok:
    pad_token_id, eos_token_id = PAD, EOS

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids if not skip_special_tokens or i not in (PAD, EOS))


def test_continuation_tokens_and_verifier_calls_by_hand() -> None:
    s = Sample(prompt=({"role": "user", "content": "q"},), ground_truth="1")
    # response 0 ended by itself (eos): V_0 and V_1 are continued, V_2 (the whole response) is its reward;
    # response 1 was cut off: V_0 (the same context as response 0's: generated once), V_1 and V_2 continued
    r0 = PrefixRequest(s, [1, 2], [10, 11, 12, EOS], [0, 2, 4], "1", complete=True)
    r1 = PrefixRequest(s, [1, 2], [13, 14, 15], [0, 1, 3], "1", complete=False)
    scored: list[int] = []

    def score(samples: Any, texts: Any) -> list[float]:
        scored.append(len(texts))
        return [0.0] * len(texts)

    model = StubModel()
    cfg = ProcessConfig(mc_max_new_tokens=8, mc_prefixes=0, max_tokens_per_forward=1 << 20)

    def ctx(requests: list[PrefixRequest]) -> ValueContext:
        return ValueContext(model=model, tokenizer=StubTok(), requests=requests, cfg=cfg, score_fn=score)

    with spending() as spent:
        continuation_values(ctx([r0, r1]), samples=1, greedy=True, temperature=1.0)
    # 4 distinct contexts in one call: [1 2], [1 2 10 11], [1 2 13], [1 2 13 14 15]; rows 0..3 append
    # 1, 2, 3, 1 tokens and an eos each: 2 + 3 + 4 + 2 = 11 generated tokens (padding not counted)
    assert model.calls == [4]
    assert spent.generated_tokens == 11
    # texts scored: r0's whole response, then a continuation per context and sample: the shared V_0
    # context of the one sample is one text for both responses, r0's V_1, r1's V_1 and V_2: 1 + 1 + 1 + 2
    assert scored == [5] and spent.verifier_calls == 5
    # outside a spending block nothing is counted (and nothing fails)
    continuation_values(ctx([r0]), samples=1, greedy=True, temperature=1.0)
    assert spent.generated_tokens == 11


@pytest.mark.parametrize("estimator", ["off", "greedy_continuation", "forced_answer_logprob"])
def test_a_tiny_runs_generated_tokens_add_up(tmp_path: Path, estimator: str, tiny_train: list[str]) -> None:
    from stepcredit.cli.main import main

    process = (
        []
        if estimator == "off"
        else ["process.enabled=true", f"process.value_estimator={estimator}", "process.min_episode_tokens=1",
              "process.mc_prefixes=0", "process.mc_max_new_tokens=8", "algorithm.advantage=grpo_process"]
    )  # fmt: skip
    argv = ["train", "--out", str(tmp_path), *tiny_train, "sft.steps=2", "trainer.steps=2"]
    assert main([*argv, "trainer.val_every=0", "trainer.save_every=0", *process]) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    total = 0.0
    for r in steps:
        # the rollout's tokens are its responses' (flat rollouts: mean length x responses, eos included)
        rollout = r["response_length/mean"] * r["samples/generated"]
        assert r["rollout/generated_tokens_per_response"] * r["samples/generated"] == pytest.approx(rollout)
        process_tokens = r.get("process/generated_tokens", 0.0)
        assert r["generated/step_tokens"] == pytest.approx(rollout + process_tokens)
        total += r["generated/step_tokens"]
        assert r["generated_tokens"] == pytest.approx(total)
        if estimator == "greedy_continuation":
            # one greedy continuation per prefix not ended by the response itself: at least one per
            # prompt (V_0), at most 8 tokens each (mc_max_new_tokens), one verifier call per text
            assert r["process/verifier_calls"] >= 4 and 0 < process_tokens <= 8 * r["process/verifier_calls"]
            assert r["process/values"] >= r["samples/generated"] * 2  # V_0 and at least one episode end
        elif estimator == "forced_answer_logprob":
            # scoring passes only: values computed, nothing generated, no verifier call
            assert process_tokens == 0.0 and r["process/verifier_calls"] == 0.0 and r["process/values"] > 0
        else:
            assert "process/generated_tokens" not in r
