"""TRL-style reward functions (``reward.custom.style=trl``): a function from TRL's documentation scores
the same through ``stepcredit score`` as called directly; weights, None and failures are typed."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from stepcredit.cli import main as cli
from stepcredit.config import RewardConfig, RewardCustomConfig
from stepcredit.errors import ConfigError
from stepcredit.reward import TrainingProgress, build_agent, build_rewarder
from stepcredit.types import Sample, Status

# Reward functions as TRL's GRPOTrainer documentation shows them ("Using a custom reward function":
# rewarding completions that match a reference; a conversational format reward; a multi-task reward
# that returns None for samples of another task), plus two broken ones.
TRL_FUNCS = textwrap.dedent(
    r"""
    import re

    def reward_func(completions, ground_truth, **kwargs):
        # Regular expression to capture content inside \boxed{}
        matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
        contents = [match.group(1) if match else "" for match in matches]
        # Reward 1 if the content is the same as the ground truth, 0 otherwise
        return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]

    def format_reward_func(completions, **kwargs):
        pattern = r"^<think>.*?</think><answer>.*?</answer>$"
        completion_contents = [completion[0]["content"] for completion in completions]
        matches = [re.match(pattern, content) for content in completion_contents]
        return [1.0 if match else 0.0 for match in matches]

    def math_reward_func(completions, task, **kwargs):
        return [(1.0 if "42" in c else 0.0) if t == "math" else None for c, t in zip(completions, task)]

    def length_reward_func(prompts, completions, **kwargs):
        return [-abs(len(p) - len(c)) / 10 if t == "length" else None
                for p, c, t in zip(prompts, completions, kwargs["task"])]

    def raises(completions, **kwargs):
        raise RuntimeError("boom")

    def too_short(completions, **kwargs):
        return [1.0]

    # TRL's current reward-function signature, and an async one (TRL runs those concurrently)
    def with_ids(prompts, completions, completion_ids, ground_truth, trainer_state, **kwargs):
        return [float(c == gt) for c, gt in zip(completions, ground_truth)]

    async def async_reward(completions, ground_truth, **kwargs):
        import asyncio
        await asyncio.sleep(0)
        return [float(c == gt) for c, gt in zip(completions, ground_truth)]

    def as_text(completions, **kwargs):
        return ["1.0" for _ in completions]

    def curriculum(completions, ground_truth, trainer_state, **kwargs):
        # a reward whose weight grows with training, keyed to TRL's trainer_state
        if trainer_state is None:
            return [-1.0 for _ in completions]
        w = trainer_state.global_step / trainer_state.max_steps
        return [w * float(c == gt) for c, gt in zip(completions, ground_truth)]

    def logging_curriculum(completions, trainer_state, log, **kwargs):
        import json
        with open(log, "a") as f:
            f.write(json.dumps([trainer_state.global_step, trainer_state.max_steps]) + "\n")
        return [float(len(c) % 2) for c in completions]
    """
)


@pytest.fixture
def funcs(tmp_path: Path) -> Path:
    p = tmp_path / "trl_rewards.py"
    p.write_text(TRL_FUNCS)
    return p


def _module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("trl_rewards_direct", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cfg(spec: str, **kw: Any) -> RewardConfig:
    return RewardConfig(custom=RewardCustomConfig(path=spec, style="trl", **kw))


def _sample(gt: str, task: str = "math", prompt: str = "What is six times seven?") -> Sample:
    return Sample(
        prompt=({"role": "user", "content": prompt},),
        ground_truth=gt,
        data_source="mine",
        extra_info={"task": task},
    )


def test_trl_documentation_function_scores_the_same_through_stepcredit_score(
    funcs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "COMMANDS", {k: v for k, v in cli.COMMANDS.items() if k == "score"})
    responses = ["so \\boxed{42}", "\\boxed{41}", "no box here: 42", "\\boxed{7} and \\boxed{42}", ""]
    truths = ["42", "42", "42", "7", "0"]
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        "".join(
            json.dumps({"data_source": "mine", "response": r, "ground_truth": g}) + "\n"
            for r, g in zip(responses, truths, strict=True)
        )
    )
    out = tmp_path / "out.jsonl"
    argv = ["score", "--in", str(inp), "--out", str(out), "--custom", f"{funcs}:reward_func"]
    assert cli.main([*argv, "reward.custom.style=trl"]) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    direct = _module(funcs).reward_func(completions=responses, ground_truth=truths)
    assert [g["score"] for g in got] == direct == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert {g["status"] for g in got} == {"ok"} and {g["source"] for g in got} == {"custom"}


def test_several_functions_weights_and_none(funcs: Path) -> None:
    samples = [
        _sample("42", "math"),
        _sample("42", "length", prompt="abcdefghij"),
        _sample("42", "other"),
    ]
    responses = ["it is 42", "abcde", "whatever"]
    spec = f"{funcs}:math_reward_func,{funcs}:length_reward_func"
    with build_rewarder(_cfg(spec, weights=[2.0, 0.5])) as rw:
        res = rw.score_batch(samples, responses)
    # math: 2.0 * 1.0 (length says None); length: 0.5 * -(|10 - 5| / 10) (math says None)
    assert res[0].status is Status.OK and res[0].score == 2.0
    assert res[1].status is Status.OK and res[1].score == pytest.approx(0.5 * -0.5)
    assert res[1].info["rewards"] == {f"{funcs}:math_reward_func": None, f"{funcs}:length_reward_func": -0.5}
    # no function applies: a typed unscored result, not a silent 0
    assert res[2].status is Status.UNSCORED and not res[2].ok and res[2].info["rewards"]


def test_conversational_format_through_the_agent(funcs: Path) -> None:
    samples = [_sample("x"), _sample("x")]
    responses = ["<think>hm</think><answer>4</answer>", "4"]
    cfg = _cfg(f"{funcs}:format_reward_func", trl_format="conversational")
    with build_agent(cfg) as agent:
        res = agent.score_batch(samples, responses, [0, 0])
    assert [r.score for r in res] == [1.0, 0.0]


@pytest.mark.parametrize(
    ("fn", "message"), [("raises", "RuntimeError: boom"), ("too_short", "returned 1 values for 2")]
)
def test_a_failing_function_is_an_error_for_its_samples(funcs: Path, fn: str, message: str) -> None:
    with build_rewarder(_cfg(f"{funcs}:reward_func,{funcs}:{fn}")) as rw:
        res = rw.score_batch([_sample("1"), _sample("2")], ["\\boxed{1}", "x"])
    assert all(r.status is Status.ERROR and message in r.info["message"] for r in res)


def test_configuration_errors_name_the_key(funcs: Path) -> None:
    with pytest.raises(ConfigError, match=r"reward.custom.weights: 1 weights for 2 functions"):
        build_rewarder(_cfg(f"{funcs}:reward_func,{funcs}:math_reward_func", weights=[1.0]))
    with pytest.raises(ConfigError, match=r"reward.custom.path=.*nope"):
        build_rewarder(_cfg(f"{funcs}:nope"))
    with pytest.raises(ConfigError, match=r"unknown reward.custom.style 'trll'.*valid: trl, verl"):
        build_rewarder(RewardConfig(custom=RewardCustomConfig(path=f"{funcs}:reward_func", style="trll")))
    with pytest.raises(ConfigError, match=r"reward.custom.trl_format"):
        RewardCustomConfig(trl_format="chat")


@pytest.mark.parametrize("fn", ["with_ids", "async_reward"])
def test_trls_signature_and_async_functions(funcs: Path, fn: str) -> None:
    # completion_ids (None: stepcredit scores text) and trainer_state are passed as TRL passes them
    with build_rewarder(_cfg(f"{funcs}:{fn}")) as rw:
        res = rw.score_batch([_sample("42"), _sample("42")], ["42", "41"])
    assert [(r.score, r.status) for r in res] == [(1.0, Status.OK), (0.0, Status.OK)]


def test_trainer_state_carries_the_step_as_trl_passes_it(funcs: Path) -> None:
    # TRL passes its Trainer.state: a function keyed to the step (a curriculum) reads global_step and
    # max_steps. Outside training (stepcredit score, eval) there is no state: None, as before.
    spec = f"{funcs}:curriculum"
    with build_rewarder(_cfg(spec)) as rw:
        assert [r.score for r in rw.score_batch([_sample("42")], ["42"])] == [-1.0]
        res = rw.score_batch(
            [_sample("42"), _sample("42")],
            ["42", "41"],
            progress=TrainingProgress(global_step=3, max_steps=4),
        )
    assert [(r.score, r.status) for r in res] == [(0.75, Status.OK), (0.0, Status.OK)]
    with build_agent(_cfg(spec)) as agent:  # a rollout batch's progress, through the agent's submit
        t = agent.submit_samples(
            [_sample("42")], ["42"], progress=TrainingProgress(global_step=1, max_steps=4)
        )
        assert [r.score for r in agent.get(t, 0)[1]] == [0.25]


def test_a_trl_curriculum_sees_each_step_of_a_training_run(
    funcs: Path, tmp_path: Path, tiny_train: list[str]
) -> None:
    # through `stepcredit train`: every rollout batch is scored with the RL steps done by the weights
    # that generated it (0, 1, 2 of 3), validation with the steps done so far; max_steps is trainer.steps
    log = tmp_path / "seen.jsonl"
    args = [*tiny_train, "sft.steps=0", "trainer.steps=3", "trainer.val_every=3", "trainer.save_every=0",
            "reward.custom.style=trl", f"reward.custom.path={funcs}:logging_curriculum",
            f"reward.custom.kwargs={{log: '{log}'}}"]  # fmt: skip
    assert cli.main(["train", *args, "--out", str(tmp_path / "run")]) == 0
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert {tuple(x) for x in seen} == {(0, 3), (1, 3), (2, 3), (3, 3)}, seen
    assert [x[0] for x in seen if x[0] < 3] == sorted(x[0] for x in seen if x[0] < 3)  # in step order


def test_a_string_reward_is_an_error_as_in_trl(funcs: Path) -> None:
    # TRL's torch.tensor(rewards) refuses text; float("1.0") would have taken it silently
    with build_rewarder(_cfg(f"{funcs}:as_text")) as rw:
        res = rw.score_batch([_sample("1")], ["x"])
    assert res[0].status is Status.ERROR and "returned str '1.0' at index 0" in res[0].info["message"]


class _StepScorer:
    """A scorer that reads the training progress (as a registered scorer may): the step, or -1."""

    def score_batch(self, samples: list[Sample], responses: list[str]) -> list[Any]:
        from stepcredit.reward.base import current_progress
        from stepcredit.types import RewardResult

        p = current_progress()
        return [RewardResult(score=float(p.global_step) if p else -1.0) for _ in samples]

    def close(self) -> None:
        pass


def test_a_ray_hosted_scorer_gets_the_progress_its_job_carries() -> None:
    # a remote scorer's job carries the batch's progress to the actor (ScorerActor, called directly
    # here: the actor class is plain Python that Ray wraps), which sets it around the scorer's call
    import pickle

    from stepcredit.reward.base import REWARDS, register_scorer
    from stepcredit.reward.run.chunks import decode_all
    from stepcredit.reward.run.ray_backend import ScorerActor

    def scores(answer: bytes) -> list[float]:
        return [r.score for r in decode_all(pickle.loads(answer), "s") if r is not None]

    register_scorer("test_step_scorer", override=True)(lambda cfg: _StepScorer())
    try:
        actor = ScorerActor([], "test_step_scorer", RewardConfig())
        items = [(_sample("1"), "1")]
        assert scores(actor.run(items, "s")) == [-1.0]
        assert scores(actor.run(items, "s", TrainingProgress(global_step=5, max_steps=9))) == [5.0]
    finally:
        REWARDS._items.pop("test_step_scorer", None)
