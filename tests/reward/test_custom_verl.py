"""VeRL-style custom reward functions (``reward.custom.path``, VeRL's ``custom_reward_function``) as
VeRL's users write them: called as VeRL's reward managers call them (by name, ``reward_kwargs``
merged in), every return VeRL accepts scored the same, everything VeRL would crash on or silently
take (None, NaN, a string) a typed ``error`` with the function's own message, and every loading
problem one ConfigError line naming the file or the function."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from stepcredit.cli import main as cli
from stepcredit.config import AgentConfig, RewardConfig, RewardCustomConfig
from stepcredit.errors import ConfigError
from stepcredit.reward import build_rewarder
from stepcredit.types import Sample, Status

FUNCS = textwrap.dedent(
    """
    import asyncio
    import numpy as np

    def scaled(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
        # reward_kwargs as named parameters, no **kwargs
        return float(solution_str == ground_truth) * scale

    def only_kwargs(**kwargs):
        return float(kwargs["solution_str"] == kwargs["ground_truth"])

    def reordered(solution_str, ground_truth, data_source=None, extra_info=None):
        # VeRL calls by name, so this order is fine there; by position it would compare the data source
        return float(solution_str == ground_truth)

    async def async_only_kwargs(**kwargs):
        # VeRL's reward loop awaits an async compute_score
        await asyncio.sleep(0)
        return float(kwargs["solution_str"] == kwargs["ground_truth"])

    def as_int(data_source, solution_str, ground_truth, extra_info=None):
        return int(solution_str == ground_truth)

    def as_bool(data_source, solution_str, ground_truth, extra_info=None):
        return solution_str == ground_truth

    def as_numpy(data_source, solution_str, ground_truth, extra_info=None):
        return np.float32(solution_str == ground_truth)

    def as_numpy_bool(data_source, solution_str, ground_truth, extra_info=None):
        return np.bool_(solution_str == ground_truth)

    def as_dict(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": float(solution_str == ground_truth), "acc": solution_str == ground_truth, "len": 1}

    def no_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"acc": 1.0}

    def none(data_source, solution_str, ground_truth, extra_info=None):
        return None

    def nan(data_source, solution_str, ground_truth, extra_info=None):
        return float("nan")

    def text(data_source, solution_str, ground_truth, extra_info=None):
        return "1.0"

    def raises(data_source, solution_str, ground_truth, extra_info=None):
        raise ValueError("my own message")

    def batch_kwargs_only(**kwargs):
        return [float(s == g) * kwargs.get("scale", 1.0)
                for s, g in zip(kwargs["solution_strs"], kwargs["ground_truths"])]

    def batch_dicts(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
        return [{"score": float(s == g), "acc": s == g} for s, g in zip(solution_strs, ground_truths)]

    async def batch_async(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
        await asyncio.sleep(0)
        return [float(s == g) for s, g in zip(solution_strs, ground_truths)]

    def too_few(solution_str, ground_truth):
        return 1.0
    """
)


@pytest.fixture
def funcs(tmp_path: Path) -> Path:
    p = tmp_path / "verl_rewards.py"
    p.write_text(FUNCS)
    return p


SAMPLES = [Sample(prompt=(), ground_truth="x", data_source="mine", uid=str(i)) for i in range(2)]


def _score(spec: str, *, isolate: bool = False, **custom: Any) -> list[tuple[float, Status, dict[str, Any]]]:
    cfg = RewardConfig(
        custom=RewardCustomConfig(path=spec, isolate=isolate, **custom), agent=AgentConfig(batch_size=8)
    )
    with build_rewarder(cfg) as rw:
        return [(r.score, r.status, r.info) for r in rw.score_batch(SAMPLES, ["x", "y"])]


@pytest.mark.parametrize(
    ("fn", "custom"),
    [
        ("scaled", {"kwargs": {"scale": 1.0}}),
        ("only_kwargs", {}),
        ("reordered", {}),
        ("async_only_kwargs", {}),
        ("as_int", {}),
        ("as_bool", {}),
        ("as_numpy", {}),
        ("as_numpy_bool", {}),
        ("batch_kwargs_only", {"batched": True}),
        ("batch_async", {"batched": True}),
    ],
)
def test_what_verl_accepts_scores_the_same(funcs: Path, fn: str, custom: dict[str, Any]) -> None:
    # VeRL: default_compute_score / the naive manager turn int, bool and numpy scalars into floats
    got = _score(f"{funcs}:{fn}", **custom)
    assert [(s, st) for s, st, _ in got] == [(1.0, Status.OK), (0.0, Status.OK)]


@pytest.mark.parametrize(("fn", "custom"), [("as_dict", {}), ("batch_dicts", {"batched": True})])
def test_a_dicts_extra_keys_are_kept(funcs: Path, fn: str, custom: dict[str, Any]) -> None:
    # VeRL logs a dict's other keys as reward_extra_info; here they are each result's info
    got = _score(f"{funcs}:{fn}", **custom)
    assert [(s, st, info["acc"]) for s, st, info in got] == [(1.0, Status.OK, True), (0.0, Status.OK, False)]


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("no_score", "returned a dict without 'score' (keys: ['acc'])"),  # VeRL: KeyError 'score'
        ("none", "returned NoneType None, expected a number"),  # VeRL: TypeError on the tensor
        ("nan", "returned a non-finite score nan"),  # VeRL: a NaN reward, silently
        ("text", "returned str '1.0', expected a number"),
        ("raises", "ValueError: my own message"),
    ],
)
def test_what_verl_cannot_use_is_a_typed_error_never_a_zero(funcs: Path, fn: str, message: str) -> None:
    for score, status, info in _score(f"{funcs}:{fn}"):
        assert status is Status.ERROR and math.isnan(score) and message in info["message"]


def test_the_kill_safe_pool_calls_by_name_and_imports_a_file_beside_it(tmp_path: Path) -> None:
    # a worker process loads the file again: its sibling import and VeRL's by-name call work there too
    (tmp_path / "my_helpers.py").write_text("def same(a, b):\n    return float(a == b)\n")
    (tmp_path / "uses_helpers.py").write_text(
        "from my_helpers import same\n\n"
        "def compute_score(solution_str, ground_truth, **kwargs):\n"
        "    return same(solution_str, ground_truth) * kwargs['scale']\n"
    )
    got = _score(str(tmp_path / "uses_helpers.py"), isolate=True, kwargs={"scale": 2.0})
    assert [(s, st) for s, st, _ in got] == [(2.0, Status.OK), (0.0, Status.OK)]


def test_a_file_named_like_a_standard_module_shadows_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "rewards"
    folder.mkdir()
    (folder / "random.py").write_text(
        "import random\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(hasattr(random, 'shuffle'))\n"
    )
    # the file is loaded under its own module name: `import random` there is still the standard one
    assert [s for s, _, _ in _score(str(folder / "random.py"))] == [1.0, 1.0]
    import random

    assert random.__file__ != str(folder / "random.py") and str(folder) not in sys.path[:1]


def test_loading_problems_are_one_line_naming_file_and_function(funcs: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"too_few\(solution_str, ground_truth\) cannot be called as VeRL"):
        _score(f"{funcs}:too_few")
    with pytest.raises(ConfigError, match=r"fn\(data_sources=\.\.\., .*\(reward.custom.batched=true\)"):
        _score(f"{funcs}:too_few", batched=True)
    with pytest.raises(ConfigError, match=rf"{funcs} has no 'missing' \(callables there: .*as_bool"):
        _score(f"{funcs}:missing")
    with pytest.raises(
        ConfigError, match=r"reward.custom.path=.*nope.py: reward function file .*nope.py does not exist"
    ):
        _score(str(tmp_path / "nope.py"))
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("X = 1\n")
    (pkg / "relative.py").write_text("from .helpers import X\n\ndef compute_score(**kwargs):\n    return X\n")
    with pytest.raises(ConfigError, match=r"relative import.*import absolutely, or name it pkg.module:fn"):
        _score(str(pkg / "relative.py"))


def test_stepcredit_score_calls_by_name_and_writes_the_extra_keys(
    funcs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "COMMANDS", {k: v for k, v in cli.COMMANDS.items() if k == "score"})
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        "".join(
            json.dumps({"data_source": "mine", "solution_str": r, "ground_truth": "x"}) + "\n" for r in "xy"
        )
    )
    out = tmp_path / "out.jsonl"
    args = ["score", "--in", str(inp), "--out", str(out), "--custom", f"{funcs}:as_dict"]
    assert cli.main([*args, "reward.custom.isolate=false"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["score"], r["status"], r["info"]["acc"]) for r in rows] == [
        (1.0, "ok", True),
        (0.0, "ok", False),
    ]
