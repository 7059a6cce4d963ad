"""The token-level estimators' fast paths (blocked scan, in-place whitening) against a straightforward
loop over each response's counted tokens, on random masks: right padded, with masked gaps inside rows,
invalid responses, lengths around the scan's block of 32 and float32 / float64 inputs."""

from __future__ import annotations

import math

import pytest
import torch

from stepcredit.advantages import AdvantageInputs, gae, reinforce_pp
from stepcredit.ops import discounted_reverse_cumsum


def _whiten_ref(x: list[list[float]], counted: list[list[int]], eps: float = 1e-8) -> list[list[float]]:
    """Batch whitening over the counted tokens: mean, Bessel-corrected variance, eps in the root."""
    vals = [x[b][t] for b, ts in enumerate(counted) for t in ts]
    n = len(vals)
    mean = sum(vals) / max(n, 1)
    var = sum((v - mean) ** 2 for v in vals) / max(n - 1, 1)
    out = [[0.0] * len(row) for row in x]
    for b, ts in enumerate(counted):
        for t in ts:
            out[b][t] = (x[b][t] - mean) / math.sqrt(var + eps)
    return out


def _counted(inp: AdvantageInputs) -> list[list[int]]:
    return [[t for t, m in enumerate(row) if m] for row in inp.live_BT.tolist()]


def reinforce_pp_ref(inp: AdvantageInputs, gamma: float) -> tuple[list[list[float]], list[list[float]]]:
    """G_t = r_t + gamma G_next over counted tokens (gaps skipped), whitened over the batch."""
    r = inp.outcome_BT.double().tolist()
    counted = _counted(inp)
    g = [[0.0] * len(row) for row in r]
    for b, ts in enumerate(counted):
        run = 0.0
        for t in reversed(ts):
            run = r[b][t] + gamma * run
            g[b][t] = run
    return _whiten_ref(g, counted), g


def gae_ref(inp: AdvantageInputs, gamma: float, lam: float) -> tuple[list[list[float]], list[list[float]]]:
    """delta_t = r_t + gamma V_next - V_t, A_t = delta_t + gamma lam A_next (next = next counted token,
    V after the last = 0); returns R = A + V; A whitened over the batch."""
    assert inp.values_BT is not None
    r, v = inp.outcome_BT.double().tolist(), inp.values_BT.double().tolist()
    counted = _counted(inp)
    a = [[0.0] * len(row) for row in r]
    ret = [[0.0] * len(row) for row in r]
    for b, ts in enumerate(counted):
        adv, v_next = 0.0, 0.0
        for t in reversed(ts):
            delta = r[b][t] + gamma * v_next - v[b][t]
            adv = delta + gamma * lam * adv
            a[b][t], ret[b][t] = adv, adv + v[b][t]
            v_next = v[b][t]
    return _whiten_ref(a, counted), ret


def random_inputs(
    seed: int, B: int, T: int, *, gaps: bool, invalid: bool, dtype: torch.dtype
) -> AdvantageInputs:
    g = torch.Generator().manual_seed(seed)
    len_B = torch.randint(0, T + 1, (B,), generator=g)
    len_B[0] = T
    mask = torch.arange(T)[None, :] < len_B[:, None]
    if gaps:
        mask &= torch.rand(B, T, generator=g) > 0.3
    # rewards everywhere, padding included: what lies outside the mask must not leak into returns
    rew = (torch.randn(B, T, generator=g) * 0.5).to(dtype)
    valid = torch.rand(B, generator=g) > 0.25 if invalid else None
    if valid is not None:
        valid[0] = True
    return AdvantageInputs(
        outcome_BT=rew,
        mask_BT=mask,
        group_B=torch.arange(B) // 4,
        valid_B=valid,
        values_BT=torch.randn(B, T, generator=g).to(dtype),
    )


def _check(got: torch.Tensor, ref: list[list[float]], live: torch.Tensor, tol: float) -> None:
    ref_t = torch.tensor(ref, dtype=torch.float64)
    assert (got[~live] == 0).all()  # uncounted tokens get exactly 0
    diff = (got.double() - ref_t).abs().max().item() if got.numel() else 0.0
    assert diff <= tol * max(1.0, ref_t.abs().max().item()), diff


CASES = [
    (seed, T, gaps, invalid)
    for seed, T in enumerate([1, 5, 31, 32, 33, 64, 97, 200])
    for gaps in (False, True)
    for invalid in (False, True)
]


@pytest.mark.parametrize(("seed", "T", "gaps", "invalid"), CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reinforce_pp_and_gae_equal_a_loop_over_counted_tokens(
    seed: int, T: int, gaps: bool, invalid: bool, dtype: torch.dtype
) -> None:
    inp = random_inputs(seed, 9, T, gaps=gaps, invalid=invalid, dtype=dtype)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    live = inp.live_BT
    for gamma in (0.99, 0.9, 0.5):
        out = reinforce_pp(inp, gamma=gamma)
        adv, ret = reinforce_pp_ref(inp, gamma)
        _check(out.ret_BT, ret, live, tol)
        _check(out.adv_BT, adv, live, tol)
    for gamma, lam in ((0.99, 0.95), (0.9, 0.8)):
        out = gae(inp, gamma=gamma, lam=lam)
        adv, ret = gae_ref(inp, gamma, lam)
        _check(out.ret_BT, ret, live, tol)
        _check(out.adv_BT, adv, live, tol)


@pytest.mark.parametrize("T", [1, 7, 32, 33, 100, 1030])
def test_scan_leaves_its_input_alone_unless_told_to_overwrite_it(T: int) -> None:
    x = torch.randn(3, T, generator=torch.Generator().manual_seed(T))
    keep = x.clone()
    a = discounted_reverse_cumsum(x, discount=0.97)
    assert torch.equal(x, keep)
    b = discounted_reverse_cumsum(x.clone(), discount=0.97, overwrite=True)
    assert torch.equal(a, b)
    # a non-contiguous input (a column slice) gives the result of its contiguous copy
    wide = torch.randn(3, 2 * T, generator=torch.Generator().manual_seed(T + 1))
    assert torch.equal(
        discounted_reverse_cumsum(wide[:, ::2], discount=0.97, overwrite=True),
        discounted_reverse_cumsum(wide[:, ::2].contiguous(), discount=0.97),
    )
