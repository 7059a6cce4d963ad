"""Policy losses, KL terms, entropy bonus, aggregation and the KL controllers (hand values)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from stepcredit.config import Config, LossConfig
from stepcredit.errors import ConfigError
from stepcredit.losses import (
    LOSSES,
    KLController,
    aggregate,
    apply_kl_penalty,
    check_config,
    compute_policy_loss,
    decoupled_ppo,
    gspo,
    kl_estimate,
    ppo_clip,
    topr,
)

NO_KL = LossConfig(kl_coef=0.0)


def batch(seed: int = 0, B: int = 5, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]
    old = -torch.rand(B, T, generator=g) * 2
    lp = (old + 0.5 * torch.randn(B, T, generator=g)).requires_grad_(True)
    adv = torch.randn(B, T, generator=g) * mask
    return lp, old, adv, mask


def test_ppo_clip_hand_values() -> None:
    # one token each, clip 0.2/0.28, dual clip c = 3:
    #  A = +1, r = 1.5: max(-1.5, -1.28) = -1.28 (clipped high)
    #  A = +1, r = 0.5: max(-0.5, -0.8) = -0.5 (unclipped: pessimistic bound)
    #  A = -1, r = 0.5: max(0.5, 0.8) = 0.8 (clipped low)
    #  A = -1, r = 5.0: max(5, 1.28) = 5, dual clip min(5, 3) = 3
    r = torch.tensor([[1.5], [0.5], [0.5], [5.0]])
    adv = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]])
    mask = torch.ones(4, 1, dtype=torch.bool)
    loss, m = ppo_clip(
        logp_BT=r.log(),
        old_logp_BT=torch.zeros(4, 1),
        adv_BT=adv,
        mask_BT=mask,
        clip_low=0.2,
        clip_high=0.28,
        dual_clip_c=3.0,
    )
    assert loss.flatten().tolist() == pytest.approx([-1.28, -0.5, 0.8, 3.0], abs=1e-6)
    assert m["clip_frac"].item() == pytest.approx(0.5)  # tokens 1 and 3
    assert m["clip_frac_lower"].item() == pytest.approx(0.25)  # token 4


def test_decoupled_ppo() -> None:
    lp, old, adv, mask = batch()
    kw = {"clip_low": 0.2, "clip_high": 0.2, "dual_clip_c": 3.0}
    a, _ = decoupled_ppo(logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=mask, prox_logp_BT=None, **kw)
    b, _ = ppo_clip(logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=mask, **kw)
    assert torch.equal(a, b)  # proximal = behaviour: plain PPO
    prox = old + 0.1
    got, _ = decoupled_ppo(logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=mask, prox_logp_BT=prox, **kw)
    surr, _ = ppo_clip(logp_BT=lp, old_logp_BT=prox, adv_BT=adv, mask_BT=mask, **kw)
    assert torch.allclose(got, surr * torch.exp(torch.tensor(0.1)), atol=1e-6)  # w = pi_prox/pi_behav
    capped, _ = decoupled_ppo(
        logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=mask, prox_logp_BT=prox, behav_weight_cap=1.05, **kw
    )
    assert torch.allclose(capped, surr * 1.05, atol=1e-6)


def test_topr_weights() -> None:
    # response 0: A > 0 -> weight 1 whatever the ratio; response 1: A < 0, sequence ratio
    # exp(0.3 - 0.5) = exp(-0.2) < 1 -> weight exp(-0.2); response 2: A < 0, ratio exp(0.4) > 1 -> 1
    lp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-3.0, -3.0], [-1.3, -0.5], [-1.2, -1.2]])
    adv = torch.tensor([[2.0, 2.0], [-1.0, -1.0], [-1.0, -1.0]])
    mask = torch.ones(3, 2, dtype=torch.bool)
    loss, _ = topr(logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=mask)
    (grad,) = torch.autograd.grad(loss.sum(), lp)
    w = torch.exp(torch.tensor(-0.2)).item()
    assert torch.allclose(grad, torch.tensor([[-2.0, -2.0], [w, w], [1.0, 1.0]]), atol=1e-6)


def test_gspo_on_policy_gradient_equals_ppo() -> None:
    lp, _, adv, mask = batch(1)
    old = lp.detach().clone()
    a, _ = gspo(logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=mask, clip_low=3e-4, clip_high=4e-4)
    b, _ = ppo_clip(logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=mask, dual_clip_c=0.0)
    (ga,) = torch.autograd.grad(aggregate(a, mask), lp)
    (gb,) = torch.autograd.grad(aggregate(b, mask), lp)
    assert torch.allclose(ga, gb, atol=1e-6)


def test_gspo_uses_sequence_ratio() -> None:
    # one response, token log-ratios (0.3, -0.1): s = exp(mean) = exp(0.1) for both tokens, A = 1,
    # clip high 0.05 -> loss per token = -min(exp(0.1), 1.05) = -1.05
    lp = torch.tensor([[0.3, -0.1]])
    loss, m = gspo(
        logp_BT=lp,
        old_logp_BT=torch.zeros(1, 2),
        adv_BT=torch.ones(1, 2),
        mask_BT=torch.ones(1, 2, dtype=torch.bool),
        clip_low=0.05,
        clip_high=0.05,
    )
    assert loss.flatten().tolist() == pytest.approx([-1.05, -1.05])
    assert m["clip_frac"].item() == 1.0


@pytest.mark.parametrize("name", LOSSES.names())
def test_every_loss_runs_through_the_entry_point(name: str) -> None:
    lp, old, adv, mask = batch(2)
    out = compute_policy_loss(
        LossConfig(name=name, kl_coef=0.1, entropy_coef=0.01),
        logp_BT=lp,
        old_logp_BT=old,
        adv_BT=adv,
        mask_BT=mask,
        ref_logp_BT=old - 0.2,
        entropy_BT=torch.rand(lp.shape),
        prox_logp_BT=old + 0.05,
    )
    out.loss.backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()
    assert (lp.grad[~mask] == 0).all()  # masked tokens get no gradient
    for key in ("pg_loss", "approx_kl", "ppo_kl", "kl_ref", "entropy", "loss"):
        assert key in out.metrics


def test_kl_and_entropy_terms() -> None:
    lp, old, adv, mask = batch(3)
    ref, ent = old - 0.3, torch.rand(lp.shape)
    base = compute_policy_loss(NO_KL, logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=mask)
    cfg = LossConfig(kl_coef=0.5, kl_estimator="k2", entropy_coef=0.1)
    full = compute_policy_loss(
        cfg, logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=mask, ref_logp_BT=ref, entropy_BT=ent
    )
    kl = aggregate(kl_estimate(lp, ref, kind="k2"), mask)
    want = base.loss + 0.5 * kl - 0.1 * aggregate(ent, mask)
    assert full.loss.item() == pytest.approx(want.item(), abs=1e-6)
    # the controller's value overrides the config; in-reward KL adds no loss term but is reported
    over = compute_policy_loss(
        cfg,
        logp_BT=lp,
        old_logp_BT=old,
        adv_BT=adv,
        mask_BT=mask,
        ref_logp_BT=ref,
        entropy_BT=ent,
        kl_coef=0.0,
    )
    assert over.loss.item() == pytest.approx((base.loss - 0.1 * aggregate(ent, mask)).item(), abs=1e-6)
    in_r = dataclasses.replace(cfg, kl_in_reward=True)
    out = compute_policy_loss(
        in_r, logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=mask, ref_logp_BT=ref, entropy_BT=ent
    )
    assert out.loss.item() == pytest.approx(over.loss.item(), abs=1e-6) and "kl_ref" in out.metrics
    with pytest.raises(ValueError, match="ref_logp_BT"):
        compute_policy_loss(LossConfig(kl_coef=0.1), logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=mask)


def test_kl_estimators_hand() -> None:
    # log pi = log 0.5, log pi_ref = log 0.25: k1 = log 2, k2 = (log 2)^2 / 2,
    # k3 = rho - 1 - log rho with rho = 0.25/0.5 = 0.5: 0.5 - 1 + log 2 = 0.193147
    lp, ref = torch.tensor([0.5]).log(), torch.tensor([0.25]).log()
    assert kl_estimate(lp, ref, kind="k1").item() == pytest.approx(0.693147, abs=1e-6)
    assert kl_estimate(lp, ref, kind="k2").item() == pytest.approx(0.240227, abs=1e-6)
    assert kl_estimate(lp, ref, kind="k3").item() == pytest.approx(0.193147, abs=1e-6)


def test_apply_kl_penalty() -> None:
    r = torch.tensor([[0.0, 1.0], [0.5, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    lp, ref = torch.full((2, 2), -1.0), torch.full((2, 2), -1.2)  # k1 = 0.2 everywhere
    out, kl = apply_kl_penalty(r, logp_BT=lp, ref_logp_BT=ref, mask_BT=mask, coef=0.5, kind="k1")
    assert out.flatten().tolist() == pytest.approx([-0.1, 0.9, 0.4, 0.0])
    assert kl == pytest.approx(0.2)


def test_aggregation_modes_hand() -> None:
    # rows: (1, 2 | pad), (3, 4, 5), (pad); T = 3
    loss = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 5.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    assert aggregate(loss, mask, mode="token-mean").item() == pytest.approx(15 / 5)
    assert aggregate(loss, mask, mode="seq-mean-token-sum").item() == pytest.approx((3 + 12) / 2)
    assert aggregate(loss, mask, mode="seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    assert aggregate(loss, mask, mode="seq-mean-token-sum-norm").item() == pytest.approx(7.5 / 3)
    assert aggregate(loss, mask, mode="seq-mean-token-sum-norm", norm_len=10).item() == pytest.approx(0.75)


def test_kl_controllers() -> None:
    fixed = KLController(coef=0.1)
    assert fixed.update(5.0, 100) == 0.1
    ada = KLController(coef=0.1, adaptive=True, target=0.1, horizon=1000)
    # KL 3x the target: error clipped at +0.2, beta *= 1 + 0.2 * 100/1000 = 1.02
    assert ada.update(0.3, 100) == pytest.approx(0.102)
    # KL at half the target: error -0.5 clipped to -0.2: beta *= 0.98
    assert ada.update(0.05, 100) == pytest.approx(0.102 * 0.98)
    again = KLController.from_config(LossConfig(kl_ctrl="adaptive"))
    again.load_state_dict(ada.state_dict())
    assert again.state_dict() == ada.state_dict()
    assert again.update(0.2, 10) == ada.update(0.2, 10)


def test_config_checks() -> None:
    check_config(Config())
    with pytest.raises(ConfigError, match=r"valid: .*ppo_clip"):
        check_config(Config(loss=LossConfig(name="ppo")))
    for bad in ({"agg": "mean"}, {"dual_clip_c": 0.5}, {"kl_ctrl": "pid"}):
        with pytest.raises(ConfigError):
            LossConfig(**bad)  # type: ignore[arg-type]
    # registry names are checked against the registry at start-up, not repeated in the config tree
    with pytest.raises(ConfigError, match=r"loss.kl_estimator: unknown 'k4' \(valid: k1, k2, k3\)"):
        check_config(Config(loss=LossConfig(kl_estimator="k4")))
