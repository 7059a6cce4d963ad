"""Credit forms (difference, PURE min-form, MIG watermark, clipping), computed by hand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from stepcredit.types import Batch, RewardResult

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


def test_step_cost_as_a_return_by_hand() -> None:
    # U = 1.0, -0.5, 1.0, -0.25 (V above), c = 0.25, n = 4 steps pay.
    # return: step i pays the cost of itself and every later step, c (n - i): 1.0, 0.75, 0.5, 0.25
    cfg = ProcessConfig(step_cost=0.25, step_cost_as="return")
    assert step_credits(V, cfg) == [0.0, -1.25, 0.5, -0.5]
    # it is the reverse cumulative sum of the token form's per-step charges
    no_cost = step_credits(V, ProcessConfig())
    token = [a - b for a, b in zip(no_cost, step_credits(V, ProcessConfig(step_cost=0.25)), strict=True)]
    ret = [a - b for a, b in zip(no_cost, step_credits(V, cfg), strict=True)]
    assert ret == [sum(token[i:]) for i in range(len(token))]
    # last_episode=zero: the last step pays nothing and n = 3: charges 0.75, 0.5, 0.25, 0
    cfg0 = ProcessConfig(step_cost=0.25, step_cost_as="return", last_episode="zero")
    assert step_credits(V, cfg0) == [0.25, -1.0, 0.75, 0.0]
    # outcome: the credits pay nothing (the outcome score does, below)
    assert step_credits(V, ProcessConfig(step_cost=0.25, step_cost_as="outcome")) == no_cost
    with pytest.raises(ConfigError, match=r"process\.step_cost_as"):
        ProcessConfig(step_cost_as="tokens")  # type: ignore[arg-type]


def test_step_cost_as_a_return_reaches_grpo_vineppo_tokens() -> None:
    from stepcredit.advantages import AdvantageInputs, compute_advantages
    from stepcredit.config import AlgorithmConfig

    # one response, 2 steps ending at tokens 1 and 3, V = [0.5, 0.5, 1.0] (R = 1, alone in its group:
    # GRPO's singleton rule gives A^o = (1 - 0) / 1 = 1). c = 0.1 as a return: c_1 = 0 - 0.2, c_2 = 0.5 - 0.1.
    # norm_by_std=False: every token of step j gets A^o + c_j: 0.8, 0.8, 1.4, 1.4
    cfg = ProcessConfig(enabled=True, step_cost=0.1, step_cost_as="return")
    mask_BT = torch.ones(1, 4, dtype=torch.bool)
    process_BT, pmask_BT = process_channel([[1, 3]], [[0.5, 0.5, 1.0]], mask_BT, cfg)
    out = compute_advantages(
        AlgorithmConfig(advantage="grpo_vineppo", norm_by_std=False),
        AdvantageInputs(
            outcome_BT=torch.tensor([[0.0, 0.0, 0.0, 1.0]]),
            mask_BT=mask_BT,
            group_B=torch.tensor([0]),
            process_BT=process_BT,
            process_mask_BT=pmask_BT,
        ),
    )
    assert out.adv_BT[0].tolist() == pytest.approx([0.8, 0.8, 1.4, 1.4])


def test_step_cost_on_the_outcome_before_group_normalisation(scored_batch: Callable[..., Batch]) -> None:
    from stepcredit.process import step_cost_outcome_B
    from stepcredit.reward import with_failure_policy
    from stepcredit.trainer.update import reward_channels

    ends = [[1, 3], [1, 3, 5, 7], []]
    cfg = ProcessConfig(enabled=True, step_cost=0.1, step_cost_as="outcome")
    assert step_cost_outcome_B(ends, cfg).tolist() == pytest.approx([0.2, 0.4, 0.0])
    assert step_cost_outcome_B(ends, ProcessConfig(enabled=True, step_cost=0.1)).tolist() == [0.0] * 3
    # Through the trainer's reward channels: two right responses of one group (R = 1) with 2 and 4
    # episodes, and a third response without episodes (not a process row): outcome scores
    # 1 - 0.2 = 0.8, 1 - 0.4 = 0.6 and 1 at the last token; the process channel carries the plain
    # differences (V = 0.5, 1, 1, ...: 0.5 at the first step, 0 after), no cost.
    batch = scored_batch(
        [RewardResult(1.0)] * 3,
        [0, 0, 1],
        8,
        episode_ends=ends,
        prefix_values=[[0.5, 1.0, 1.0], [0.5, 1.0, 1.0, 1.0, 1.0], []],
    )
    full = from_cfg(process=cfg)
    _, ch = reward_channels(with_failure_policy(batch, full.reward), full)
    assert ch.outcome_BT[:, -1].tolist() == pytest.approx([0.8, 0.6, 1.0])
    assert ch.process_BT is not None
    assert ch.process_BT[0].tolist() == [0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert ch.process_BT[1].tolist() == [0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def from_cfg(**kw: object) -> Config:
    from dataclasses import replace

    return replace(Config(), **kw)  # type: ignore[arg-type]


def test_step_cost_as_return_needs_an_estimator_that_reads_credit_as_advantage() -> None:
    from stepcredit.advantages import check_config as check_advantages
    from stepcredit.config import AlgorithmConfig

    cfg = ProcessConfig(enabled=True, value_estimator="monte_carlo", step_cost=0.1, step_cost_as="return")
    with pytest.raises(ConfigError, match=r"process\.step_cost_as.*grpo_process"):
        check_advantages(from_cfg(process=cfg, algorithm=AlgorithmConfig(advantage="grpo_process")))
    check_advantages(from_cfg(process=cfg, algorithm=AlgorithmConfig(advantage="grpo_vineppo")))


def test_blame_credit_by_hand() -> None:
    from stepcredit.process import blame_credit

    # Estimated values of a right response (R = 1) that dipped: V = [0.5, 0.25, 1.0, 1.0].
    # difference: 0.25 - 0.5 = -0.25, 0.75, 0 (sum R - V_0 = 0.5: the outcome advantage again)
    # blame: V_0 := 1: 0.25 - 1 = -0.75, 0.75, 0 (sum R - 1 = 0: a right response is charged nothing)
    right = [0.5, 0.25, 1.0, 1.0]
    assert step_credits(right, ProcessConfig()) == [-0.25, 0.75, 0.0]
    assert blame_credit(right) == [-0.75, 0.75, 0.0]
    # a wrong response (R = 0) whose value never moved until the last step: all the blame there
    wrong = [0.5, 1.0, 1.0, 0.0]
    assert blame_credit(wrong) == [0.0, 0.0, -1.0] and sum(blame_credit(wrong)) == 0.0 - 1.0
    # exact oracle values (V_0 = 1 already) give the same credits under both forms
    oracle = [1.0, 1.0, 0.0, 1.0, 1.0]
    assert blame_credit(oracle) == step_credits(oracle, ProcessConfig()) == [0.0, -1.0, 1.0, 0.0]
    # registered, with clip, scale and the last-episode rule like the other forms
    cfg = ProcessConfig(credit="blame", clip=0.5, scale=2.0, last_episode="zero")
    assert step_credits(wrong, cfg) == [0.0, 0.0, 0.0] and "blame" in CREDIT_FORMS
    assert step_credits(right, ProcessConfig(credit="blame", clip=0.5, scale=2.0)) == [-1.0, 1.0, 0.0]


def test_blame_refuses_values_that_are_not_chances_of_success(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """blame compares V with a certain success (V_0 := 1): on forced-answer log-probabilities (<= 0, a
    likelihood on the answer's own scale) its credits would charge every response about 1 - mean log p
    at its first step. Refused at start-up, from the registries' metadata, in one line naming both keys."""
    from stepcredit.cli.main import main
    from stepcredit.config import from_dict
    from stepcredit.process import VALUE_ESTIMATORS, register_value_estimator

    # the metadata, not the names: the probabilities are exactly the estimators that say so
    assert not VALUE_ESTIMATORS.get("forced_answer_logprob").success_probability
    for name in ("monte_carlo", "greedy_continuation", "tree", "step_oracle"):
        assert VALUE_ESTIMATORS.get(name).success_probability
    assert CREDIT_FORMS.get("blame").needs_success_probability
    assert not any(
        CREDIT_FORMS.get(f).needs_success_probability for f in ("difference", "min_form", "watermark")
    )

    def cfg(**process: object) -> Any:
        return from_dict({"process": {"enabled": True, **process}})

    with pytest.raises(
        ConfigError, match=r"process\.credit=blame and process\.value_estimator=forced_answer"
    ):
        check_config(cfg(credit="blame"))
    for ok in ("monte_carlo", "greedy_continuation", "step_oracle"):
        check_config(cfg(credit="blame", value_estimator=ok))
    check_config(cfg(credit="difference"))  # the other forms read any values
    check_config(from_dict({"process": {"credit": "blame"}}))  # process rewards off: nothing is read

    # a new estimator says what its values are; one that does not is not taken for a probability
    @register_value_estimator("_test_share", needs_verifier=False, generates=False)
    def share(ctx):  # type: ignore[no-untyped-def]
        return [[0.5] * len(r.prefix_lens) for r in ctx.requests]

    try:
        with pytest.raises(ConfigError, match="_test_share does not give"):
            check_config(cfg(credit="blame", value_estimator="_test_share"))
    finally:
        VALUE_ESTIMATORS._items.pop("_test_share")

    # through the command line: exit code 2, one line on stderr naming the keys, before any model loads
    out = tmp_path / "run"
    code = main(
        ["train", "--preset", "smoke", "process.enabled=true", "process.credit=blame", "--out", str(out)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "process.credit=blame" in err[0] and "process.value_estimator=forced_answer_logprob" in err[0]
    assert not (out / "checkpoints").exists()
