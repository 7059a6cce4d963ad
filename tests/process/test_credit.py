"""Credit forms (difference, PURE min-form, MIG watermark, clipping), computed by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from stepcredit.config import Config, ProcessConfig
from stepcredit.errors import ConfigError
from stepcredit.process import (
    CREDIT_FORMS,
    check_config,
    min_form_credit,
    process_channel,
    step_credits,
    watermark_credit,
)
from stepcredit.types import Batch

V = [-2.0, -1.0, -1.5, -0.5, -0.75]
# differences U = V_i - V_(i-1): 1.0, -0.5, 1.0, -0.25


def test_min_form_by_hand() -> None:
    # G_t = min of U from t on: G_4 = -0.25, G_3 = min(1, -0.25) = -0.25, G_2 = min(-0.5, -0.25) = -0.5,
    # G_1 = min(1, -0.5) = -0.5; G_5 = 0. c_t = G_t - G_(t+1): 0, -0.25, 0, -0.25
    c = min_form_credit(V)
    assert c == [0.0, -0.25, 0.0, -0.25]
    # sums from t on are the min-form returns G_t, not the sums of U
    assert [sum(c[t:]) for t in range(4)] == [-0.5, -0.5, -0.25, -0.25]
    # zero_last: u_4 gets 0 and leaves the minima: G_3 = 1, G_2 = min(-0.5, 1) = -0.5, G_1 = -0.5, G_4 = 0
    # c = [-0.5 - -0.5, -0.5 - 1, 1 - 0, 0] = [0, -1.5, 1, 0]
    assert min_form_credit(V, zero_last=True) == [0.0, -1.5, 1.0, 0.0]
    # clip to 0.4 and scale by 2: u = 0.8, -0.8, 0.8, -0.5 -> G = -0.8, -0.8, -0.5, -0.5 -> c = 0, -0.3, 0, -0.5
    assert min_form_credit(V, clip=0.4, scale=2.0) == pytest.approx([0.0, -0.3, 0.0, -0.5])
    assert min_form_credit([-1.0]) == []


def test_watermark_by_hand() -> None:
    # W = -2, max(-2,-1) = -1, -1 (fell to -1.5), max(-1,-0.5) = -0.5, -0.5 (fell to -0.75)
    # c = W_i - W_(i-1) = 1, 0, 0.5, 0: the fall and the recovery of lost ground earn nothing
    assert watermark_credit(V) == [1.0, 0.0, 0.5, 0.0]
    assert watermark_credit(V, clip=0.6, scale=10.0) == [6.0, 0.0, 5.0, 0.0]
    assert watermark_credit(V, zero_last=True) == [1.0, 0.0, 0.5, 0.0]
    # a monotone trace gets exactly its differences
    assert watermark_credit([0.0, 0.25, 0.5]) == [0.25, 0.25]
    # the credits sum to max(V) - V_0
    assert sum(watermark_credit(V)) == pytest.approx(max(V) - V[0])


def test_difference_is_the_seed_credit() -> None:
    assert step_credits(V, ProcessConfig()) == [1.0, -0.5, 1.0, -0.25]
    assert step_credits(V, ProcessConfig(clip=0.3, last_episode="zero")) == [0.3, -0.3, 0.3, 0.0]
    assert set(CREDIT_FORMS.names()) >= {"difference", "min_form", "watermark"}


def test_step_cost_charges_every_step() -> None:
    # V = [0, 1, 0.5, 1.5, 1.25]: differences [1, -0.5, 1, -0.25], each less the cost
    assert step_credits(V, ProcessConfig(step_cost=0.25)) == [0.75, -0.75, 0.75, -0.5]
    # a step that changes nothing (a wasted episode) gets exactly -cost
    assert step_credits([0.5, 0.5, 1.0], ProcessConfig(step_cost=0.1)) == pytest.approx([-0.1, 0.4])
    # with last_episode=zero the final step is left to the outcome, uncharged
    assert step_credits(V, ProcessConfig(step_cost=0.25, last_episode="zero")) == [0.75, -0.75, 0.75, 0.0]
    # after the credit form and its clip
    assert step_credits(V, ProcessConfig(step_cost=0.1, clip=0.3)) == pytest.approx([0.2, -0.4, 0.2, -0.35])
    with pytest.raises(ConfigError, match=r"process\.step_cost"):
        ProcessConfig(step_cost=-0.1)


def test_process_channel_uses_the_credit_form(batch_factory: Callable[..., Batch]) -> None:
    from stepcredit.models import build_tokenizer

    batch = batch_factory(build_tokenizer(), [("q", "abcdefgh", "1")], eos=False)
    ends = [[1, 3, 5, 7]]
    out, steps = process_channel(ends, [V], batch.response_mask_BT, ProcessConfig(credit="watermark"))
    want = torch.zeros(1, 8)
    want[0, 1], want[0, 5] = 1.0, 0.5
    assert torch.equal(out, want)
    assert steps[0].nonzero().flatten().tolist() == [1, 3, 5, 7]  # a zero credit is still a step


def test_unknown_credit_form_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"process\.credit.*min_form"):
        check_config(Config(process=ProcessConfig(credit="minimum")))
