"""V(prefix): the three execution strategies agree; they match a plain reference; monte_carlo."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from stepcredit.config import Config, ProcessConfig
from stepcredit.errors import ConfigError
from stepcredit.models import token_logprobs
from stepcredit.process import (
    ValueQuery,
    answer_suffix,
    check_config,
    compute_prefix_values,
    resolve_force_prompt,
    score_each,
)
from stepcredit.process import forced as forced_mod
from stepcredit.process.forced import packed_layout, packed_mask
from stepcredit.types import Batch, RolloutCache, Sample

ROWS = [
    (
        "Ann has 3 apples. Then gets 4 more. How many?",
        "Let me start with 3. So 3 + 4 = 7. But wait, that is it.\nThe answer is 7.",
        "7",
    ),
    ("Ben has 9 pens. Then loses 2. How many?", "So 9 - 2 = 6. Wait, 9 - 2 = 7. The answer is 7.", "7"),
    ("Cal has 1 coin?", "Hmm, 1.", "1"),
    (
        "Dee has 12 cards. Then gets 30 more. How many now?",
        "First, 12. Next, 12 + 30 = 42. Therefore 42. Finally, done.",
        "42",
    ),
]


def values(model: Any, tok: Any, batch: Batch, **kw: Any) -> list[list[float]]:
    got = compute_prefix_values(model, tok, batch, ProcessConfig(min_episode_tokens=2, **kw))
    assert [len(v) for v in got.values] == [len(e) + 1 for e in got.episode_ends]
    assert batch.prefix_values is None and batch.episode_ends is None  # nothing written into the batch
    return got.values


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def with_rollout_cache(model: Any, batch: Batch) -> Batch:
    """The batch with the KV cache of a behaviour log-prob pass over it, as ``generate(keep_cache=True)``
    leaves it (left-padded prompts, right-padded responses, positions from the mask)."""
    caches: list[Any] = []
    ids = torch.cat([batch.prompt_ids_BP, batch.response_ids_BT], 1)
    att = torch.cat([batch.prompt_mask_BP, batch.response_mask_BT], 1).long()
    with torch.no_grad():
        token_logprobs(model, ids, att, n_response=batch.response_ids_BT.shape[1], cache_out=caches)
    P = batch.prompt_ids_BP.shape[1]
    batch.kv_cache = RolloutCache(caches[0], (P - batch.prompt_mask_BP.sum(1)).tolist(), ids.shape[1])
    return batch


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_strategies_agree(
    arch: str,
    attn: str,
    model_factory: Callable[..., Any],
    batch_factory: Callable[..., Batch],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, tok = model_factory(arch, attn)
    ref = values(model, tok, batch_factory(tok, ROWS), strategy="naive")
    assert sum(len(v) for v in ref) >= 12  # the traces really have several episodes
    spread = max(max(v) - min(v) for v in ref)
    assert spread > 1e-2  # values differ between prefixes, so agreement is not trivial
    got = {
        "kv_cache": values(model, tok, batch_factory(tok, ROWS), strategy="kv_cache"),
        "kv_packed (all in one pass)": values(model, tok, batch_factory(tok, ROWS), strategy="kv_packed"),
        "kv_packed (one response per pass)": values(
            model, tok, batch_factory(tok, ROWS), strategy="kv_packed", max_tokens_per_forward=1
        ),
        "packed (all in one pass)": values(model, tok, batch_factory(tok, ROWS), strategy="packed"),
        "packed (one response per pass)": values(
            model, tok, batch_factory(tok, ROWS), strategy="packed", max_tokens_per_forward=1
        ),
        "packed (two per pass)": values(
            model, tok, batch_factory(tok, ROWS), strategy="packed", max_tokens_per_forward=400
        ),
        "packed_single": values(model, tok, batch_factory(tok, ROWS), strategy="packed_single"),
        "packed_single (one response per pass)": values(
            model, tok, batch_factory(tok, ROWS), strategy="packed_single", max_tokens_per_forward=1
        ),
        "packed over the rollout cache": values(
            model, tok, with_rollout_cache(model, batch_factory(tok, ROWS)), strategy="packed"
        ),
        "kv_packed over the rollout cache, one row per pass": values(
            model,
            tok,
            with_rollout_cache(model, batch_factory(tok, ROWS)),
            strategy="kv_packed",
            max_tokens_per_forward=1,
        ),
    }
    # packed's layout for long responses (two calls) on these short rows
    monkeypatch.setattr(forced_mod, "ONE_CALL_MAX_BODY", 0)
    got["packed (long-response layout)"] = values(model, tok, batch_factory(tok, ROWS), strategy="packed")
    for name, v in got.items():
        assert max_diff(v, ref) < 1e-4, name


def test_rollout_cache_is_read_not_modified_and_must_match_the_batch(
    model_factory: Callable[..., Any], batch_factory: Callable[..., Batch]
) -> None:
    model, tok = model_factory("llama", "sdpa")
    batch = with_rollout_cache(model, batch_factory(tok, ROWS))
    first = values(model, tok, batch)
    assert batch.kv_cache is not None  # the stage never writes into its input: the caller drops the cache
    assert values(model, tok, batch) == first  # ... and it reads the cache without changing it
    wrong = batch_factory(tok, ROWS)
    wrong.kv_cache = with_rollout_cache(model, batch_factory(tok, ROWS[:2])).kv_cache
    with pytest.raises(ValueError, match="holds 2 rows for 4 responses"):
        values(model, tok, wrong)


def test_generate_keeps_the_cache_and_values_match_a_fresh_pass(
    model_factory: Callable[..., Any],
) -> None:
    """Through the real rollout: values continued from generation's own pass equal a fresh packed pass."""
    from stepcredit.rollout import generate

    model, tok = model_factory("llama", "sdpa")
    samples = [
        Sample(prompt=({"role": "user", "content": p},), ground_truth=a, uid=f"g:{i}")
        for i, (p, _, a) in enumerate(ROWS)
    ]
    torch.manual_seed(0)
    batch = generate(model, tok, samples, n=2, max_new_tokens=40, keep_cache=True)
    assert batch.kv_cache is not None
    fresh = batch.select(list(range(len(batch))))
    assert fresh.kv_cache is None  # select never carries the cache
    cfg = ProcessConfig(min_episode_tokens=2, max_episode_tokens=8)
    cached = compute_prefix_values(model, tok, batch, cfg).values
    recomputed = compute_prefix_values(model, tok, fresh, cfg).values
    assert sum(len(v) for v in cached) > len(batch)  # several prefixes per response
    assert max_diff(cached, recomputed) < 1e-4


