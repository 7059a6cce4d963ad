"""Values from a flat group's shared prefixes (``process.value_estimator=group_prefix``), by hand."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from stepcredit.config import ProcessConfig
from stepcredit.models import build_tokenizer
from stepcredit.process import (
    VALUE_ESTIMATORS,
    compute_prefix_values,
    group_prefix_values,
    process_channel,
    shared_prefix_share,
    tree_values,
)
from stepcredit.rollout import engines
from stepcredit.rollout.engines import Completion
from stepcredit.types import Batch, Sample

# One group of three responses to a prompt, outcomes 1, 0, 1. Responses 0 and 1 share [1, 2], all three
# share [1]; response 2 ends an episode after its first token, which the others pass through mid-episode.
GROUP = [0, 0, 0]
RESPONSES = [[1, 2, 3, 4], [1, 2, 5, 6], [1, 7, 8]]
ENDS = [[1, 3], [1, 3], [0, 2]]
SCORE = [1.0, 0.0, 1.0]


def test_values_by_hand() -> None:
    # V_0 = the group's mean, 2/3. Response 0: V([1, 2]) = mean(R_0, R_1) = 0.5, then its own R = 1.
    # Response 1: the same 0.5, then 0. Response 2: V([1]) = mean of all three = 2/3 (the others carry
    # [1] inside an episode: membership is by tokens), then 1.
    got = group_prefix_values(GROUP, RESPONSES, ENDS, SCORE, [True] * 3)
    want = [[2 / 3, 0.5, 1.0], [2 / 3, 0.5, 0.0], [2 / 3, 2 / 3, 1.0]]
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w)
    # the differences telescope to R - mean(group): what a VinePPO-style advantage needs
    for v, r in zip(got, SCORE, strict=True):
        assert sum(b - a for a, b in itertools.pairwise(v)) == pytest.approx(r - 2 / 3)


def test_a_response_alone_after_a_step_has_its_own_outcome_there() -> None:
    # response 1 parts from response 0 at token 2 and fails: its credit sits on the step where it parted
    got = group_prefix_values([0, 0], [[1, 2, 3], [1, 9, 3]], [[0, 1, 2], [0, 1, 2]], [1.0, 0.0], [True] * 2)
    assert got[1] == pytest.approx([0.5, 0.5, 0.0, 0.0])
    credit = [b - a for a, b in zip(got[1], got[1][1:], strict=False)]
    assert credit == pytest.approx([0.0, -0.5, 0.0])


def test_groups_do_not_mix_and_failed_rewards_count_nowhere() -> None:
    # the same tokens in another group are another prompt's: not counted
    got = group_prefix_values([0, 1], [[1, 2, 3], [1, 2, 4]], [[1, 2], [1, 2]], [1.0, 0.0], [True] * 2)
    assert got == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    # response 1's reward failed (valid False, or a NaN score): not a sample of anybody's value, and its
    # own last value is the one before it, so its credits add up to nothing it did not earn
    for score, valid in (([1.0, 0.0, 0.0], [True, False, True]), ([1.0, math.nan, 0.0], [True, True, True])):
        got = group_prefix_values([0, 0, 0], [[1, 2], [1, 2], [1, 3]], [[0, 1]] * 3, score, valid)
        assert got[0] == pytest.approx([0.5, 0.5, 1.0])
        assert got[1] == pytest.approx([0.5, 0.5, 0.5])
        assert got[2] == pytest.approx([0.5, 0.5, 0.0])
    # no valid response in the group: 0 throughout; a response without episodes: no values
    assert group_prefix_values([0, 0], [[1], [2]], [[0], []], [1.0, 1.0], [False, False]) == [[0.0, 0.0], []]


def test_equal_to_a_tree_s_values_when_the_prefixes_are_its_nodes() -> None:
    # a group whose shared prefixes end where episodes end is a tree rollout: branching (2, 2) with
    # nodes a = [1, 2] (responses 0, 1) and b = [1, 5] (2, 3) below the root
    responses = [[1, 2, 3], [1, 2, 4], [1, 5, 6], [1, 5, 7]]
    ends = [[1, 2]] * 4
    score = [1.0, 0.0, 1.0, 1.0]
    got = group_prefix_values([0] * 4, responses, ends, score, [True] * 4)
    assert got == tree_values([0] * 4, [[0, 1], [0, 1], [0, 2], [0, 2]], score, [True] * 4)


def test_shared_prefix_share_by_hand() -> None:
    # inner ends: response 0's [1, 2] (shared with 1), response 1's (shared), response 2's [1] (shared);
    # the last ends do not count
    assert shared_prefix_share(GROUP, RESPONSES, ENDS) == 1.0
    assert shared_prefix_share([0, 0], [[1, 2, 3], [1, 9, 3]], [[0, 1, 2], [0, 1, 2]]) == pytest.approx(2 / 4)
    assert shared_prefix_share([0], [[1]], [[0]]) is None  # no inner ends: nothing to share


def test_registered_as_free_values_of_the_group() -> None:
    spec = VALUE_ESTIMATORS.get("group_prefix")
    assert spec.from_group and not spec.from_outcomes and not spec.generates
    assert spec.terminal_is_reward and spec.success_probability


def test_the_step_credit_lands_on_the_step_where_the_response_parted() -> None:
    got = group_prefix_values([0, 0], [[1, 2, 3], [1, 9, 3]], [[0, 1, 2], [0, 1, 2]], [1.0, 0.0], [True] * 2)
    mask = torch.ones(2, 3, dtype=torch.bool)
    process_BT, process_mask_BT = process_channel(
        [[0, 1, 2], [0, 1, 2]], got, mask, ProcessConfig(enabled=True)
    )
    # response 1: -0.5 on token 1 (its second step), nothing elsewhere; response 0 the mirror image
    assert process_BT[1].tolist() == pytest.approx([0.0, -0.5, 0.0])
    assert process_BT[0].tolist() == pytest.approx([0.0, 0.5, 0.0])
    assert process_mask_BT.all()


RESPONSE = "So 3 + 4 = 7. So 7 + 1 = 8. So done."  # episodes: "So 3 + 4 = 7. ", "So 7 + 1 = 8. ", "So done."
SAMPLED = ["So 3 + 4 = 7. ok", "So 3 + 4 = 7. no", " ok", " no"]
"""What the scripted policy samples from a bare prompt, in order: two share the trace's first episode."""


