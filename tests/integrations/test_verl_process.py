"""Dense process rewards on verl's tensors against stepcredit's own trainer path, on the same inputs.

stepcredit's path: compute_prefix_values -> reward_channels -> compute_advantages.
The plugin's path (what the stepcredit_sync trainer does around the actor's compute_log_prob):
plan_probes -> log-probs of each probe's answer tokens (here a plain forward of the same model, as the
actor computes them: temperature 1, logits at the answer positions) -> values_from_logprobs ->
process_channel -> verl_advantages, with the outcome and the failure mask as they come back from the
reward manager's reward_extra_info.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from stepcredit.advantages import AdvantageInputs, compute_advantages
from stepcredit.config import TinyModelConfig, from_dict
from stepcredit.integrations.verl.estimators import verl_advantages
from stepcredit.integrations.verl.process import ValueProbe, plan_probes, values_from_logprobs
from stepcredit.integrations.verl.reward_manager import result_of, reward_output
from stepcredit.models import build_tiny
from stepcredit.process import compute_prefix_values, process_channel
from stepcredit.reward import apply_failure_policy, with_failure_policy
from stepcredit.trainer.update import reward_channels
from stepcredit.types import Batch, RewardResult, Sample, Status

pytestmark = pytest.mark.verl  # runs in .venv-verl (make test)

ROWS = [  # (prompt, response, gold answer); two prompts, two responses each
    ("What is 3 + 4?", "First, add 3 and 4. So we get 7. Therefore the answer is 7.", "7"),
    ("What is 3 + 4?", "Hmm, 3 + 4 is 8. But wait, I need to check. So it is 8.", "7"),
    ("What is 10 - 7?", "Let me subtract. 10 - 7 = 3. Finally, the answer: 3", "3"),
    ("What is 10 - 7?", "Actually, I think it is 2.", "3"),
]
RESULTS = [
    RewardResult(1.0, source="math"),
    RewardResult(0.0, source="math"),
    RewardResult.failure(Status.ERROR, "verifier crashed"),
    RewardResult(0.0, status=Status.UNPARSEABLE, source="math"),
]


@pytest.fixture(scope="module")
def model_tok() -> tuple[Any, Any]:
    model, tok = build_tiny(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64), seed=0
    )
    # random init gives near-uniform logits (every V equal); larger weights make the values differ
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.eval(), tok


def _ids(tok: Any) -> tuple[list[list[int]], list[list[int]]]:
    prompts = [
        tok(
            tok.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )["input_ids"]
        for p, _, _ in ROWS
    ]
    responses = [[*tok(r, add_special_tokens=False)["input_ids"], tok.eos_token_id] for _, r, _ in ROWS]
    return prompts, responses


def _stepcredit_batch(prompts: list[list[int]], responses: list[list[int]]) -> Batch:
    B, P, T = len(ROWS), max(map(len, prompts)), max(map(len, responses))
    prompt_BP, pmask_BP = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, P, dtype=torch.bool)
    resp_BT, rmask_BT = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.bool)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        prompt_BP[b, P - len(p) :], pmask_BP[b, P - len(p) :] = torch.tensor(p), True
        resp_BT[b, : len(r)], rmask_BT[b, : len(r)] = torch.tensor(r), True
    return Batch(
        samples=[Sample(prompt=({"role": "user", "content": p},), ground_truth=a) for p, _, a in ROWS],
        group_B=torch.tensor([0, 0, 1, 1]),
        prompt_ids_BP=prompt_BP,
        prompt_mask_BP=pmask_BP,
        response_ids_BT=resp_BT,
        response_mask_BT=rmask_BT,
        behaviour_logp_BT=torch.zeros(B, T),
        texts=[r for _, r, _ in ROWS],
        truncated_B=torch.zeros(B, dtype=torch.bool),
        rewards=[
            RewardResult(r.score, r.status, r.extracted, dict(r.info), source=r.source) for r in RESULTS
        ],
    )


def _trainer_advantages(
    model: Any, tok: Any, cfg: Any, prompts: list[list[int]], responses: list[list[int]]
) -> tuple[Batch, Any, Any]:
    """stepcredit's own trainer path: values in rollout, reward channels, then the estimator."""
    batch = _stepcredit_batch(prompts, responses)
    got = compute_prefix_values(model, tok, batch, cfg.process)
    batch = replace(batch, episode_ends=got.episode_ends, prefix_values=got.values)
    batch, ch = reward_channels(with_failure_policy(batch, cfg.reward), cfg)
    want = compute_advantages(
        cfg.algorithm,
        AdvantageInputs(
            outcome_BT=ch.outcome_BT,
            mask_BT=batch.response_mask_BT,
            group_B=batch.group_B,
            valid_B=ch.valid_B,
            process_BT=ch.process_BT,
            process_mask_BT=ch.process_mask_BT,
        ),
    )
    return batch, ch, want


