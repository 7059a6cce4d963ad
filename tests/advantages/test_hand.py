"""Values computed by hand (derivations in comments) for the estimators verl has no reference for."""

from __future__ import annotations

import math

import pytest
import torch

from stepcredit.advantages import (
    AdvantageInputs,
    grpo,
    grpo_process,
    grpo_vineppo,
    prime_rloo,
    rloo,
    vineppo,
)
from stepcredit.advantages.token import prime_rloo_rewards
from stepcredit.ops import masked_whiten

# The example: one group of 4 responses, every token a step with its own reward.
REWARDS = [[0.1, 0.2, 0.3], [0.4, 0.5], [0.2, 0.1, 0.2, 0.1], [0.3, 0.4, 0.3]]


def example(outcome: list[float] | None = None) -> AdvantageInputs:
    B, T = len(REWARDS), max(map(len, REWARDS))
    p = torch.zeros(B, T, dtype=torch.float64)
    m = torch.zeros(B, T, dtype=torch.bool)
    o = torch.zeros(B, T, dtype=torch.float64)
    for i, r in enumerate(REWARDS):
        p[i, : len(r)] = torch.tensor(r, dtype=torch.float64)
        m[i, : len(r)] = True
        if outcome is not None:
            o[i, len(r) - 1] = outcome[i]
    return AdvantageInputs(outcome_BT=o, mask_BT=m, group_B=torch.zeros(B, dtype=torch.long), process_BT=p)


def test_grpo_process_hand() -> None:
    # DeepSeekMath 4.1.3 normalises every step reward by the statistics of ALL steps of the group:
    #   12 steps, sum = 0.6 + 0.9 + 0.6 + 1.0 = 3.1, mean mu = 3.1 / 12 = 0.258333...
    #   sum of squares = 0.14 + 0.41 + 0.10 + 0.34 = 0.99
    #   unbiased var = (0.99 - 12 mu^2) / 11 = (0.99 - 0.800833) / 11 = 0.0171970,  sigma = 0.131137
    mu = 3.1 / 12
    assert round(mu, 3) == 0.258
    sigma = math.sqrt((0.99 - 12 * mu**2) / 11)
    assert sigma == pytest.approx(0.131137, abs=1e-6)
    eps = 1e-6
    z = [[(x - mu) / (sigma + eps) for x in r] for r in REWARDS]
    # response 1: z = (-1.20738, -0.44482, 0.31773); a token's advantage sums the z of the steps
    # ending at or after it: (-1.33447, -0.12709, 0.31773)
    assert z[0][0] == pytest.approx(-1.20738, abs=1e-5)
    out = grpo_process(example(), norm_by_std=True, eps=eps, process_weight=1.0)
    for i, zi in enumerate(z):
        want = [sum(zi[t:]) for t in range(len(zi))]
        assert out.adv_BT[i, : len(zi)].tolist() == pytest.approx(want, abs=1e-9)
        assert (out.adv_BT[i, len(zi) :] == 0).all()
    assert out.adv_BT[0, :3].tolist() == pytest.approx([-1.33447, -0.12709, 0.31773], abs=1e-5)

    # Dr. GRPO variant: no division, response 1 -> (0.6 - 3 mu, 0.5 - 2 mu, 0.3 - mu)
    out = grpo_process(example(), norm_by_std=False, process_weight=1.0)
    assert out.adv_BT[0, :3].tolist() == pytest.approx([0.6 - 3 * mu, 0.5 - 2 * mu, 0.3 - mu], abs=1e-9)


def test_grpo_process_adds_separately_normalised_outcome() -> None:
    # outcome scores (1, 0, 1, 1): GRPO over the group: mean 0.75, unbiased std = sqrt(0.75/3) = 0.5,
    # so A^o = (0.5, -1.5, 0.5, 0.5) (eps 1e-6 ignored at 1e-5); A = A^o + w A^p with w = 0.1.
    proc = grpo_process(example(), eps=1e-6, process_weight=1.0).adv_BT
    both = grpo_process(example([1.0, 0.0, 1.0, 1.0]), eps=1e-6, process_weight=0.1).adv_BT
    a_o = torch.tensor([0.5, -1.5, 0.5, 0.5], dtype=torch.float64)[:, None]
    mask = example().mask_BT
    want = torch.where(mask, a_o + 0.1 * proc, torch.zeros((), dtype=torch.float64))
    assert torch.allclose(both, want, atol=1e-5)


