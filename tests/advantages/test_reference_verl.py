"""Equivalence with verl 0.9.1's ``verl.trainer.ppo.core_algos`` (a test-only dependency).

Random inputs with right padding, singleton groups and an all-equal group; max abs diff <= 1e-5.
verl does not zero padded tokens in some outputs (GAE), so comparisons are on counted tokens, and
separately our padded tokens must be exactly 0.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stepcredit.advantages import AdvantageInputs, gae, grpo, reinforce_pp, reinforce_pp_baseline, rloo

pytestmark = pytest.mark.verl  # runs in .venv-verl (make test)

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

TOL = 1e-5


def make_batch(seed: int, *, B: int = 24, T: int = 17, dense: bool = False, gaps: bool = False):
    """B responses in groups (sizes 4, 4, 1, 3, 1, 5, 6: two singletons), one all-equal group."""
    g = torch.Generator().manual_seed(seed)
    sizes = [4, 4, 1, 3, 1, 5, 6]
    group_B = torch.cat([torch.full((s,), i) for i, s in enumerate(sizes)])[torch.randperm(B, generator=g)]
    len_B = torch.randint(1, T + 1, (B,), generator=g)
    len_B[0] = T  # one full-length row
    mask_BT = torch.arange(T)[None, :] < len_B[:, None]
    if gaps:  # masked "observation" tokens inside responses
        mask_BT &= torch.rand(B, T, generator=g) > 0.25
        mask_BT[:, 0] = True
    score_B = torch.randint(0, 2, (B,), generator=g).float() + 0.3 * torch.randn(B, generator=g)
    score_B[group_B == 1] = 0.7  # all-equal group
    if dense:
        # scale 0.5: returns stay O(10), where verl's own float32 loop is within ~5e-6 of the exact
        # value (at N(0, 1) rewards and gamma = 0.99 its rounding alone reaches ~1e-5 at T = 150)
        rew_BT = 0.5 * torch.randn(B, T, generator=g) * mask_BT
    else:
        last_B = torch.where(mask_BT, torch.arange(T), 0).max(1).values
        rew_BT = torch.zeros(B, T).scatter_(1, last_B[:, None], score_B[:, None])
    values_BT = torch.randn(B, T, generator=g)
    return rew_BT, mask_BT, group_B, values_BT


def assert_close_on(ours: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> None:
    diff = (ours - ref.to(ours.dtype)).abs()[mask].max().item() if mask.any() else 0.0
    assert diff <= TOL, diff
    assert (ours[~mask] == 0).all()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo(seed: int, norm_by_std: bool) -> None:
    r, m, g, _ = make_batch(seed)
    ours = grpo(AdvantageInputs(outcome_BT=r, mask_BT=m, group_B=g), norm_by_std=norm_by_std, eps=1e-6)
    ref, _ = core_algos.compute_grpo_outcome_advantage(
        r.clone(), m.float(), g.numpy(), epsilon=1e-6, norm_adv_by_std_in_grpo=norm_by_std
    )
    assert_close_on(ours.adv_BT, ref, m)


@pytest.mark.parametrize("seed", range(3))
def test_rloo(seed: int) -> None:
    r, m, g, _ = make_batch(seed)
    ours = rloo(AdvantageInputs(outcome_BT=r, mask_BT=m, group_B=g))
    ref, _ = core_algos.compute_rloo_outcome_advantage(r.clone(), m.float(), g.numpy())
    assert_close_on(ours.adv_BT, ref, m)


@pytest.mark.parametrize("seed", range(3))
def test_reinforce_pp_baseline(seed: int) -> None:
    r, m, g, _ = make_batch(seed)
    ours = reinforce_pp_baseline(AdvantageInputs(outcome_BT=r, mask_BT=m, group_B=g))
    ref, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        r.clone(), m.float(), g.numpy()
    )
    assert_close_on(ours.adv_BT, ref, m)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.5, 0.0])
@pytest.mark.parametrize("gaps", [False, True])
def test_reinforce_pp(seed: int, gamma: float, gaps: bool) -> None:
    r, m, g, _ = make_batch(seed, dense=True, gaps=gaps, T=150)
    ours = reinforce_pp(AdvantageInputs(outcome_BT=r, mask_BT=m, group_B=g), gamma=gamma)
    ref_adv, ref_ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        r.clone(), m.float(), config=SimpleNamespace(gamma=gamma)
    )
    assert_close_on(ours.adv_BT, ref_adv, m)
    assert_close_on(ours.ret_BT, ref_ret, m)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (1.0, 0.9), (0.9, 0.0)])
@pytest.mark.parametrize("gaps", [False, True])
def test_gae(seed: int, gamma: float, lam: float, gaps: bool) -> None:
    r, m, g, v = make_batch(seed, dense=True, gaps=gaps, T=150)
    ours = gae(AdvantageInputs(outcome_BT=r, mask_BT=m, group_B=g, values_BT=v), gamma=gamma, lam=lam)
    ref_adv, ref_ret = core_algos.compute_gae_advantage_return(r.clone(), v.clone(), m.float(), gamma, lam)
    assert_close_on(ours.adv_BT, ref_adv, m)
    assert_close_on(ours.ret_BT, ref_ret, m)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_estimators(kind: str) -> None:
    from stepcredit.losses import kl_estimate

    g = torch.Generator().manual_seed(0)
    lp, ref = -torch.rand(8, 30, generator=g) * 5, -torch.rand(8, 30, generator=g) * 5
    lp[0, 0], ref[0, 0] = -40.0, -0.1  # exercises the clamps
    diff = (kl_estimate(lp, ref, kind=kind) - core_algos.kl_penalty(lp, ref, kind)).abs().max()
    assert diff <= TOL


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_aggregation(mode: str) -> None:
    from stepcredit.losses import aggregate

    _, m, _, v = make_batch(1)
    m[3] = False  # a fully masked response is left out of the sequence means
    ours = aggregate(v, m, mode=mode)
    ref = core_algos.agg_loss(v, m.float(), mode)
    assert abs(ours.item() - ref.item()) <= TOL


@pytest.mark.parametrize(("clip_low", "clip_high", "c"), [(0.2, 0.2, 3.0), (0.2, 0.28, 3.0), (0.1, 0.3, 1.5)])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_ppo_clip(clip_low: float, clip_high: float, c: float, mode: str) -> None:
    from stepcredit.config import LossConfig
    from stepcredit.losses import compute_policy_loss

    _, m, _, adv = make_batch(2)
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(adv.shape, generator=g) * 3
    lp = (old + 0.6 * torch.randn(adv.shape, generator=g)).requires_grad_(True)
    cfg = LossConfig(clip_low=clip_low, clip_high=clip_high, dual_clip_c=c, agg=mode, kl_coef=0.0)
    out = compute_policy_loss(cfg, logp_BT=lp, old_logp_BT=old, adv_BT=adv, mask_BT=m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss, clipfrac, ppo_kl, clipfrac_lower = core_algos.compute_policy_loss(
            old,
            lp,
            adv,
            m.float(),
            cliprange_low=clip_low,
            cliprange_high=clip_high,
            clip_ratio_c=c,
            loss_agg_mode=mode,
        )
    assert abs(out.loss.item() - loss.item()) <= TOL
    assert abs(out.metrics["clip_frac"] - clipfrac.item()) <= TOL
    assert abs(out.metrics["clip_frac_lower"] - clipfrac_lower.item()) <= TOL
    assert abs(out.metrics["ppo_kl"] - ppo_kl.item()) <= TOL
    (gours,) = torch.autograd.grad(out.loss, lp)
    (gref,) = torch.autograd.grad(loss, lp)
    assert (gours - gref).abs().max() <= TOL


def test_in_reward_penalty_matches_verl() -> None:
    from stepcredit.losses import apply_kl_penalty

    r, m, _, v = make_batch(4, dense=True)
    ref_lp = v - 0.3
    ours, _ = apply_kl_penalty(r, logp_BT=v, ref_logp_BT=ref_lp, mask_BT=m, coef=0.05, kind="k1")
    theirs = core_algos.compute_rewards(r, v, ref_lp, 0.05)
    assert_close_on(ours, theirs, m)


def test_adaptive_controller_matches_verl() -> None:
    from stepcredit.losses import KLController

    ours = KLController(coef=0.1, adaptive=True, target=0.05, horizon=1000)
    theirs = core_algos.AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=1000)
    for kl in np.linspace(0.0, 0.2, 9):
        ours.update(float(kl), 64)
        theirs.update(float(kl), 64)
        assert abs(ours.value - theirs.value) <= 1e-12