def _actor_answer_logprobs(model: Any, probes: list[ValueProbe]) -> list[torch.Tensor]:
    # What verl's actor compute_log_prob returns for a probe's "response": log p of each answer token.
    out = []
    with torch.no_grad():
        for p in probes:
            ids = torch.tensor([p.context_ids + p.answer_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            n = len(p.context_ids)
            out.append(logp[n - 1 : -1].gather(-1, torch.tensor(p.answer_ids)[:, None])[:, 0])
    return out


@pytest.mark.parametrize("last_episode", ["utility", "zero"])
def test_process_channel_and_advantages_equal_stepcredit_trainer(model_tok: Any, last_episode: str) -> None:
    model, tok = model_tok
    cfg = from_dict(
        {
            "process": {"enabled": True, "strategy": "packed", "last_episode": last_episode, "clip": 0.5},
            "algorithm": {"advantage": "grpo_process", "process_weight": 0.5},
            "reward": {"failure_policy": "mask"},
        }
    )
    prompts, responses = _ids(tok)

    # stepcredit's own trainer path
    batch, ch, want = _trainer_advantages(model, tok, cfg, prompts, responses)
    assert ch.process_BT is not None and ch.process_mask_BT is not None

    # the plugin's path on verl's tensors
    answers = [a for _, _, a in ROWS]
    ends, probes = plan_probes(prompts, responses, answers, tok, cfg.process)
    assert ends == batch.episode_ends and [len(e) >= 2 for e in ends] == [True, True, True, False]
    values = values_from_logprobs(probes, _actor_answer_logprobs(model, probes), len(ROWS))
    assert batch.prefix_values is not None
    for v, w in zip(values, batch.prefix_values, strict=True):
        np.testing.assert_allclose(v, w, atol=2e-5)
    response_mask = batch.response_mask_BT.float()  # verl's masks are numeric
    process_BT, process_mask_BT = process_channel(ends, values, response_mask, cfg.process)
    torch.testing.assert_close(process_mask_BT, ch.process_mask_BT)
    torch.testing.assert_close(process_BT, ch.process_BT, atol=5e-5, rtol=0)

    # outcome and failure mask as they travel through verl: reward_score + reward_extra_info
    outs = [reward_output(r, cfg.reward) for r in RESULTS]
    rm_scores = torch.zeros_like(response_mask)
    lens = response_mask.sum(1).long()
    rm_scores[torch.arange(len(ROWS)), lens - 1] = torch.tensor([o["reward_score"] for o in outs])
    uids = np.array(["p0", "p0", "p1", "p1"], dtype=object)
    results = [result_of(o["reward_extra_info"], o["reward_score"]) for o in outs]
    _, valid_B, _ = apply_failure_policy(results, torch.tensor([0, 0, 1, 1]), cfg.reward)
    torch.testing.assert_close(valid_B, ch.valid_B)
    adv, ret = verl_advantages(
        "grpo_process",
        rm_scores,
        response_mask,
        index=uids,
        config={"stepcredit": {"process_weight": 0.5}},
        process_rewards=process_BT,
        process_mask=process_mask_BT,
        valid=valid_B,
    )
    torch.testing.assert_close(adv, want.adv_BT, atol=1e-4, rtol=0)
    torch.testing.assert_close(ret, want.ret_BT, atol=1e-4, rtol=0)
    assert bool((adv[~valid_B] == 0).all())  # the response whose reward failed gets nothing


def test_padding_rows_and_bad_inputs() -> None:
    cfg = from_dict({"process": {"enabled": True}}).process
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]])
    p, m = process_channel([[0, 2], []], [[-2.0, -1.5, -1.0], [0.0]], mask, cfg)
    assert p.tolist() == [[0.5, 0.0, 0.5, 0.0], [0.0] * 4] and m.tolist()[1] == [False] * 4
    with pytest.raises(ValueError, match="need 3 values"):
        process_channel([[0, 2], []], [[-2.0, -1.0], [0.0]], mask, cfg)
    probe = ValueProbe(0, 0, [1, 2], [3, 4])
    with pytest.raises(ValueError, match="2 tokens"):
        values_from_logprobs([probe], [torch.zeros(3)], 1)


