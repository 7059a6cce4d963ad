"""Routing, users' own functions, the failure policy and metrics (no pool unless a test needs one)."""

from __future__ import annotations

import math
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from stepcredit.config import AgentConfig, RewardConfig, RewardCustomConfig, RewardDomainConfig, from_dict
from stepcredit.errors import ConfigError
from stepcredit.reward import (
    REWARDS,
    apply_failure_policy,
    build_agent,
    build_rewarder,
    register_scorer,
    resolve_source,
    reward_metrics,
    to_result,
)
from stepcredit.types import RewardResult, Sample, Status


def _s(gt: str = "42", ds: str = "arith", **kw: object) -> Sample:
    return Sample(prompt=(), ground_truth=gt, data_source=ds, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "source",
    [
        "openai/gsm8k",
        "lighteval/MATH",
        "DigitalLearningGmbH/MATH-lighteval",
        "HuggingFaceH4/MATH-500",
        "math_dapo",
        "math",
        "aime2024",
        "aime_2025",
        "arith",
    ],
)
def test_verl_data_sources_route_to_the_math_verifier(source: str) -> None:
    assert resolve_source(source).name == "math"


def test_arith_scores_exact_integers_inline_in_order() -> None:
    rw = build_rewarder()
    res = rw.score_batch(
        [_s("42"), _s("7"), _s("42")], ["So... The answer is 42.", "The answer is 8.", "blah"]
    )
    assert [(r.score, r.status) for r in res] == [
        (1.0, Status.OK),
        (0.0, Status.OK),
        (0.0, Status.UNPARSEABLE),
    ]
    assert all(r.source == "math" for r in res)
    assert rw.agent._backend is None  # the fast path never started a process
    rw.close()


def test_unknown_source_is_an_error_result_not_a_crash() -> None:
    rw = build_rewarder()
    r = rw.score_batch([_s(ds="no_such_source")], ["The answer is 42."])[0]
    assert r.status == Status.ERROR and math.isnan(r.score) and "no_such_source" in r.info["message"]
    rw.close()


def test_math_kwargs_select_strict_mode_and_format_score() -> None:
    rw = build_rewarder(RewardConfig(kwargs={"math": {"mode": "strict", "format_score": 0.1}}))
    res = rw.score_batch([_s(), _s()], ["it is 42", "The answer is 41."])
    assert [(r.score, r.status) for r in res] == [(0.0, Status.UNPARSEABLE), (0.1, Status.OK)]
    rw.close()
    with pytest.raises(ConfigError, match="mathh"):
        build_rewarder(RewardConfig(kwargs={"mathh": {}}))


USER = textwrap.dedent(
    """
    import asyncio

    def as_float(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return float(solution_str.strip() == ground_truth) * kwargs.get("scale", 1.0)

    def as_dict(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return {"score": 1.0, "acc": True, "pred": solution_str}

    def as_tuple(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return (0.5, {"why": "half"})

    def raises(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        raise KeyError("nope")

    def nan(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return float("nan")

    async def coro(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        await asyncio.sleep(0)
        return 1.0

    CALLS = []

    def batch_exact(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
        CALLS.append(len(solution_strs))
        return [float(s.strip() == g) for s, g in zip(solution_strs, ground_truths)]

    class Centred:
        def __init__(self):
            self.calls = 0

        def compute_score(self, data_source, solution_str, ground_truth, extra_info=None, **kwargs):
            self.calls += 1
            return float(solution_str == ground_truth)

        def post_process_scores(self, scores):
            mean = sum(scores) / len(scores)
            return [s - mean for s in scores]
    """
)


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    p = tmp_path / "my_reward.py"
    p.write_text(USER)
    return p


def _custom(path: Path, fn: str, *, isolate: bool = False, **kwargs: object) -> RewardConfig:
    return RewardConfig(custom=RewardCustomConfig(path=f"{path}:{fn}", kwargs=dict(kwargs), isolate=isolate))


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        ("as_float", (2.0, Status.OK)),
        ("as_dict", (1.0, Status.OK)),
        ("as_tuple", (0.5, Status.OK)),
        ("coro", (1.0, Status.OK)),
    ],
)
def test_custom_function_returns(user_file: Path, fn: str, expected: tuple[float, Status]) -> None:
    rw = build_rewarder(_custom(user_file, fn, scale=2.0))
    r = rw.score_batch([_s("x")], ["x"])[0]
    assert (r.score, r.status) == expected and r.source == "custom"
    rw.close()


@pytest.mark.parametrize("fn", ["raises", "nan"])
def test_custom_function_failures_are_errors(user_file: Path, fn: str) -> None:
    rw = build_rewarder(_custom(user_file, fn))
    r = rw.score_batch([_s("x")], ["x"])[0]
    assert r.status == Status.ERROR and math.isnan(r.score)
    rw.close()