def test_prime_rloo_hand() -> None:
    # PRIME (Cui et al. 2025): per sample mean token reward m = (0.2, 0.45, 0.15, 0.3333);
    # the subtracted term is sum(m) / (n - 1) = 1.13333 / 3 = 0.377778 (the 0.378), and each
    # token reward becomes r * n/(n-1) - 0.377778, e.g. response 1: 0.1*4/3 - 0.377778 = -0.244444,
    # 0.2*4/3 - 0.377778 = -0.111111, 0.3*4/3 - 0.377778 = 0.022222.
    inp = example()
    means = [sum(r) / len(r) for r in REWARDS]
    sub = sum(means) / 3
    assert round(sub, 3) == 0.378
    rt = prime_rloo_rewards(inp.process_BT, inp.mask_BT, inp.group_B, inp.live_B)  # type: ignore[arg-type]
    assert rt[0, :3].tolist() == pytest.approx([-0.244444, -0.111111, 0.022222], abs=1e-6)
    for i, r in enumerate(REWARDS):
        assert rt[i, : len(r)].tolist() == pytest.approx([x * 4 / 3 - sub for x in r], abs=1e-12)
    # returns are reverse cumulative sums: response 1 -> (-0.333333, -0.088889, 0.022222);
    # advantages whiten those returns over all 12 tokens.
    out = prime_rloo(inp, process_weight=1.0)
    assert out.ret_BT[0, :3].tolist() == pytest.approx([-0.333333, -0.088889, 0.022222], abs=1e-6)
    assert torch.allclose(out.adv_BT, masked_whiten(out.ret_BT, inp.mask_BT), atol=1e-12)


def test_prime_rloo_outcome_channel_is_leave_one_out() -> None:
    # one reward token per response: r_i n/(n-1) - sum_j r_j/(n-1) = r_i - mean_{j != i} r_j;
    # scores (1, 0, 1, 1): (1 - 2/3, 0 - 1, 1 - 2/3, 1 - 2/3) = (1/3, -1, 1/3, 1/3), spread by the
    # reverse cumulative sum to every token; the process channel is switched off with weight 0.
    out = prime_rloo(example([1.0, 0.0, 1.0, 1.0]), process_weight=0.0)
    want = [1 / 3, -1.0, 1 / 3, 1 / 3]
    for i, r in enumerate(REWARDS):
        assert out.ret_BT[i, : len(r)].tolist() == pytest.approx([want[i]] * len(r), abs=1e-12)


def two_step_example() -> AdvantageInputs:
    """Two responses of one group, T = 6, step utilities at episode ends (see test_vineppo_hand)."""
    p = torch.zeros(2, 6, dtype=torch.float64)
    at = torch.zeros(2, 6, dtype=torch.bool)
    for i, (ends, us) in enumerate([((1, 3, 5), (0.5, 0.0, -0.5)), ((2, 4), (0.25, 0.75))]):
        for t, u in zip(ends, us, strict=True):
            p[i, t], at[i, t] = u, True
    m = torch.ones(2, 6, dtype=torch.bool)
    m[1, 5] = False
    o = torch.zeros(2, 6, dtype=torch.float64)
    o[1, 4] = 1.0
    return AdvantageInputs(
        outcome_BT=o, mask_BT=m, group_B=torch.zeros(2, dtype=torch.long), process_BT=p, process_mask_BT=at
    )


def test_vineppo_hand() -> None:
    # VinePPO: every token of step j gets U_j = V_j - V_(j-1). Two responses of one group, T = 6:
    #   row 0: steps end at tokens 1, 3, 5; V = 0, 0.5, 0.5, 0 (R = 0) -> U = 0.5, 0, -0.5
    #   row 1: steps end at tokens 2, 4;    V = 0, 0.25, 1 (R = 1)     -> U = 0.25, 0.75; token 5 is padding
    inp = two_step_example()
    raw = vineppo(inp, norm_by_std=False).adv_BT
    # the step whose U is 0 (tokens 2-3 of row 0) keeps 0: the mask, not the value, says where steps end
    assert raw.tolist() == [[0.5, 0.5, 0.0, 0.0, -0.5, -0.5], [0.25, 0.25, 0.25, 0.75, 0.75, 0.0]]
    # normalised by the RMS over the 11 live tokens: (4 x 0.25 + 3 x 0.0625 + 2 x 0.5625) / 11
    rms = math.sqrt((1.0 + 0.1875 + 1.125) / 11)
    assert rms == pytest.approx(0.458506, abs=1e-6)
    torch.testing.assert_close(vineppo(inp).adv_BT, raw / (rms + 1e-6))