class FakeTQ:
    """TransferQueue's kv_* calls on a dict: tensors come back nested (jagged), the rest as NonTensorStack."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: Any = None) -> Any:
        from transfer_queue import KVBatchMeta

        for name in list(fields.keys()):
            v = fields.get(name)
            items = list(v.unbind()) if isinstance(v, torch.Tensor) else v.tolist()
            for k, item in zip(keys, items, strict=True):
                self.rows.setdefault((partition_id, k), {})[name] = item
        return KVBatchMeta(keys=keys, tags=tags or [{} for _ in keys], partition_id=partition_id)

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str]) -> Any:
        from tensordict import NonTensorStack, TensorDict

        rows = [self.rows[(partition_id, k)] for k in keys]
        out = {}
        for f in select_fields:
            if f not in rows[0]:
                continue  # e.g. values without a critic: absent, as verl expects
            vals = [r[f] for r in rows]
            if isinstance(vals[0], torch.Tensor):
                out[f] = torch.nested.as_nested_tensor(vals, layout=torch.jagged)
            else:
                out[f] = NonTensorStack(*vals)
        return TensorDict(out, batch_size=[len(keys)])

    def kv_clear(self, keys: list[str], partition_id: str) -> None:
        for k in keys:
            del self.rows[(partition_id, k)]


class FakeActor:
    """The actor worker group's compute_log_prob: log p(token t+1 | ..t) per position of input_ids."""

    def __init__(self, model: Any, store: FakeTQ) -> None:
        self.model, self.store, self._dispatch_info = model, store, {"actor": [0, 1]}  # dp = 2
        self.calls = 0

    def compute_log_prob(self, meta: Any) -> Any:
        assert meta.extra_info["temperature"] == 1.0 and len(meta.keys) % 2 == 0
        self.calls += 1
        for k in meta.keys:
            row = self.store.rows[(meta.partition_id, k)]
            ids = row["input_ids"]
            with torch.no_grad():
                logp = torch.log_softmax(self.model(input_ids=ids[None]).logits[0].float(), -1)
            lp = logp[:-1].gather(-1, ids[1:, None])[:, 0]
            row["log_probs"] = torch.cat([lp, torch.zeros(1)])
        return meta