def test_padding_and_batch_composition_do_not_change_values(
    model_factory: Callable[..., Any], batch_factory: Callable[..., Batch]
) -> None:
    model, tok = model_factory("llama", "sdpa")
    together = values(model, tok, batch_factory(tok, ROWS))
    for i, row in enumerate(ROWS):
        alone = values(model, tok, batch_factory(tok, [row]))
        assert max_diff(alone, [together[i]]) < 1e-4


def test_matches_a_plain_forward_over_the_text(
    model_factory: Callable[..., Any], batch_factory: Callable[..., Batch]
) -> None:
    """Reference: build the whole string, run the model, average the answer's log-probs by hand."""
    model, tok = model_factory("llama", "eager")
    batch = batch_factory(tok, ROWS[:2])
    got = values(model, tok, batch)
    ends = compute_prefix_values(model, tok, batch, ProcessConfig(min_episode_tokens=2)).episode_ends
    for b, (prompt, response, answer) in enumerate(ROWS[:2]):
        chat = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        force = "\nThe answer is "
        cuts = [0] + [e + 1 for e in ends[b]]
        for k, cut in enumerate(cuts):
            # the last prefix excludes eos (the character tokenizer: token index == character index)
            ids = tok(chat + response[:cut] + force + answer, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0]
            logp = torch.log_softmax(logits, -1)
            n = len(answer)
            want = sum(float(logp[len(ids) - n - 1 + j, ids[len(ids) - n + j]]) for j in range(n)) / n
            assert abs(got[b][k] - want) < 1e-4


