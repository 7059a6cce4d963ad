"""Properties of every estimator (hypothesis), start-up checks, and stability at T = 8192."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepcredit.advantages import (
    ESTIMATORS,
    AdvantageInputs,
    check_config,
    compute_advantages,
    gae,
    grpo,
    grpo_process,
    hparams,
    reinforce_pp,
)
from stepcredit.config import AlgorithmConfig, Config, ProcessConfig
from stepcredit.errors import ConfigError
from stepcredit.ops import discounted_reverse_cumsum

HP = hparams(AlgorithmConfig(gamma=0.9, lam=0.8, process_weight=0.5))
NAMES = ESTIMATORS.names()


def random_inputs(seed: int, B: int, T: int, *, gaps: bool, invalid: bool) -> AdvantageInputs:
    # float64: these properties are about the logic; in float32 an all-equal batch whitened with
    # eps = 1e-8 turns the rounding of its mean (~1e-8) into ~1e-4, and that rounding depends on
    # the summation order, hence on the padding (verl behaves the same)
    torch.set_default_dtype(torch.float64)
    try:
        return _random_inputs(seed, B, T, gaps=gaps, invalid=invalid)
    finally:
        torch.set_default_dtype(torch.float32)


def _random_inputs(seed: int, B: int, T: int, *, gaps: bool, invalid: bool) -> AdvantageInputs:
    g = torch.Generator().manual_seed(seed)
    len_B = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < len_B[:, None]
    if gaps:
        mask &= torch.rand(B, T, generator=g) > 0.2
    last = torch.where(mask, torch.arange(T), 0).max(1).values
    score = torch.randint(0, 2, (B,), generator=g).to(torch.get_default_dtype())
    outcome = torch.zeros(B, T).scatter_(1, last[:, None], score[:, None]) * mask
    steps = mask & (torch.rand(B, T, generator=g) < 0.3)
    process = torch.where(steps, 0.1 * torch.randn(B, T, generator=g), torch.zeros(()))
    valid = torch.rand(B, generator=g) > 0.2 if invalid else None
    return AdvantageInputs(
        outcome_BT=outcome,
        mask_BT=mask,
        group_B=torch.randint(0, max(1, B // 3), (B,), generator=g),
        valid_B=valid,
        process_BT=process,
        process_mask_BT=steps,
        values_BT=torch.randn(B, T, generator=g),
    )


shapes = st.tuples(
    st.integers(0, 2**16), st.integers(1, 12), st.integers(1, 20), st.booleans(), st.booleans()
)


@settings(max_examples=25, deadline=None)
@given(shapes)
def test_uncounted_tokens_get_exactly_zero(args: tuple[int, int, int, bool, bool]) -> None:
    seed, B, T, gaps, invalid = args
    inp = random_inputs(seed, B, T, gaps=gaps, invalid=invalid)
    for name in NAMES:
        out = ESTIMATORS.get(name).fn(inp, **HP)
        off = ~inp.live_BT
        assert (out.adv_BT[off] == 0).all(), name
        assert (out.ret_BT[off] == 0).all(), name
        assert torch.isfinite(out.adv_BT).all(), name


@settings(max_examples=25, deadline=None)
@given(shapes, st.integers(1, 7))
def test_extra_right_padding_changes_nothing(args: tuple[int, int, int, bool, bool], extra: int) -> None:
    seed, B, T, gaps, invalid = args
    inp = random_inputs(seed, B, T, gaps=gaps, invalid=invalid)

    def pad(x: torch.Tensor | None, value: float) -> torch.Tensor | None:
        if x is None:
            return None
        return torch.cat([x, torch.full((B, extra), value, dtype=x.dtype)], dim=1)

    # junk in the padding (nonzero rewards, values) must be ignored
    padded = dataclasses.replace(
        inp,
        outcome_BT=pad(inp.outcome_BT, 3.0),
        mask_BT=pad(inp.mask_BT, False),
        process_BT=pad(inp.process_BT, 0.5),
        process_mask_BT=pad(inp.process_mask_BT, False),
        values_BT=pad(inp.values_BT, -2.0),
    )
    for name in NAMES:
        a, b = ESTIMATORS.get(name).fn(inp, **HP), ESTIMATORS.get(name).fn(padded, **HP)
        assert torch.allclose(a.adv_BT, b.adv_BT[:, :T], atol=1e-5), name
        assert torch.allclose(a.ret_BT, b.ret_BT[:, :T], atol=1e-5), name
        assert (b.adv_BT[:, T:] == 0).all(), name


@settings(max_examples=25, deadline=None)
@given(shapes, st.booleans())
def test_grpo_process_without_process_is_grpo(args: tuple[int, int, int, bool, bool], norm: bool) -> None:
    seed, B, T, gaps, invalid = args
    inp = random_inputs(seed, B, T, gaps=gaps, invalid=invalid)
    ref = grpo(inp, norm_by_std=norm, eps=1e-6).adv_BT
    # no process channel: exactly GRPO
    no_proc = dataclasses.replace(inp, process_BT=None, process_mask_BT=None)
    assert torch.equal(grpo_process(no_proc, norm_by_std=norm, eps=1e-6).adv_BT, ref)
    # the outcome moved into the process channel as one step at the last token: pooled step
    # statistics are then the group's score statistics, and every token sums just that step
    last = torch.where(inp.live_BT, torch.arange(T), 0).max(1).values
    end = torch.zeros_like(inp.mask_BT).scatter_(1, last[:, None], True) & inp.live_BT
    moved = dataclasses.replace(
        inp, outcome_BT=torch.zeros_like(inp.outcome_BT), process_BT=inp.outcome_BT, process_mask_BT=end
    )
    got = grpo_process(moved, norm_by_std=norm, eps=1e-6, process_weight=1.0).adv_BT
    # responses with no counted token have no step: they leave the group's pooled statistics
    has = inp.live_BT.any(1)
    assert torch.allclose(
        got[has],
        grpo(dataclasses.replace(inp, valid_B=inp.live_B & has), norm_by_std=norm).adv_BT[has],
        atol=1e-5,
    )


@settings(max_examples=20, deadline=None)
@given(shapes)
def test_invalid_responses_are_left_out(args: tuple[int, int, int, bool, bool]) -> None:
    seed, B, T, gaps, _ = args
    inp = random_inputs(seed, B, T, gaps=gaps, invalid=True)
    keep = inp.live_B.nonzero().flatten()
    if keep.numel() == 0:
        return
    sub = AdvantageInputs(
        outcome_BT=inp.outcome_BT[keep],
        mask_BT=inp.mask_BT[keep],
        group_B=inp.group_B[keep],
        process_BT=inp.process_BT[keep],  # type: ignore[index]
        process_mask_BT=inp.process_mask_BT[keep],  # type: ignore[index]
        values_BT=inp.values_BT[keep],  # type: ignore[index]
    )
    for name in NAMES:
        full, part = ESTIMATORS.get(name).fn(inp, **HP), ESTIMATORS.get(name).fn(sub, **HP)
        assert torch.allclose(full.adv_BT[keep], part.adv_BT, atol=1e-5), name


def test_group_advantages_sum_to_zero() -> None:
    inp = random_inputs(7, 12, 9, gaps=False, invalid=False)
    inp = dataclasses.replace(
        inp, group_B=torch.arange(12) // 4, mask_BT=inp.mask_BT | (torch.arange(9) == 0)
    )
    first = ESTIMATORS.get("rloo").fn(inp).adv_BT[:, 0]
    assert torch.allclose(first.view(3, 4).sum(1), torch.zeros(3, dtype=first.dtype), atol=1e-6)


def seq_reference(x_BT: torch.Tensor, c: float) -> torch.Tensor:
    out, run = torch.zeros_like(x_BT), torch.zeros(x_BT.shape[0], dtype=x_BT.dtype)
    for t in reversed(range(x_BT.shape[1])):
        run = x_BT[:, t] + c * run
        out[:, t] = run
    return out


@pytest.mark.parametrize("c", [0.999, 0.95 * 0.99, 0.5, 1.0])
def test_scan_is_stable_at_8192(c: float) -> None:
    x = torch.randn(3, 8192, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = seq_reference(x, c)
    got = discounted_reverse_cumsum(x.float(), discount=c)
    assert torch.isfinite(got).all()
    assert (got.double() - ref).abs().max() <= 1e-5 * max(1.0, ref.abs().max().item())


def test_long_gae_and_returns_are_finite() -> None:
    B, T = 4, 8192
    mask = torch.arange(T)[None, :] < torch.tensor([[8192], [5000], [1], [7000]])
    out = torch.zeros(B, T)
    out[torch.arange(B), mask.sum(1) - 1] = 1.0
    inp = AdvantageInputs(
        outcome_BT=out, mask_BT=mask, group_B=torch.zeros(B, dtype=torch.long), values_BT=torch.rand(B, T)
    )
    for o in (gae(inp, gamma=0.999, lam=0.95), reinforce_pp(inp, gamma=0.999)):
        assert torch.isfinite(o.adv_BT).all() and torch.isfinite(o.ret_BT).all()
    # a single reward at the end of an 8192-token response, gamma = 0.999: G_0 = 0.999^8191 = 2.76e-4
    g = reinforce_pp(inp, gamma=0.999).ret_BT
    assert g[0, 0].item() == pytest.approx(0.999**8191, rel=1e-4)


def test_compute_advantages_dispatches_by_name() -> None:
    inp = random_inputs(3, 8, 6, gaps=False, invalid=False)
    for name in NAMES:
        cfg = AlgorithmConfig(advantage=name)
        assert torch.equal(
            compute_advantages(cfg, inp).adv_BT, ESTIMATORS.get(name).fn(inp, **hparams(cfg)).adv_BT
        )


@settings(max_examples=25, deadline=None)
@given(shapes, st.floats(0.01, 100.0))
def test_process_std_normalised_estimators_ignore_a_process_scale(
    args: tuple[int, int, int, bool, bool], c: float
) -> None:
    # the registry metadata check_config relies on: step rewards c * U give the advantages of U
    seed, B, T, gaps, invalid = args
    inp = random_inputs(seed, B, T, gaps=gaps, invalid=invalid)
    assert inp.process_BT is not None
    scaled = dataclasses.replace(inp, process_BT=inp.process_BT * c)
    # a group with fewer than two steps has no std to divide by (mean 0, std 1 are used): only groups
    # with two or more counted steps are scale-free, i.e. every group of a real batch
    steps_B = inp.steps_BT.sum(1) if inp.steps_BT is not None else torch.zeros(B)
    per_group = {int(g): 0 for g in inp.group_B}
    for g, n in zip(inp.group_B.tolist(), steps_B.tolist(), strict=True):
        per_group[int(g)] += int(n)
    rows = torch.tensor([per_group[int(g)] >= 2 for g in inp.group_B])
    for name in NAMES:
        if ESTIMATORS.get(name).process_std_normalised:
            a, b = ESTIMATORS.get(name).fn(inp, **HP), ESTIMATORS.get(name).fn(scaled, **HP)
            assert torch.allclose(a.adv_BT[rows], b.adv_BT[rows], atol=1e-3, rtol=1e-3), name


def test_check_config() -> None:
    check_config(Config())
    with pytest.raises(ConfigError, match=r"valid: .*grpo"):
        check_config(Config(algorithm=AlgorithmConfig(advantage="grpoo")))
    with pytest.raises(ConfigError, match="use_critic"):
        check_config(Config(algorithm=AlgorithmConfig(advantage="gae")))
    check_config(Config(algorithm=AlgorithmConfig(advantage="gae", use_critic=True)))
    with pytest.raises(ConfigError, match=r"process\.enabled"):
        check_config(Config(algorithm=AlgorithmConfig(advantage="grpo_process")))
    check_config(
        Config(algorithm=AlgorithmConfig(advantage="grpo_process"), process=ProcessConfig(enabled=True))
    )
    with pytest.raises(ConfigError, match=r"process\.scale: .*algorithm\.process_weight"):
        check_config(
            Config(
                algorithm=AlgorithmConfig(advantage="grpo_process"),
                process=ProcessConfig(enabled=True, scale=0.1),
            )
        )
    check_config(  # without the std division the scale does matter
        Config(
            algorithm=AlgorithmConfig(advantage="grpo_process", norm_by_std=False),
            process=ProcessConfig(enabled=True, scale=0.1),
        )
    )
    with pytest.raises(ConfigError, match=r"algorithm\.gamma"):
        AlgorithmConfig(gamma=1.5)


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="mask_BT"):
        AdvantageInputs(
            outcome_BT=torch.zeros(2, 3), mask_BT=torch.ones(2, 4, dtype=torch.bool), group_B=torch.zeros(2)
        )
