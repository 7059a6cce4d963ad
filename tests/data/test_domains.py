"""Multi-domain data: exact per-step composition, domain and tag on every row, the code task."""

from __future__ import annotations

import pytest

from stepcredit.config import DataConfig, DomainDataConfig, from_dict
from stepcredit.data.domains import MixedStream, build_data, check_routes, domain_counts, load_domains
from stepcredit.errors import ConfigError
from stepcredit.reward import Rewarder
from stepcredit.types import Sample


@pytest.mark.parametrize(
    ("probs", "k", "want"),
    [
        ([0.5, 0.5], 8, [4, 4]),
        ([0.3, 0.3, 0.4], 10, [3, 3, 4]),
        ([0.25, 0.75], 3, [0, 3]),  # floor(0.75) = 0: the last domain takes the whole remainder
        ([0.34, 0.33, 0.33], 10, [3, 3, 4]),  # floor 3.4 -> 3, floor 3.3 -> 3, remainder 4
        ([0.29, 0.71], 100, [29, 71]),  # 0.29 * 100 = 28.999999999999996 in floats: still 29
        ([1.0], 5, [5]),
    ],
)
def test_domain_counts_floor_and_remainder(probs: list[float], k: int, want: list[int]) -> None:
    assert domain_counts(probs, k) == want


def _samples(domain: str, n: int) -> list[Sample]:
    return [
        Sample(prompt=({"role": "user", "content": f"{domain}{i}"},), ground_truth="1", domain=domain)
        for i in range(n)
    ]


def test_every_step_has_the_exact_composition_and_resumes() -> None:
    sets = {"a": _samples("a", 5), "b": _samples("b", 7), "c": _samples("c", 3)}
    probs = {"a": 0.2, "b": 0.5, "c": 0.3}
    s = MixedStream(sets, probs, seed=3)
    for _ in range(9):  # several epochs of every domain
        got = [x.domain for x in s.take(7)]
        # floor(1.4) = 1 of a, floor(3.5) = 3 of b, the remaining 3 of c, in domain order
        assert got == ["a"] + ["b"] * 3 + ["c"] * 3
    state = s.state_dict()
    after = [x.prompt for x in s.take(7)]
    t = MixedStream(sets, probs, seed=3)
    t.load_state_dict(state)
    assert [x.prompt for x in t.take(7)] == after


def test_rows_keep_domain_and_tag() -> None:
    cfg = DataConfig(
        train_size=6,
        val_size=3,
        domains={
            "maths": DomainDataConfig(task="arith", tag="arith"),
            "coding": DomainDataConfig(task="code"),
        },
    )
    sets = load_domains(cfg)
    assert {s.domain for s in sets["maths"][0] + sets["maths"][1]} == {"maths"}
    assert {s.tag for s in sets["maths"][0]} == {"arith"}
    assert {s.tag for s in sets["coding"][0]} == {"code"}  # no tag set: the row's own (its data_source)
    train, val, stream = build_data(cfg, seed=0)
    assert len(train) == 12 and len(val) == 6
    assert [x.domain for x in stream.take(4)] == ["maths", "maths", "coding", "coding"]  # equal shares


def test_code_task_reference_solutions_pass_the_sandbox() -> None:
    from stepcredit.reward.verifiers.code.sandbox import SandboxConfig, get_sandbox, score_code_batch

    if get_sandbox(SandboxConfig()).unavailable():
        pytest.skip("bubblewrap sandbox unavailable")
    _, val = load_domains(DataConfig(val_size=4, domains={"code": DomainDataConfig(task="code")}))["code"]
    sols = [s.extra_info["solution"] for s in val]
    wrong = [x.replace("return x", "return 1 + x") for x in sols]
    res = score_code_batch(sols + wrong, [s.ground_truth for s in val] * 2)
    assert [r.score for r in res] == [1.0] * 4 + [0.0] * 4


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (
            {
                "domains": {"a": {"task": "arith"}, "b": {"task": "code"}},
                "domain_interleave_probs": {"a": 0.5, "b": 0.6},
            },
            "must sum to 1",
        ),
        ({"domains": {"a": {"task": "arith"}, "b": {}}}, "data.domains.b"),
        (
            {"domains": {"a": {"task": "arith"}}, "domain_interleave_probs": {"z": 1.0}},
            "data.domain_interleave_probs.z",
        ),
        (
            {
                "domains": {"a": {"task": "arith"}, "b": {"task": "code"}},
                "domain_interleave_probs": {"a": 1.0},
            },
            "no share",
        ),
    ],
)
def test_bad_domain_config(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        from_dict({"data": data})


def test_tag_without_reward_route_is_a_config_error() -> None:
    s = Sample(
        prompt=({"role": "user", "content": "q"},),
        ground_truth="1",
        data_source="nowhere",
        ability="poetry",
        domain="d",
        tag="t",
    )
    with Rewarder() as r, pytest.raises(ConfigError, match="domain 'd', tag 't'"):
        check_routes([s], r.route)