def test_force_prompt_and_answer_tokens() -> None:
    class Tok:
        chat_template = "{{ '<think>' }}...</think>"

    assert resolve_force_prompt(Tok(), "auto") == "</think>\n\nThe answer is "
    assert resolve_force_prompt(object(), "auto") == "\nThe answer is "
    assert resolve_force_prompt(object(), "Answer: ") == "Answer: "

    from stepcredit.models import build_tokenizer

    ids, n = answer_suffix(build_tokenizer(), "\nThe answer is ", "42")
    assert n == 2 and len(ids) == len("\nThe answer is 42")


def test_values_leave_the_model_in_its_mode(
    model_factory: Callable[..., Any], batch_factory: Callable[..., Batch]
) -> None:
    model, tok = model_factory("llama", "sdpa")
    model.train()
    values(model, tok, batch_factory(tok, ROWS[:1]))
    assert model.training


def test_monte_carlo(model_factory: Callable[..., Any], batch_factory: Callable[..., Batch]) -> None:
    model, tok = model_factory("llama", "sdpa")
    seen: list[str] = []

    def score(sample: Any, text: str) -> float:
        seen.append(text)
        return 1.0 if text.rstrip(".").endswith(str(sample.ground_truth)) else 0.0

    batch = batch_factory(tok, ROWS[:2])
    torch.manual_seed(0)
    got = compute_prefix_values(
        model,
        tok,
        batch,
        ProcessConfig(value_estimator="monte_carlo", mc_samples=3, mc_max_new_tokens=4),
        score_fn=score_each(score),
    )
    for b, vals in enumerate(got.values):
        assert all(0.0 <= v <= 1.0 for v in vals)
        # a complete response's last value is its own reward, with no sampling
        assert vals[-1] == score(batch.samples[b], ROWS[b][1])
    n_prefixes = sum(len(e) for e in got.episode_ends)  # V_0..V_(S-1) are sampled, V_S is scored
    assert len(seen) == n_prefixes * 3 + 2 + 2
    # every continuation starts with its prefix's text
    assert sum(t.startswith(ROWS[0][1][:10]) for t in seen) >= 3

    with pytest.raises(ConfigError, match="score_fn"):
        compute_prefix_values(model, tok, batch, ProcessConfig(value_estimator="monte_carlo"))


def test_check_config() -> None:
    check_config(Config())
    with pytest.raises(ConfigError, match=r"process\.value_estimator"):
        check_config(Config(process=ProcessConfig(value_estimator="forced_answer")))
    with pytest.raises(ConfigError, match=r"process\.strategy"):
        check_config(Config(process=ProcessConfig(strategy="fast")))
    with pytest.raises(ConfigError, match=r"process\.max_episode_tokens"):
        ProcessConfig(max_episode_tokens=2, min_episode_tokens=3)


def test_packed_mask_matches_the_definition() -> None:
    """Brute force: suffix copy i (rows r..r+A) sees keys < P + L_i and its own copy causally."""
    q = ValueQuery([5, 6, 7], [10, 11, 12, 13, 14], [0, 2, 5], [20, 21, 22], 1)
    short = ValueQuery([5], [10, 11], [0, 2], [20, 21, 22], 1)
    layouts = [packed_layout(q), packed_layout(short)]
    mask = packed_mask(layouts, torch.float32)
    for r, (ids, pos, _) in enumerate(layouts):
        qq = (q, short)[r]
        w, m = mask.shape[-1], len(ids)
        off = w - m
        p, a, body = len(qq.context_ids), 3, len(qq.context_ids) + max(qq.prefix_lens)
        for i in range(w):
            for j in range(w):
                if i < off:
                    want = i == j  # padding rows see themselves only
                elif j < off:
                    want = False
                else:
                    x, y = i - off, j - off
                    if x < body:
                        want = y <= x
                    else:
                        k = (x - body) // a
                        start = body + k * a
                        want = y < p + qq.prefix_lens[k] or start <= y <= x
                assert (mask[r, 0, i, j] == 0) == want, (r, i, j)
        # positions continue each prefix: copy k starts at P + L_k
        assert pos[len(ids) - 3 * len(qq.prefix_lens) :: 3] == [
            len(qq.context_ids) + n for n in qq.prefix_lens
        ]