class GroupPolicy(torch.nn.Module):
    """A policy bound to itself as its rollout engine that samples :data:`SAMPLED` from every context;
    ``contexts`` holds the context lengths of each engine call."""

    def __init__(self, tok: Any) -> None:
        super().__init__()
        self.tok = tok
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.contexts: list[list[int]] = []
        engines.bind(self, self)  # type: ignore[arg-type]

    def sample(self, model: Any, tok: Any, contexts: Sequence[Sequence[int]], spec: Any, **_: Any) -> list:
        assert spec.n == len(SAMPLED) and spec.temperature == 1.0
        self.contexts.append([len(c) for c in contexts])
        return [Completion(self.tok(t)["input_ids"]) for _ in contexts for t in SAMPLED]


def test_on_fixed_traces_the_group_is_sampled_from_the_prompt(batch_factory: Callable[..., Batch]) -> None:
    # the probe's path: each trace's group is K responses sampled from its prompt plus the trace
    tok = build_tokenizer()
    batch = batch_factory(tok, [("q", RESPONSE, "7"), ("q", RESPONSE, "7"), ("r", RESPONSE, "7")])
    texts: list[str] = []

    def score(samples: Sequence[Sample], got: Sequence[str]) -> list[float]:
        texts.extend(got)  # right iff it ends in "ok" and does not hold the wrong "= 8"
        return [1.0 if t.endswith("ok") and "= 8" not in t else 0.0 for t in got]

    model = GroupPolicy(tok)
    cfg = ProcessConfig(value_estimator="group_prefix", mc_samples=4)
    got = compute_prefix_values(model, tok, batch, cfg, score_fn=score)
    # the trace scores 0, the samples 1, 0, 1, 0: V_0 = 2/5; the first episode is shared by the trace and
    # the first two samples: 1/3; after "= 8" the trace is alone: its own 0; then its outcome 0
    assert [len(e) for e in got.episode_ends] == [3, 3, 3]
    for v in got.values:
        assert v == pytest.approx([0.4, 1 / 3, 0.0, 0.0])
    # the two traces of prompt "q" share its samples: one engine call over 2 contexts, and one verifier
    # call with the 3 traces and 4 samples per prompt
    assert len(model.contexts) == 1 and len(model.contexts[0]) == 2
    assert len(texts) == 3 + 2 * 4
    # a trace the verifier could not score has no values
    nan = compute_prefix_values(
        GroupPolicy(tok), tok, batch, cfg, score_fn=lambda s, t: [math.nan] + [1.0] * (len(t) - 1)
    )
    assert all(math.isnan(x) for x in nan.values[0]) and nan.values[2] == pytest.approx([1.0] * 4)