def test_stateful_class_with_post_process_per_group(user_file: Path) -> None:
    rw = build_rewarder(_custom(user_file, "Centred"))
    samples = [_s("a"), _s("a"), _s("b"), _s("b")]
    res = rw.score_batch(samples, ["a", "z", "b", "b"], group_B=[0, 0, 1, 1])
    # Group 0: raw [1, 0], mean 0.5 -> [0.5, -0.5]; group 1: raw [1, 1] -> [0, 0].
    assert [r.score for r in res] == [0.5, -0.5, 0.0, 0.0]
    assert rw.custom is not None and rw.custom.fn.__self__.calls == 4  # type: ignore[union-attr]
    rw.close()


def test_custom_module_path_and_missing_targets(user_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(user_file.parent))
    rw = build_rewarder(RewardConfig(custom=RewardCustomConfig(path="my_reward:as_float", isolate=False)))
    assert rw.score_batch([_s("x")], ["x"])[0].score == 1.0
    rw.close()
    with pytest.raises(ConfigError, match=r"reward.custom.path=.*does not exist"):
        build_rewarder(RewardConfig(custom=RewardCustomConfig(path=str(user_file.parent / "nope.py:f"))))
    with pytest.raises(ConfigError, match="has no 'missing'"):
        build_rewarder(RewardConfig(custom=RewardCustomConfig(path=f"{user_file}:missing")))
    with pytest.raises(ConfigError, match="cannot be imported"):
        build_rewarder(RewardConfig(custom=RewardCustomConfig(path="no_such_pkg.mod:fn")))


def test_domain_routing_with_weight_and_tag_map(user_file: Path) -> None:
    cfg = from_dict(
        {
            "reward": {
                "domains": {
                    "words": {"fn": f"{user_file}:as_float", "weight": 0.5},
                    "numbers": {"fn": "math"},
                },
                "tag_domains": {"wordy": "words"},
                "custom": {"isolate": False},
            }
        }
    ).reward
    rw = build_rewarder(cfg)
    res = rw.score_batch(
        [_s("x", tag="wordy"), _s("42", domain="numbers"), _s("42")],
        ["x", "The answer is 42.", "The answer is 42."],
    )
    assert [(r.score, r.source) for r in res] == [(0.5, "domain:words"), (1.0, "math"), (1.0, "math")]
    rw.close()
    with pytest.raises(ConfigError, match=r"reward\.domains\.bad\.fn"):
        build_rewarder(RewardConfig(domains={"bad": RewardDomainConfig(fn="no_such_reward")}))


def test_style_model_routes_to_a_registered_scorer() -> None:
    class Const:
        closed = False

        def score_batch(self, samples: list[Sample], responses: list[str]) -> list[RewardResult]:
            return [RewardResult(score=float(len(r))) for r in responses]

        def close(self) -> None:
            Const.closed = True

    register_scorer("test-style", override=True)(lambda cfg: Const())
    try:
        rw = build_rewarder()
        res = rw.score_batch(
            [_s(style="test-style"), _s(), _s(style="test-style")], ["ab", "The answer is 42.", "abc"]
        )
        assert [(r.score, r.source) for r in res] == [(2.0, "test-style"), (1.0, "math"), (3.0, "test-style")]
        rw.close()
        assert Const.closed
    finally:
        REWARDS._items.pop("test-style", None)


def test_to_result_coercions() -> None:
    assert to_result(True).score == 1.0
    assert to_result(torch.tensor(0.25)).score == 0.25
    assert to_result({"acc": 1}).status == Status.ERROR
    assert to_result("1").status == Status.ERROR
    assert to_result(()).status == Status.ERROR


def _r(status: Status, score: float = 1.0, source: str = "math") -> RewardResult:
    r = (
        RewardResult(score=score, status=status, source=source)
        if status in (Status.OK, Status.UNPARSEABLE)
        else (RewardResult.failure(status, "x"))
    )
    r.source = source
    return r


@pytest.mark.parametrize(
    ("policy", "score", "valid", "keep"),
    [
        # Results: group 0 = [ok 1, timeout], group 1 = [unparseable 0, ok 1].
        ("mask", [1.0, 0.0, 0.0, 1.0], [True, False, True, True], [True, True, True, True]),
        ("score", [1.0, -1.0, 0.0, 1.0], [True, True, True, True], [True, True, True, True]),
        ("drop_group", [1.0, 0.0, 0.0, 1.0], [False, False, True, True], [False, False, True, True]),
    ],
)
def test_failure_policy(policy: str, score: list[float], valid: list[bool], keep: list[bool]) -> None:
    results = [_r(Status.OK), _r(Status.TIMEOUT), _r(Status.UNPARSEABLE, 0.0), _r(Status.OK)]
    cfg = RewardConfig(failure_policy=policy, failure_score=-1.0)
    s, v, k = apply_failure_policy(results, torch.tensor([0, 0, 1, 1]), cfg)
    assert s.tolist() == score and v.tolist() == valid and k.tolist() == keep


