"""Truncated importance sampling for an external rollout engine (``loss.tis_cap``), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from stepcredit.config import LossConfig
from stepcredit.losses import compute_policy_loss
from stepcredit.losses.core import truncated_is_weight


def test_weights_and_gap_by_hand() -> None:
    # trainer log-probs vs engine log-probs, one response of 3 counted tokens and 1 padding token:
    #   diff = (0, log 1.5, log 4, 9) -> ratio (1, 1.5, 4, e^9); cap 2 -> w (1, 1.5, 2, -)
    #   gap mean = (0 + log 1.5 + log 4) / 3, max = log 4 (the padding's 9 is not counted)
    logp = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    engine = logp - torch.tensor([[0.0, math.log(1.5), math.log(4.0), 9.0]])
    mask = torch.tensor([[True, True, True, False]])
    w, m = truncated_is_weight(logp_BT=logp, engine_logp_BT=engine, mask_BT=mask, cap=2.0)
    assert w[0, :3].tolist() == pytest.approx([1.0, 1.5, 2.0])
    assert float(m["engine/logp_gap_mean"]) == pytest.approx((math.log(1.5) + math.log(4.0)) / 3)
    assert float(m["engine/logp_gap_max"]) == pytest.approx(math.log(4.0))
    assert float(m["engine/tis_weight_mean"]) == pytest.approx(4.5 / 3)
    assert float(m["engine/tis_clip_frac"]) == pytest.approx(1 / 3)
    # cap 0: no correction, the gap is still reported
    w0, m0 = truncated_is_weight(logp_BT=logp, engine_logp_BT=engine, mask_BT=mask, cap=0.0)
    assert torch.equal(w0, torch.ones_like(w0))
    assert float(m0["engine/logp_gap_max"]) == pytest.approx(math.log(4.0))


def test_the_policy_loss_is_weighted_per_token() -> None:
    # ppo_clip at ratio 1 (logp = old): per-token loss -A; with the weights w = (1, 1.5, 2) the
    # token-mean loss is -(1 * 1 + 1.5 * 2 + 2 * 1) / 3 = -2, unweighted -(1 + 2 + 1) / 3 = -4/3
    old = torch.full((1, 3), -1.0)
    logp = old.clone().requires_grad_(True)
    engine = old - torch.tensor([[0.0, math.log(1.5), math.log(4.0)]])
    adv = torch.tensor([[1.0, 2.0, 1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    cfg = LossConfig(kl_coef=0.0, tis_cap=2.0)
    plain = compute_policy_loss(cfg, logp_BT=logp, old_logp_BT=old, adv_BT=adv, mask_BT=mask)
    tis = compute_policy_loss(
        cfg, logp_BT=logp, old_logp_BT=old, adv_BT=adv, mask_BT=mask, engine_logp_BT=engine
    )
    assert plain.metrics["pg_loss"] == pytest.approx(-4 / 3)
    assert tis.metrics["pg_loss"] == pytest.approx(-2.0)
    assert "engine/logp_gap_mean" in tis.metrics and "engine/logp_gap_mean" not in plain.metrics
    # the weights are constants: the gradient is w_t * (-A_t) / 3 per token
    tis.loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([-1 / 3, -1.0, -2 / 3])
