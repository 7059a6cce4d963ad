"""The engine registry and the ``hf`` engine's sampling interface (no vLLM needed)."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from stepcredit.config import Config, ModelConfig, RolloutConfig, TinyModelConfig, TreeConfig
from stepcredit.errors import ConfigError
from stepcredit.models import load_policy
from stepcredit.rollout import check_config, engines
from stepcredit.rollout.engines import SamplingSpec, cut_at_stop, engine_for, fingerprint
from stepcredit.rollout.engines.hf import HF_ENGINE

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))


def _ctx(tok: object, *texts: str) -> list[list[int]]:
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]  # type: ignore[operator]


def test_a_model_without_an_engine_generates_itself() -> None:
    model, _ = load_policy(SMALL, seed=0)
    assert engine_for(model) is HF_ENGINE
    sentinel = object()
    engines.bind(model, sentinel)  # type: ignore[arg-type]
    assert engine_for(model) is sentinel
    engines.unbind(model)
    assert engine_for(model) is HF_ENGINE


def test_hf_sampling_interface() -> None:
    model, tok = load_policy(SMALL, seed=0)
    ctx = _ctx(tok, "12+3=", "7*8=")
    spec = SamplingSpec(n=3, temperature=1.0, max_tokens=9, seed=11)
    a = HF_ENGINE.sample(model, tok, ctx, dataclasses.replace(spec, logprobs=True, entropy=True))
    b = HF_ENGINE.sample(model, tok, ctx, dataclasses.replace(spec, logprobs=True))
    assert len(a) == 6 and [c.ids for c in a] == [c.ids for c in b]  # the seed fixes the draws
    assert all(1 <= len(c.ids) <= 9 and len(c.logprobs) == len(c.ids) == len(c.entropy) for c in a)
    state = torch.random.get_rng_state()
    HF_ENGINE.sample(model, tok, ctx, spec)
    assert torch.equal(state, torch.random.get_rng_state())  # a seeded call leaves the global stream
    # per-context budgets, and greedy is the argmax whatever the seed
    short = HF_ENGINE.sample(model, tok, ctx, SamplingSpec(temperature=0.0, max_tokens=9), budgets=[2, 5])
    assert [len(c.ids) for c in short] == [2, 5] or all(tok.eos_token_id in c.ids for c in short)
    g1 = HF_ENGINE.sample(model, tok, ctx, SamplingSpec(temperature=0.0, max_tokens=6, seed=1))
    g2 = HF_ENGINE.sample(model, tok, ctx, SamplingSpec(temperature=0.0, max_tokens=6, seed=2))
    assert [c.ids for c in g1] == [c.ids for c in g2]
    # top-p: every draw lies in the nucleus of the first token's distribution
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor(ctx[:1])).logits[0, -1], -1)
    order = torch.argsort(probs, descending=True)
    keep = int((torch.cumsum(probs[order], 0) < 0.3).sum()) + 1
    nucleus = set(order[:keep].tolist())
    first = HF_ENGINE.sample(model, tok, ctx[:1], SamplingSpec(n=40, top_p=0.3, max_tokens=1, seed=3))
    assert {c.ids[0] for c in first} <= nucleus


def test_stop_strings_cut_after_the_completing_token() -> None:
    model, tok = load_policy(SMALL, seed=0)
    ids = tok("ab=12;cd", add_special_tokens=False)["input_ids"]
    # character tokens: "ab=12;" is 6 tokens; the stop string "2;" is completed by the 6th
    assert cut_at_stop(ids, tok, ("2;",)) == 6
    assert cut_at_stop(ids, tok, ("zz",)) == len(ids)
    assert cut_at_stop(ids, tok, ()) == len(ids)
    assert cut_at_stop(ids, tok, ("cd", "=")) == 3  # the first occurrence of any
    free = HF_ENGINE.sample(model, tok, _ctx(tok, "1+1="), SamplingSpec(max_tokens=12, seed=0))[0].ids
    text = tok.decode(free, skip_special_tokens=True)
    if len(text) >= 3:  # stop at the free run's own third character: the same draws, cut there
        stop = text[2]
        cut = HF_ENGINE.sample(
            model, tok, _ctx(tok, "1+1="), SamplingSpec(max_tokens=12, seed=0, stop=(stop,))
        )
        assert cut[0].ids == free[: cut_at_stop(free, tok, (stop,))]
        assert tok.decode(cut[0].ids, skip_special_tokens=True).endswith(stop)


def test_the_fingerprint_follows_every_weight_write() -> None:
    model, tok = load_policy(SMALL, seed=0)
    f0 = fingerprint(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor(_ctx(tok, "1+1="))).logits.sum().backward()
    assert fingerprint(model) == f0  # a backward pass writes gradients, not weights
    opt.step()
    f1 = fingerprint(model)
    assert f1 != f0
    model.load_state_dict(model.state_dict())
    assert fingerprint(model) != f1


def test_start_up_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = RolloutConfig(mode="tree", n=4, tree=TreeConfig(branch_at="entropy"), engine="vllm")
    real = importlib.util.find_spec

    def installed(present: bool) -> None:
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a: (real("torch") if present else None) if name == "vllm" else real(name, *a),
        )

    installed(False)
    with pytest.raises(ConfigError, match=r"rollout\.engine: vllm needs the 'vllm' package"):
        check_config(Config(rollout=dataclasses.replace(tree, mode="flat")))
    installed(True)
    with pytest.raises(ConfigError, match=r"rollout\.tree\.branch_at: entropy reads each token's entropy"):
        check_config(Config(rollout=tree))
    check_config(Config(rollout=dataclasses.replace(tree, tree=TreeConfig(branch_at="episode"))))
    check_config(Config(rollout=dataclasses.replace(tree, engine="hf")))  # hf reports entropies
    with pytest.raises(ConfigError, match="unknown rollout engine 'vlm'; did you mean vllm"):
        check_config(Config(rollout=RolloutConfig(engine="vlm")))