def test_failure_policy_per_source() -> None:
    results = [_r(Status.ERROR, source="math"), _r(Status.ERROR, source="custom")]
    cfg = RewardConfig(failure_policy="mask", failure_score=0.5, failure_policy_by_source={"custom": "score"})
    s, v, _ = apply_failure_policy(results, [0, 1], cfg)
    assert s.tolist() == [0.0, 0.5] and v.tolist() == [False, True]
    with pytest.raises(ConfigError, match=r"failure_policy_by_source\.custom"):
        RewardConfig(failure_policy_by_source={"custom": "ignore"})


def test_metrics_count_statuses_and_latency_percentiles() -> None:
    results = [_r(Status.OK) for _ in range(19)] + [_r(Status.TIMEOUT)]
    for i, r in enumerate(results):
        r.latency_s = (i + 1) / 1000.0  # 1 .. 20 ms
    m = reward_metrics(results)
    # Nearest rank: p50 = 10th of 20 values = 10 ms, p95 = 19th = 19 ms.
    assert m["reward/math/status/ok"] == 19 and m["reward/math/status/timeout"] == 1
    assert m["reward/math/status/error"] == 0 and m["reward/math/count"] == 20
    assert m["reward/math/latency_p50_ms"] == pytest.approx(10.0)
    assert m["reward/math/latency_p95_ms"] == pytest.approx(19.0)
    assert m["reward/math/score_mean"] == 1.0


def test_unknown_data_source_routes_by_ability() -> None:
    from stepcredit.reward import build_rewarder
    from stepcredit.reward.base import REWARDS
    from stepcredit.types import Sample as _Sample

    entry = REWARDS.get(
        "code"
    )  # rows with ability ``code`` and an unregistered data_source go to the sandbox
    rw = build_rewarder()
    try:
        route = rw.route(_Sample(prompt=(), ground_truth="{}", data_source="my/own-code-set", ability="code"))
        assert route.entry is entry
        bad = rw.score_batch(
            [_Sample(prompt=(), ground_truth="1", data_source="nowhere", ability="poetry")], ["x"]
        )
        assert bad[0].status.value == "error" and not bad[0].ok
    finally:
        rw.close()


@pytest.mark.parametrize("isolate", [False, True])
def test_batched_custom_function_gets_one_call_from_score_batch(user_file: Path, isolate: bool) -> None:
    # VeRL's batch signature (reward.custom.batched): the plain rewarder (validation, `stepcredit
    # score`, the verl reward manager) calls it with the columns, not once per sample: through the
    # agent, whole groups of up to reward.agent.batch_size samples per call (here all three).
    cfg = RewardConfig(
        custom=RewardCustomConfig(path=f"{user_file}:batch_exact", batched=True, isolate=isolate),
        agent=AgentConfig(batch_size=8),
    )
    samples = [Sample(prompt=(), ground_truth=g, uid=str(i)) for i, g in enumerate(["7", "8", "9"])]
    with build_rewarder(cfg) as rw:
        got = rw.score_batch(samples, ["7", "0", " 9 "])
        assert [(r.score, r.status) for r in got] == [(1.0, Status.OK), (0.0, Status.OK), (1.0, Status.OK)]
        if not isolate:  # in-process: the module's call log is ours to read
            import sys

            mod = next(m for m in sys.modules.values() if getattr(m, "__file__", None) == str(user_file))
            assert mod.CALLS == [3]


def test_synchronous_scoring_and_the_trainers_agent_are_one_agent(user_file: Path) -> None:
    # Rewarder.score_batch is the synchronous face of the run's one reward agent: the trainer's agent
    # (build_agent with the rewarder) is that same agent, so validation, value estimators' verifier and
    # the training batches share its backend (one pool per run) and its counters.
    cfg = replace(_custom(user_file, "as_float"), agent=AgentConfig(backend="thread"))
    with build_rewarder(cfg) as rw:
        agent = build_agent(cfg, rw)
        assert agent is rw.agent and build_agent(None, rw) is agent
        samples = [Sample(prompt=(), ground_truth=g, uid=f"u{i}") for i, g in enumerate("ab")]
        assert [r.score for r in rw.score_batch(samples, ["a", "x"])] == [1.0, 0.0]
        ticket = agent.submit_samples(samples, ["x", "b"])
        assert [r.score for r in agent.get(ticket, 0)[1]] == [0.0, 1.0]
        assert agent.metrics()["agent/submitted"] == 4.0  # both submissions went through the one agent
        # the verifier value estimators get: batched, NaN where the reward failed
        verify = rw.verifier_fn()
        assert verify(samples, ["a", "b"]) == [1.0, 1.0]
        assert agent.metrics()["agent/submitted"] == 6.0
    # a separately configured agent owns its own routing and backend
    with build_rewarder(cfg) as rw, build_agent(replace(cfg, timeout_s=5.0), rw) as other:
        assert other is not rw.agent