def test_grpo_vineppo_hand() -> None:
    # The vineppo example above (one group, R = 0 and 1) with GRPO's outcome advantage added to every
    # token. Without the divisions (norm_by_std=False): A^o = R - mean(R) = -0.5, +0.5, so
    #   row 0: -0.5 + (0.5, 0.5, 0, 0, -0.5, -0.5)        = (0, 0, -0.5, -0.5, -1, -1)
    #   row 1: +0.5 + (0.25, 0.25, 0.25, 0.75, 0.75) , pad = (0.75, 0.75, 0.75, 1.25, 1.25, 0)
    inp = two_step_example()
    raw = grpo_vineppo(inp, norm_by_std=False).adv_BT
    assert raw.tolist() == [[0.0, 0.0, -0.5, -0.5, -1.0, -1.0], [0.75, 0.75, 0.75, 1.25, 1.25, 0.0]]
    # process_weight scales the step part only: row 0 with w = 0.5 is -0.5 + 0.5 * U
    half = grpo_vineppo(inp, norm_by_std=False, process_weight=0.5).adv_BT
    assert half[0].tolist() == [-0.25, -0.25, -0.5, -0.5, -0.75, -0.75]
    # normalised: A^o = (R - 0.5) / (std(0, 1) = 1/sqrt(2)) = -+0.7071; U / rms(U) with rms = 0.458506 over
    # the 11 live tokens (as in the vineppo example)
    a_o = 0.5 / (math.sqrt(0.5) + 1e-6)
    u = vineppo(inp).adv_BT
    want = torch.tensor([[-a_o] * 6, [a_o] * 5 + [0.0]], dtype=torch.float64) + u
    torch.testing.assert_close(grpo_vineppo(inp).adv_BT, want)


def test_grpo_vineppo_without_steps_is_grpo() -> None:
    # no process channel (a domain without process rewards): the outcome advantage alone, not doubled
    o = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    m = torch.ones(3, 2, dtype=torch.bool)
    inp = AdvantageInputs(outcome_BT=o, mask_BT=m, group_B=torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(grpo_vineppo(inp).adv_BT, grpo(inp).adv_BT)


def test_grpo_vineppo_mixed_batch() -> None:
    # Row 0 has steps (U = 0.5 on tokens 0-1, -0.5 on tokens 2-3), row 1 (same group) has none (a domain
    # without process rewards). Outcomes 0 and 1 -> A^o = -0.5, +0.5 without the divisions. Row 1 gets
    # its outcome advantage alone; with the division the RMS of U is taken over row 0's 4 tokens only
    # (sqrt((4 x 0.25) / 4) = 0.5), so row 0's step part is U / 0.5 = +-1.
    p = torch.zeros(2, 4, dtype=torch.float64)
    at = torch.zeros(2, 4, dtype=torch.bool)
    p[0, 1], p[0, 3] = 0.5, -0.5
    at[0, 1] = at[0, 3] = True
    o = torch.zeros(2, 4, dtype=torch.float64)
    o[1, 3] = 1.0
    inp = AdvantageInputs(
        outcome_BT=o,
        mask_BT=torch.ones(2, 4, dtype=torch.bool),
        group_B=torch.zeros(2, dtype=torch.long),
        process_BT=p,
        process_mask_BT=at,
    )
    raw = grpo_vineppo(inp, norm_by_std=False).adv_BT
    assert raw.tolist() == [[0.0, 0.0, -1.0, -1.0], [0.5, 0.5, 0.5, 0.5]]
    a_o = 0.5 / (math.sqrt(0.5) + 1e-6)
    step = 0.5 / (0.5 + 1e-6)
    want = [[-a_o + step] * 2 + [-a_o - step] * 2, [a_o] * 4]
    torch.testing.assert_close(grpo_vineppo(inp).adv_BT, torch.tensor(want, dtype=torch.float64))
    with pytest.raises(ValueError, match="process_mask_BT"):
        grpo_vineppo(AdvantageInputs(outcome_BT=o, mask_BT=inp.mask_BT, group_B=inp.group_B, process_BT=p))


def test_vineppo_without_steps_is_rloo() -> None:
    # a response with no step rewards (its domain has none) gets the RLOO outcome advantage
    o = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    m = torch.ones(3, 2, dtype=torch.bool)
    inp = AdvantageInputs(outcome_BT=o, mask_BT=m, group_B=torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(vineppo(inp, norm_by_std=False).adv_BT, rloo(inp).adv_BT)
    # [1, 0, 1]: A = 1 - 1/2, 0 - 1, 1 - 1/2 = 0.5, -1, 0.5
    assert vineppo(inp, norm_by_std=False).adv_BT[:, 0].tolist() == [0.5, -1.0, 0.5]
