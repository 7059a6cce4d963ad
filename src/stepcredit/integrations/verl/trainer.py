"""``trainer.v1.trainer_mode=stepcredit_sync``: verl's synchronous v1 trainer with stepcredit's credit.

Written for GPUs; run end to end on CPU by the test suite through
:mod:`stepcredit.integrations.verl.cpu` (tests/integrations/test_verl_cpu_step.py: one real verl step
with process rewards, the ``stepcredit`` reward manager and ``stepcredit_grpo_process``).

Why a trainer and not a reward manager or an agent loop: V(prefix) must come from the *current*
policy, i.e. the actor's weights. verl 0.9's reward loop runs in separate reward workers that see
only token ids and a rule or a reward model, never the actor; the agent loop talks to the inference
servers, which cannot return the log-probs of an arbitrary continuation. Only the trainer holds the
actor worker group, whose batched ``compute_log_prob`` is what the probes need. And verl's advantage
stage reads one tensor (``token_level_rewards``), so the process channel must be handed to the
estimator by whoever calls it: the trainer's ``_compute_advantage``.

One step of ``stepcredit_sync`` = verl's ``sync`` step (rollout, reward loop, old/ref log-probs,
values) with ``_compute_advantage`` replaced by, in order:

1. read the outcome (``rm_scores``) and the typed reward results (``reward_extra_info`` of the
   ``stepcredit`` reward manager); apply stepcredit's failure policy -> ``valid`` per response;
2. if ``stepcredit.process.enabled``: episodes and value probes (:func:`plan_probes`), V(prefix) by
   the actor's ``compute_log_prob`` on the probes, the process channel (:func:`process_channel`);
3. verl's in-reward KL penalty and rollout correction, unchanged;
4. the ``stepcredit_*`` estimator with both channels, ``valid`` and the critic's values.

Cost: one probe per episode end plus one (V_0) per response, each as long as prompt + prefix + force
prompt + answer: about (S + 1) forward passes of a response's length. stepcredit's ``packed`` strategy
(one pass over the response plus the suffixes, under a block attention mask) is not available here:
verl's actor builds its own causal or varlen attention from ``input_ids``/``position_ids`` and takes no
per-sample attention mask. Logged per step: ``timing_s/stepcredit_probes`` (next to verl's
``timing_s/old_log_prob``), ``stepcredit/probe_tokens_per_response_token``,
``stepcredit/probe_tokens_per_sequence_token`` and ``stepcredit/packed_tokens_per_sequence_token`` (what
a packed layout would process, for comparison). Keep ``stepcredit.process.max_episode_tokens`` large
enough that S stays small (e.g. 4-12). The probes are padded to a multiple of dp x
``log_prob_micro_batch_size_per_gpu`` (dp alone with dynamic batch size), as verl's micro-batching needs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_from_nested, response_to_nested

from stepcredit.integrations.verl.config import get, stepcredit_config, to_plain
from stepcredit.integrations.verl.estimators import PREFIX, group_ids, verl_advantages
from stepcredit.integrations.verl.process import (
    ValueProbe,
    check_process_config,
    outcome_less_step_cost,
    plan_probes,
    probe_batch_size,
    probe_cost,
    values_from_logprobs,
)
from stepcredit.integrations.verl.reward_manager import result_of, reward_config
from stepcredit.process import process_channel
from stepcredit.reward import apply_failure_policy

logger = logging.getLogger(__name__)

NAME = "stepcredit_sync"
PROBE_PARTITION = "stepcredit_value_probes"
"""TransferQueue partition of the value probes (cleared after each step)."""


def _rows(x: Any) -> list[Any]:
    """A TransferQueue field as a list of per-row items (nested tensor, NonTensorStack, list...)."""
    if isinstance(x, torch.Tensor) and x.is_nested:
        return list(x.unbind())
    if isinstance(x, torch.Tensor):
        return list(x)
    tolist = getattr(x, "tolist", None)
    return list(tolist()) if callable(tolist) else list(x)


def _nested(xs: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(xs, layout=torch.jagged)


def _read_batch(batch: KVBatchMeta) -> tuple[DataProto, Any, Any]:
    """The fields the advantage stage reads from verl's transfer queue: the padded tensors (with the
    outcome as ``token_level_scores`` and the group ids as ``uid``), the rows' side fields, and the
    nested response mask the results are written back with."""
    fields = [
        "uid",
        "response_mask",
        "rm_scores",
        "rollout_log_probs",
        "old_log_probs",
        "ref_log_prob",
        "values",
    ]
    raw = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    data = DataProto(batch=raw.to_padded_tensor())
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    side = tq.kv_batch_get(
        keys=batch.keys,
        partition_id=batch.partition_id,
        select_fields=["prompts", "responses", "reward_model", "extra_fields"],
    )
    return data, side, raw["response_mask"]


@register_trainer(NAME)
class StepCreditTrainer(PPOTrainerSync):  # type: ignore[misc]
    """verl's ``sync`` trainer whose advantage stage is stepcredit's (see the module docstring)."""

    def __init__(self, config: Any) -> None:
        # refused before verl builds its workers: a bad setting costs one line, not a cluster start
        sc = stepcredit_config(config)
        check_process_config(sc, str(config.algorithm.adv_estimator), config.algorithm)
        super().__init__(config)
        self.sc = sc
        self.sc_reward = reward_config(config)

    # ------------------------------------------------------------------------------ advantage
    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        est = str(self.config.algorithm.adv_estimator)
        if not est.startswith(PREFIX):  # verl's own estimators: verl's own stage
            return super()._compute_advantage(batch, metrics)
        algo = self.config.algorithm
        data, side, response_mask_nested = _read_batch(batch)
        uids = data.non_tensor_batch["uid"]
        padding = [bool(t.get("is_padding", False)) for t in batch.tags]

        # 1. typed rewards -> failure policy (responses that could not be scored leave the loss)
        results, valid_B = self._valid_responses(side, data, uids, padding)
        metrics["stepcredit/reward_valid_frac"] = float(valid_B.float().mean())

        # 2. the process channel from V(prefix) under the current actor; with step_cost_as=outcome the
        # outcome pays c x episodes on real verdicts before the estimator's group normalisation, as in
        # stepcredit's trainer (trainer/update.py:reward_channels)
        process_BT = process_mask_BT = None
        if self.sc.process.enabled:
            process_BT, process_mask_BT, ends = self._process_channel(
                side, data.batch["response_mask"], padding, metrics
            )
            verdict_B = torch.tensor([r.ok for r in results], dtype=torch.bool) & ~torch.tensor(padding)
            data.batch["token_level_scores"] = outcome_less_step_cost(
                data.batch["token_level_scores"],
                data.batch["response_mask"],
                ends,
                verdict_B,
                self.sc.process,
            )

        # 3. verl's in-reward KL penalty and rollout correction, as in verl's own stage
        data, rollout_correction = self._verl_reward_stage(data, metrics)

        # 4. stepcredit's estimator with both channels
        adv, ret = verl_advantages(
            est[len(PREFIX) :],
            data.batch["token_level_rewards"],
            data.batch["response_mask"],
            index=uids,
            config=algo,
            process_rewards=process_BT,
            process_mask=process_mask_BT,
            valid=valid_B,
            values=data.batch.get("values", None),
        )
        data.batch["advantages"], data.batch["returns"] = adv, ret

        out_fields = ["advantages", "returns"]
        if algo.use_kl_in_reward:
            out_fields.append("token_level_rewards")
        if rollout_correction:
            out_fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                out_fields.append("rollout_is_weights")
        output = {f: response_to_nested(data.batch[f], response_mask_nested) for f in out_fields}
        return tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(output, batch_size=len(batch))
        )

    def _valid_responses(
        self, side: Any, data: DataProto, uids: np.ndarray, padding: list[bool]
    ) -> tuple[list[Any], torch.Tensor]:
        """The typed reward result of each response (from the ``stepcredit`` reward manager's
        ``reward_extra_info``) and which responses stay in the loss after stepcredit's failure policy."""
        group_B = group_ids(uids, len(uids))
        results = []
        for extra, score in zip(
            _rows(side["extra_fields"]), data.batch["rm_scores"].sum(-1).tolist(), strict=True
        ):
            info = (extra or {}).get("reward_extra_info", {}) if isinstance(extra, dict) else {}
            results.append(result_of(info, score))
        _, valid_B, _ = apply_failure_policy(results, group_B, self.sc_reward)
        valid_B &= ~torch.tensor(padding)
        return results, valid_B

    def _verl_reward_stage(self, data: DataProto, metrics: dict) -> tuple[DataProto, bool]:
        """verl's in-reward KL penalty (or the scores as they are) and its rollout correction, as verl's
        own advantage stage applies them; whether the rollout correction ran."""
        algo = self.config.algorithm
        if algo.use_kl_in_reward:
            data, kl_metrics = apply_kl_penalty(
                data, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=algo.kl_penalty
            )
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        rc = algo.get("rollout_correction", None)
        bypass = rc and rc.get("bypass_mode", False)
        rollout_correction = rc is not None and "rollout_log_probs" in data.batch and not bypass
        if rollout_correction:
            data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rc)
            metrics.update(is_metrics)
        return data, rollout_correction

    # ------------------------------------------------------------------------ process rewards
    def _process_channel(
        self, side: Any, response_mask_BT: torch.Tensor, padding: list[bool], metrics: dict
    ) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
        """(process_BT, process_mask_BT, episode ends per row: [] for padding and rows without a gold
        answer)."""
        prompts = [p.tolist() for p in _rows(side["prompts"])]
        responses = [r.tolist() for r in _rows(side["responses"])]
        answers = [str((to_plain(rm) or {}).get("ground_truth", "")) for rm in _rows(side["reward_model"])]
        live = [b for b in range(len(responses)) if not padding[b] and answers[b]]
        ends_live, probes = plan_probes(
            [prompts[b] for b in live],
            [responses[b] for b in live],
            [answers[b] for b in live],
            self.tokenizer,
            self.sc.process,
        )
        start = time.perf_counter()
        values_live = values_from_logprobs(probes, self._answer_logprobs(probes), len(live))
        # the probes' cost next to verl's own log-prob pass (timing_s/old_log_prob), in time and tokens
        metrics["timing_s/stepcredit_probes"] = time.perf_counter() - start
        cost = probe_cost([prompts[b] for b in live], [responses[b] for b in live], probes)
        if cost["response"]:
            metrics["stepcredit/probe_tokens_per_response_token"] = cost["probe"] / cost["response"]
            metrics["stepcredit/probe_tokens_per_sequence_token"] = cost["probe"] / cost["sequence"]
            metrics["stepcredit/packed_tokens_per_sequence_token"] = cost["packed"] / cost["sequence"]
        ends: list[list[int]] = [[] for _ in responses]
        values: list[list[float]] = [[0.0] for _ in responses]
        for j, b in enumerate(live):
            ends[b], values[b] = ends_live[j], values_live[j]
        process_BT, mask_BT = process_channel(ends, values, response_mask_BT, self.sc.process)
        metrics["stepcredit/episodes_per_response"] = float(np.mean([len(e) for e in ends_live] or [0]))
        metrics["stepcredit/value_probes"] = len(probes)
        if bool(mask_BT.any()):
            metrics["stepcredit/utility_mean"] = float(process_BT[mask_BT].mean())
            metrics["stepcredit/utility_abs_mean"] = float(process_BT[mask_BT].abs().mean())
        return process_BT, mask_BT, ends

    def _answer_logprobs(self, probes: list[ValueProbe]) -> list[torch.Tensor]:
        """Log-probs of each probe's answer tokens under the current actor (one batched call)."""
        if not probes:
            return []
        wg = self.actor_rollout_wg
        if "actor" not in wg._dispatch_info:
            wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
        dp = max(wg._dispatch_info["actor"]) + 1
        rollout = get(get(self.config, "actor_rollout_ref"), "rollout")
        size = probe_batch_size(
            len(probes),
            dp=dp,
            micro_batch=get(rollout, "log_prob_micro_batch_size_per_gpu"),
            dynamic=bool(get(rollout, "log_prob_use_dynamic_bsz", False)),
        )
        padded = probes + [probes[-1]] * (size - len(probes))
        step = int(getattr(self, "global_steps", 0))
        keys = [f"sc{step}_{i}" for i in range(len(padded))]
        prompts = [torch.tensor(p.context_ids, dtype=torch.int64) for p in padded]
        answers = [torch.tensor(p.answer_ids, dtype=torch.int64) for p in padded]
        input_ids = [torch.cat([p, a]) for p, a in zip(prompts, answers, strict=True)]
        fields = TensorDict(
            {
                "prompts": _nested(prompts),
                "responses": _nested(answers),
                "response_mask": _nested([torch.ones_like(a) for a in answers]),
                "loss_mask": _nested([torch.ones_like(a) for a in answers]),
                "input_ids": _nested(input_ids),
                "position_ids": _nested([torch.arange(len(x)) for x in input_ids]),
            },
            batch_size=len(padded),
        )
        tags = [
            {"status": "success", "prompt_len": len(p), "response_len": len(a), "seq_len": len(p) + len(a)}
            for p, a in zip(prompts, answers, strict=True)
        ]
        tq.kv_batch_put(keys=keys, partition_id=PROBE_PARTITION, fields=fields, tags=tags)
        try:
            meta = KVBatchMeta(
                keys=keys,
                tags=tags,
                partition_id=PROBE_PARTITION,
                # V(prefix) is the policy's own belief: temperature 1, as stepcredit's trainer
                extra_info={"calculate_entropy": False, "compute_loss": False, "temperature": 1.0},
            )
            self.actor_rollout_wg.compute_log_prob(meta)
            got = tq.kv_batch_get(
                keys=keys, partition_id=PROBE_PARTITION, select_fields=["log_probs", "response_mask"]
            )
            answer_logp = response_from_nested(got["log_probs"], got["response_mask"])
            return list(answer_logp.unbind())[: len(probes)]
        finally:
            tq.kv_clear(keys=keys, partition_id=PROBE_PARTITION)
