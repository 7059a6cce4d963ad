"""The value probes of ``stepcredit_sync`` fit verl's micro-batching (issue 19).

verl's actor splits a ``compute_log_prob`` batch evenly over its dp ranks, and with a fixed micro-batch
each rank's share must divide by ``log_prob_micro_batch_size_per_gpu``. The fake actor below does what
verl's worker does with the probes (the even dp split, then verl's own ``prepare_micro_batches`` with the
worker's settings), so a probe count that verl would refuse fails here as it fails in verl ("data size
must be divisible by force_group_size * micro_batch_size_per_gpu", seen with 107 probes and micro-batch 5).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.engine.utils import prepare_micro_batches

import stepcredit.integrations.verl.trainer as trainer_mod
from stepcredit.integrations.verl.process import ValueProbe, probe_batch_size, probe_cost

pytestmark = pytest.mark.verl  # runs in .venv-verl (make test)


class FakeTQ:
    """TransferQueue's kv_* calls on a dict (fields come back as nested tensors)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: Any = None) -> None:
        for name in list(fields.keys()):
            for k, item in zip(keys, fields.get(name).unbind(), strict=True):
                self.rows.setdefault((partition_id, k), {})[name] = item

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str]) -> Any:
        rows = [self.rows[(partition_id, k)] for k in keys]
        fields = {
            f: torch.nested.as_nested_tensor([r[f] for r in rows], layout=torch.jagged) for f in select_fields
        }
        return TensorDict(fields, batch_size=[len(keys)])

    def kv_clear(self, keys: list[str], partition_id: str) -> None:
        for k in keys:
            del self.rows[(partition_id, k)]


class FakeActor:
    """verl's actor worker group: even dp split, then verl's micro-batching on each rank.

    log p of token t is -t/100 (a function of the token alone), so every probe's answer log-probs are
    known in advance and a shuffled, dropped or padded row shows."""

    def __init__(self, store: FakeTQ, *, dp: int, micro: int | None, dynamic: bool) -> None:
        self.store, self.micro, self.dynamic = store, micro, dynamic
        self._dispatch_info = {"actor": list(range(dp))}
        self.dp, self.rows_seen = dp, 0

    def compute_log_prob(self, meta: Any) -> Any:
        keys = list(meta.keys)
        assert len(keys) % self.dp == 0, "verl's dispatch splits the batch evenly over dp ranks"
        share = len(keys) // self.dp
        for r in range(self.dp):
            rank_keys = keys[r * share : (r + 1) * share]
            ids = [self.store.rows[(meta.partition_id, k)]["input_ids"] for k in rank_keys]
            data = TensorDict(
                {"input_ids": torch.nested.as_nested_tensor(ids, layout=torch.jagged)}, batch_size=[len(ids)]
            )
            # what verl's worker attaches before its engine's infer_batch (engine_workers.py, infer_batch)
            tu.assign_non_tensor(
                data,
                use_dynamic_bsz=self.dynamic,
                micro_batch_size_per_gpu=self.micro,
                max_token_len_per_gpu=64,
            )
            prepare_micro_batches(data)  # raises where verl raises
            for k, x in zip(rank_keys, ids, strict=True):
                # verl's layout: position t holds log p(token t+1 | ..t), the last position 0
                self.store.rows[(meta.partition_id, k)]["log_probs"] = torch.cat(
                    [-x[1:].float() / 100, torch.zeros(1)]
                )
        self.rows_seen += len(keys)
        return meta


def _probes(n: int) -> list[ValueProbe]:
    return [
        ValueProbe(row=i // 3, index=i % 3, context_ids=[1, 2, 3 + i % 5], answer_ids=[10 + i, 20])
        for i in range(n)
    ]


def _trainer(store: FakeTQ, *, dp: int, micro: int | None, dynamic: bool) -> Any:
    trainer = trainer_mod.StepCreditTrainer.__new__(trainer_mod.StepCreditTrainer)
    rollout = {"log_prob_micro_batch_size_per_gpu": micro, "log_prob_use_dynamic_bsz": dynamic}
    trainer.config = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}})
    trainer.actor_rollout_wg = FakeActor(store, dp=dp, micro=micro, dynamic=dynamic)
    trainer.global_steps = 1
    return trainer


@pytest.mark.parametrize(
    ("n", "dp", "micro", "dynamic"),
    [
        (107, 1, 5, False),  # the count and micro-batch of the CPU run that found the bug
        (7, 2, 3, False),  # 7 -> 8 by dp alone: 4 per rank, not a multiple of 3
        (9, 2, 4, False),
        (16, 1, 16, False),  # the GPU example's micro-batch with fewer probes than one micro-batch
        (7, 2, 3, True),  # dynamic batch size: micro-batches cut by tokens, only dp matters
        (5, 4, None, True),
    ],
)
def test_probes_fit_verl_micro_batching(
    monkeypatch: pytest.MonkeyPatch, n: int, dp: int, micro: int | None, dynamic: bool
) -> None:
    store = FakeTQ()
    monkeypatch.setattr(trainer_mod, "tq", store)
    trainer = _trainer(store, dp=dp, micro=micro, dynamic=dynamic)
    probes = _probes(n)
    got = trainer._answer_logprobs(probes)

    assert len(got) == n  # padding rows dropped, every probe answered once, in order
    for p, lp in zip(probes, got, strict=True):
        torch.testing.assert_close(lp, -torch.tensor(p.answer_ids, dtype=torch.float) / 100)
    sent = trainer.actor_rollout_wg.rows_seen
    assert sent == probe_batch_size(n, dp=dp, micro_batch=micro, dynamic=dynamic)
    assert sent - n < (dp if dynamic else dp * (micro or 1))  # no more padding than one unit
    assert not store.rows  # the probe partition is cleared


def test_probe_batch_size_by_hand() -> None:
    # unit = dp x micro without dynamic batching (2 x 3 = 6: 7 -> 12), dp alone with it (7 -> 8)
    assert probe_batch_size(7, dp=2, micro_batch=3, dynamic=False) == 12
    assert probe_batch_size(7, dp=2, micro_batch=3, dynamic=True) == 8
    assert probe_batch_size(107, dp=1, micro_batch=5, dynamic=False) == 110
    assert probe_batch_size(12, dp=2, micro_batch=3, dynamic=False) == 12
    assert probe_batch_size(0, dp=2, micro_batch=3, dynamic=False) == 0
    assert probe_batch_size(3, dp=2, micro_batch=None, dynamic=False) == 4


def test_probe_cost_by_hand() -> None:
    # row 0: prompt 3 + response 4 tokens, probes V_0 (prefix 0) and V_1 (prefix 2), force prompt 2 tokens,
    # answer 1; row 1: prompt 2 + response 2, only V_0, answer 2 tokens.
    prompts, responses = [[1, 2, 3], [4, 5]], [[6, 7, 8, 9], [10, 11]]
    probes = [
        ValueProbe(0, 0, [1, 2, 3, 90, 91], [50]),
        ValueProbe(0, 1, [1, 2, 3, 6, 7, 90, 91], [50]),
        ValueProbe(1, 0, [4, 5, 90, 91], [50, 51]),
    ]
    cost = probe_cost(prompts, responses, probes)
    # sequence (3+4)+(2+2) = 11; response 4+2 = 6; probes (5+1)+(7+1)+(4+2) = 20;
    # packed: one pass over the 11 sequence tokens + per probe force prompt and answer: (2+1)+(2+1)+(2+2) = 10
    assert cost == {"sequence": 11, "response": 6, "probe": 20, "packed": 21}
