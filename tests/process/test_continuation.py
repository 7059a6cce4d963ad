"""Continuation values (monte_carlo, greedy_continuation) with a scripted policy: exact values."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from stepcredit.config import ProcessConfig
from stepcredit.models import build_tokenizer
from stepcredit.process import VALUE_ESTIMATORS, compute_prefix_values, mc_prefix_indices, score_each
from stepcredit.rollout import engines
from stepcredit.rollout.engines import Completion
from stepcredit.types import Batch, Sample

RESPONSE = "So 3 + 4 = 7. So 7 + 1 = 8. So done."  # episodes: "So 3 + 4 = 7. ", "So 7 + 1 = 8. ", "So done."


class ScriptedPolicy(torch.nn.Module):
    """A policy bound to itself as its rollout engine (every stage samples through the bound engine):
    continuation k of each context is " ok" when k < 3, else " no", so Monte Carlo's mean over K = 4
    is exact (3/4). ``calls`` holds the rows (contexts x n) of each engine call."""

    def __init__(self, tok: Any) -> None:
        super().__init__()
        self.tok = tok
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.calls: list[int] = []
        engines.bind(self, self)  # type: ignore[arg-type]

    def sample(self, model: Any, tok: Any, contexts: Sequence[Sequence[int]], spec: Any, **_: Any) -> list:
        self.calls.append(len(contexts) * spec.n)
        return [
            Completion(self.tok(" ok" if k < 3 else " no")["input_ids"])
            for _ in contexts
            for k in range(spec.n)
        ]


def score_one(sample: Sample, text: str) -> float:
    # right iff the continuation says "ok" and the wrong result "= 8" is not in the text
    return 1.0 if text.endswith("ok") and "= 8" not in text else 0.0


score = score_each(score_one)


def run(batch: Batch, tok: Any, **kw: Any) -> tuple[list[list[float]], ScriptedPolicy]:
    model = ScriptedPolicy(tok)
    got = compute_prefix_values(model, tok, batch, ProcessConfig(**kw), score_fn=score)
    assert [len(e) for e in got.episode_ends] == [3] * len(batch)
    return got.values, model


def test_monte_carlo_exact_with_a_scripted_policy(batch_factory: Callable[..., Batch]) -> None:
    tok = build_tokenizer()
    batch = batch_factory(tok, [("q", RESPONSE, "7"), ("q", RESPONSE[:-1] + "!", "7")])
    values, model = run(batch, tok, value_estimator="monte_carlo", mc_samples=4, mc_v0="sample")
    # V_0, V_1: 3 of the 4 continuations say "ok" and the prefix holds no "= 8": 3/4.
    # V_2: the prefix holds "= 8", every continuation scores 0. V_3: the complete response is scored as
    # it is (it does not end in "ok"): 0, with no sampling.
    assert values == [[0.75, 0.75, 0.0, 0.0]] * 2
    # one generate call for the whole batch; identical contexts are generated once: both responses have
    # the same prompt and first two episodes, so prompt + V_0/V_1/V_2 prefixes are 3 contexts, 4 rows each
    assert len(model.calls) == 1 and model.calls[0] == 3 * 4


def test_greedy_continuation_and_prefix_budget(batch_factory: Callable[..., Batch]) -> None:
    tok = build_tokenizer()
    values, model = run(
        batch_factory(tok, [("q", RESPONSE, "7")]), tok, value_estimator="greedy_continuation"
    )
    # one greedy continuation (" ok") per prefix: V in {0, 1}. The batch's log-probs (0) say every token
    # was the greedy choice, so V_1 and V_2 are planned as shares of V_0's continuation; " ok" is not
    # the response's next episode, so they are continued on their own in a second call
    assert values == [[1.0, 1.0, 0.0, 0.0]] and model.calls == [1, 2]
    # mc_prefixes=2 estimates V_0 and V_3 only; V_1, V_2 repeat V_0 (so U_1 = U_2 = 0, U_3 carries it all)
    values, _ = run(
        batch_factory(tok, [("q", RESPONSE, "7")]), tok, value_estimator="monte_carlo", mc_prefixes=2
    )  # (a prompt with one response samples V_0 even with mc_v0=group)
    assert values == [[0.75, 0.75, 0.75, 0.0]]


def test_monte_carlo_v0_from_the_group(batch_factory: Callable[..., Batch]) -> None:
    tok = build_tokenizer()
    right_a = "So 3 + 4 = 7. So 7 + 1 = 9. So ok"  # rewards: 1 (ends in "ok", no "= 8")
    right_c = "So 3 + 4 = 7. So 7 + 2 = 9. So ok"  # 1
    batch = batch_factory(tok, [("q", right_a, "7"), ("q", RESPONSE, "7"), ("q", right_c, "7")])
    values, model = run(batch, tok, value_estimator="monte_carlo", mc_samples=4, mc_v0="group")
    # V_0 = mean reward of the two other responses: a: (0 + 1) / 2, b: (1 + 1) / 2, c: (1 + 0) / 2.
    # V_1 (prefix "So 3 + 4 = 7. ", shared by all three): 3 of 4 continuations "ok": 0.75.
    # V_2: a and c hold no "= 8": 0.75; b holds "= 8": 0. V_3: each complete response's own reward.
    assert values == [[0.5, 0.75, 0.75, 1.0], [1.0, 0.75, 0.0, 0.0], [0.5, 0.75, 0.75, 1.0]]
    # no continuation for the bare prompt: contexts are V_1 (shared) and the three V_2 prefixes
    assert len(model.calls) == 1 and model.calls[0] == 4 * 4


def test_every_text_of_a_batch_goes_to_the_verifier_in_one_call(batch_factory: Callable[..., Batch]) -> None:
    # One submission per batch (the reward agent runs it in parallel): even with generation chunked to
    # one context per call, continuations and whole responses of every row are scored together.
    tok = build_tokenizer()
    calls: list[int] = []

    def verifier(samples: Any, texts: Any) -> list[float]:
        calls.append(len(texts))
        return score(samples, texts)

    batch = batch_factory(tok, [("q", RESPONSE, "7"), ("r", RESPONSE, "7")])
    got = compute_prefix_values(
        ScriptedPolicy(tok),
        tok,
        batch,
        ProcessConfig(value_estimator="monte_carlo", mc_v0="group", max_tokens_per_forward=1),
        score_fn=verifier,
    )
    assert got.values == [[0.75, 0.75, 0.0, 0.0]] * 2
    # 2 rows x 3 sampled prefixes x 4 continuations, and the 2 complete responses once each
    assert calls == [2 * 3 * 4 + 2]


def test_prefix_indices() -> None:
    assert mc_prefix_indices(5, 0) == [0, 1, 2, 3, 4]
    assert mc_prefix_indices(5, 3) == [0, 2, 4]
    assert mc_prefix_indices(7, 3) == [0, 3, 6]
    assert mc_prefix_indices(3, 5) == [0, 1, 2]
    assert mc_prefix_indices(4, 1) == [3]


def test_capabilities_are_metadata() -> None:
    assert (
        VALUE_ESTIMATORS.get("monte_carlo").needs_verifier and VALUE_ESTIMATORS.get("monte_carlo").generates
    )
    assert VALUE_ESTIMATORS.get("greedy_continuation").needs_verifier
    fa = VALUE_ESTIMATORS.get("forced_answer_logprob")
    assert not fa.needs_verifier and not fa.generates


@pytest.mark.parametrize("name", ["monte_carlo", "greedy_continuation"])
def test_continuation_needs_a_verifier(name: str, batch_factory: Callable[..., Batch]) -> None:
    from stepcredit.errors import ConfigError

    tok = build_tokenizer()
    with pytest.raises(ConfigError, match="score_fn"):
        compute_prefix_values(
            ScriptedPolicy(tok),
            tok,
            batch_factory(tok, [("q", RESPONSE, "7")]),
            ProcessConfig(value_estimator=name),
        )


def test_chunked_generation_gives_the_same_values(batch_factory: Callable[..., Batch]) -> None:
    tok = build_tokenizer()
    rows = [("q", RESPONSE, "7"), ("r", RESPONSE, "7")]
    whole, model = run(batch_factory(tok, rows), tok, value_estimator="monte_carlo")
    # a budget of one context per call: 6 contexts (2 prompts x V_0..V_2), 6 calls, the same values
    small, chunked = run(
        batch_factory(tok, rows), tok, value_estimator="monte_carlo", max_tokens_per_forward=1
    )
    assert len(model.calls) == 1 and len(chunked.calls) == 6
    assert small == whole == [[0.75, 0.75, 0.0, 0.0]] * 2


def test_the_probe_samples_v0_even_with_mc_v0_group() -> None:
    from stepcredit.process.probe import ProbeCase
    from stepcredit.process.values import PrefixRequest
    from stepcredit.trainer.probe import run_probe

    # a clean trace (reward 1) and its corrupted twin (reward 0) share a prompt, but are not samples of
    # the policy: V_0 must come from continuations (3 of 4 say "ok": 0.75), not from the twin's reward
    tok = build_tokenizer()
    sample = Sample(prompt=({"role": "user", "content": "q"},), ground_truth="7")
    prompt = tok("q")["input_ids"]

    def req(text: str) -> PrefixRequest:
        ids = tok(text)["input_ids"]
        return PrefixRequest(sample, prompt, ids, [0, len(ids)], "7", complete=True)

    case = ProbeCase(req("So 3 + 4 = 7. So ok"), req("So 3 + 4 = 8. So ok"), 0, 0)
    out = run_probe(
        ScriptedPolicy(tok), tok, [case], ProcessConfig(mc_samples=4, mc_v0="group"), ["monte_carlo"],
        score_fn=score,
    )  # fmt: skip
    mc = out.estimators["monte_carlo"]
    assert mc.all.v_before == 0.75 and mc.all.v_after == 0.0  # corrupted: V_0 sampled, V_1 its reward 0
    assert out.n_solvable == 1 and mc.solvable is not None and mc.solvable.argmin == 1.0


def test_greedy_continuation_equals_a_greedy_decode_of_a_real_model(
    model_factory: Callable[..., tuple[Any, Any]], batch_factory: Callable[..., Batch]
) -> None:
    # A real (random, sharpened) 2-layer model, two prompts of different lengths so the batched
    # generate left-pads. Reference: for every episode end, an unbatched argmax decode written out by
    # hand (no cache, no padding) from prompt + prefix, stopped at eos or after mc_max_new_tokens; the
    # verifier sees prefix + continuation. The complete response's last prefix is the whole response,
    # scored as it is. The estimator must score exactly those texts, in one verifier call, and return
    # their scores as the values.
    model, tok = model_factory("llama", "eager", seed=3)
    rows = [("q", RESPONSE, "7"), ("a longer prompt", "So 2 + 2 = 4. So 4 + 4 = 8.", "8")]
    batch = batch_factory(tok, rows)
    texts_seen: list[list[str]] = []

    def verifier(samples: Any, texts: Any) -> list[float]:
        texts_seen.append(list(texts))
        return [float(sum(map(ord, t)) % 7) for t in texts]  # any deterministic function of the text

    cfg = ProcessConfig(value_estimator="greedy_continuation", mc_max_new_tokens=6)
    got = compute_prefix_values(model, tok, batch, cfg, score_fn=verifier)

    def greedy_text(prompt_ids: list[int], head: list[int]) -> str:
        ids = list(prompt_ids) + list(head)
        cont: list[int] = []
        with torch.no_grad():
            for _ in range(cfg.mc_max_new_tokens):
                nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
                if nxt == tok.eos_token_id:
                    break
                ids.append(nxt)
                cont.append(nxt)
        return tok.decode(list(head) + cont, skip_special_tokens=True)

    want_values, want_texts = [], set()
    for b in range(len(batch)):
        prompt = batch.prompt_ids_BP[b][batch.prompt_mask_BP[b]].tolist()
        resp = batch.response_ids_BT[b][batch.response_mask_BT[b]].tolist()
        content = resp[:-1]  # without the eos
        lens = [0] + [min(e + 1, len(content)) for e in got.episode_ends[b]]
        row = []
        for n in lens:
            text = (
                tok.decode(resp, skip_special_tokens=True)
                if n >= len(content)
                else greedy_text(prompt, resp[:n])
            )
            want_texts.add(text)
            row.append(float(sum(map(ord, text)) % 7))
        want_values.append(row)
    assert len(texts_seen) == 1 and set(texts_seen[0]) == want_texts
    assert got.values == want_values
    assert all(len(v) == len(e) + 1 >= 3 for v, e in zip(got.values, got.episode_ends, strict=True))


def test_greedy_continuation_trains_through_the_cli_and_composes(tmp_path: Any) -> None:
    # process.value_estimator=greedy_continuation at every episode end (mc_prefixes=0) in training, with
    # the settings it composes with: blame credit (its values are chances of success), the step cost on
    # the outcome, and grpo_vineppo (its last value is the reward: terminal_is_reward)
    import json

    from stepcredit.cli.main import main

    out = tmp_path / "run"
    argv = ["train", "--preset", "smoke", "--out", str(out), "trainer.steps=2", "trainer.threads=1"]
    argv += ["trainer.val_every=0", "trainer.save_every=0", "sft.steps=2", "rollout.max_new_tokens=24"]
    argv += ["reward.agent.backend=thread"]  # as tests/conftest.py's TINY_TRAIN: no worker pool per run
    argv += ["process.enabled=true", "process.value_estimator=greedy_continuation", "process.mc_prefixes=0"]
    argv += ["process.mc_max_new_tokens=8", "process.min_episode_tokens=1", "process.credit=blame"]
    argv += ["process.step_cost=0.05", "process.step_cost_as=outcome", "algorithm.advantage=grpo_vineppo"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and "time/process_s" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["time/process_s"] > 0 and r["process/unscored_rows"] == 0
        assert r["process/episodes_per_response"] >= 1  # a credit at every episode end
        # blame credits of {0, 1} values with V_0 := 1 lie in [-1, 1]
        assert 0.0 <= r["process/u_abs_mean"] <= 1.0