def test_the_trainer_s_channels_carry_the_shared_prefix_share(scored_batch: Callable[..., Batch]) -> None:
    """``reward_channels`` computes the group's values and the share ``prepare`` logs from one prefix
    matching; another estimator's channels carry no share."""
    from stepcredit.config import from_dict
    from stepcredit.reward import with_failure_policy
    from stepcredit.trainer.update import reward_channels
    from stepcredit.types import RewardResult, Status

    ok = [RewardResult(score=s, status=Status.OK) for s in (1.0, 0.0, 1.0, 1.0)]
    # every response is 3 equal tokens, so each group's two responses share every prefix
    batch = scored_batch(ok, [0, 0, 1, 1], 3, episode_ends=[[0, 2]] * 4, prefix_values=[[0.0, 0.0, 0.0]] * 4)
    cfg = from_dict({"process": {"enabled": True, "value_estimator": "group_prefix"}})
    _, ch = reward_channels(with_failure_policy(batch, cfg.reward), cfg)
    assert ch.shared_prefix_frac == shared_prefix_share([0, 0, 1, 1], [[1, 1, 1]] * 4, [[0, 2]] * 4) == 1.0
    # the mixed group's step credit: both responses valued 0.5 after token 0, then their own outcomes
    assert ch.process_BT is not None
    assert ch.process_BT[:2, 2].tolist() == pytest.approx([0.5, -0.5])
    assert ch.to(torch.device("cpu")).shared_prefix_frac == 1.0
    cfg = from_dict({"process": {"enabled": True, "value_estimator": "greedy_continuation"}})
    assert reward_channels(with_failure_policy(batch, cfg.reward), cfg)[1].shared_prefix_frac is None


def test_equal_to_the_definition_on_random_groups() -> None:
    """Against V(p) computed straight from its definition (every valid response of the group that
    begins with p, prefix compared whole at each end), on random groups with few distinct tokens so
    that prefixes are shared, and the share likewise."""
    import random

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 6)
        group = [rng.randint(0, 1) for _ in range(n)]
        responses = [[rng.randint(0, 2) for _ in range(rng.randint(1, 8))] for _ in range(n)]
        ends = [sorted(rng.sample(range(len(r)), rng.randint(1, len(r)))) for r in responses]
        ends = [e if e[-1] == len(r) - 1 else [*e, len(r) - 1] for e, r in zip(ends, responses, strict=True)]
        score = [float(rng.randint(0, 1)) for _ in range(n)]
        valid = [rng.random() > 0.2 for _ in range(n)]
        want = []
        for b in range(n):
            scored = [j for j in range(n) if group[j] == group[b] and valid[j]]
            values = [sum(score[j] for j in scored) / len(scored) if scored else 0.0]
            for e in ends[b][:-1]:
                p = responses[b][: e + 1]
                rows = [j for j in scored if responses[j][: e + 1] == p]
                values.append(sum(score[j] for j in rows) / len(rows) if rows else values[-1])
            values.append(score[b] if valid[b] else values[-1])
            want.append(values)
        got = group_prefix_values(group, responses, ends, score, valid)
        assert [len(v) for v in got] == [len(v) for v in want]
        assert [x for v in got for x in v] == pytest.approx([x for v in want for x in v])
        inner = [(b, e) for b in range(n) for e in ends[b][:-1]]
        shared = sum(
            any(
                j != b and group[j] == group[b] and responses[j][: e + 1] == responses[b][: e + 1]
                for j in range(n)
            )
            for b, e in inner
        )
        assert shared_prefix_share(group, responses, ends) == (shared / len(inner) if inner else None)