@pytest.mark.parametrize("step_cost", [{}, {"step_cost": 0.25, "step_cost_as": "outcome"}])
def test_stepcredit_sync_advantage_stage_on_fake_transfer_queue(
    model_tok: Any, monkeypatch: Any, step_cost: dict[str, Any]
) -> None:
    # The GPU-only glue of the stepcredit_sync trainer on CPU: TransferQueue and the actor worker group
    # replaced by fakes; the advantages it writes back must equal stepcredit's own trainer path (with
    # process.step_cost_as=outcome too: the outcome pays c x episodes before the group normalisation).
    from omegaconf import OmegaConf
    from transfer_queue import KVBatchMeta

    import stepcredit.integrations.verl.trainer as trainer_mod

    model, tok = model_tok
    sc = {
        "process": {"enabled": True, "strategy": "packed", "clip": 0.5, **step_cost},
        "reward": {"failure_policy": "mask"},
    }
    cfg = from_dict({**sc, "algorithm": {"advantage": "grpo_process", "process_weight": 0.5}})
    prompts, responses = _ids(tok)
    batch, _ch, want = _trainer_advantages(model, tok, cfg, prompts, responses)

    store = FakeTQ()
    monkeypatch.setattr(trainer_mod, "tq", store)
    keys = [f"p{b // 2}_{b % 2}_0" for b in range(len(ROWS))]
    for b, k in enumerate(keys):
        out = reward_output(RESULTS[b], cfg.reward)
        rm = torch.zeros(len(responses[b]))
        rm[-1] = out["reward_score"]
        store.rows[("train", k)] = {
            "uid": f"p{b // 2}",
            "prompts": torch.tensor(prompts[b]),
            "responses": torch.tensor(responses[b]),
            "response_mask": torch.ones(len(responses[b]), dtype=torch.long),
            "rm_scores": rm,
            "reward_model": {"ground_truth": ROWS[b][2], "style": "rule"},
            "extra_fields": {"reward_extra_info": out["reward_extra_info"]},
        }
    trainer = trainer_mod.StepCreditTrainer.__new__(trainer_mod.StepCreditTrainer)
    trainer.config = OmegaConf.create(
        {
            "algorithm": {
                "adv_estimator": "stepcredit_grpo_process",
                "gamma": 1.0,
                "lam": 1.0,
                "norm_adv_by_std_in_grpo": True,
                "use_kl_in_reward": False,
                "rollout_correction": None,
                "stepcredit": {"process_weight": 0.5},
            },
            "stepcredit": sc,
        }
    )
    trainer.sc, trainer.sc_reward = cfg, cfg.reward
    trainer.tokenizer = tok
    trainer.actor_rollout_wg = FakeActor(model, store)
    trainer.global_steps = 3
    metrics: dict[str, Any] = {}
    meta = KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train")
    trainer._compute_advantage(meta, metrics)

    assert trainer.actor_rollout_wg.calls == 1  # every probe in one batched call
    assert not any(p == trainer_mod.PROBE_PARTITION for p, _ in store.rows)  # probes cleared
    for b, k in enumerate(keys):
        n = len(responses[b])
        torch.testing.assert_close(
            store.rows[("train", k)]["advantages"], want.adv_BT[b, :n], atol=1e-4, rtol=0
        )
    assert metrics["stepcredit/reward_valid_frac"] == 0.75
    assert metrics["stepcredit/value_probes"] == sum(len(e) + 1 for e in batch.episode_ends or [])


def test_the_verl_trainer_refuses_process_settings_it_cannot_serve() -> None:
    from stepcredit.errors import ConfigError
    from stepcredit.integrations.verl.trainer import check_process_config

    def sc(**process: Any) -> Any:
        return from_dict({"process": {"enabled": True, **process}})

    check_process_config(sc(), "stepcredit_grpo_process")  # forced answer + grpo_process: served
    with pytest.raises(ConfigError, match="needs a stepcredit estimator"):
        check_process_config(sc(), "grpo")
    with pytest.raises(ConfigError, match=r"stepcredit\.process\.value_estimator: monte_carlo"):
        check_process_config(sc(value_estimator="monte_carlo"), "stepcredit_grpo_process")
    # step credit in chosen groups only: which groups are all equal needs the verified outcomes
    with pytest.raises(ConfigError, match=r"stepcredit\.process\.credit_groups: mixed"):
        check_process_config(sc(credit_groups="mixed"), "stepcredit_grpo_process")
    # values from the scored group: verl's advantage stage sees no group outcomes per prefix
    with pytest.raises(ConfigError, match=r"stepcredit\.process\.value_estimator: group_prefix"):
        check_process_config(sc(value_estimator="group_prefix"), "stepcredit_grpo_process")
    # VinePPO's step advantages need continuation values, which verl's advantage stage cannot compute
    with pytest.raises(ConfigError, match=r"algorithm\.adv_estimator: stepcredit_vineppo"):
        check_process_config(sc(), "stepcredit_vineppo")
    # TreeRL's credit needs tree rollouts, which verl does not make
    with pytest.raises(ConfigError, match=r"stepcredit\.process\.treerl: .*verl does not make"):
        check_process_config(sc(treerl=True), "stepcredit_grpo_process")
