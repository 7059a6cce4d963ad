"""``stepcredit eval``: pass@k and maj@k by hand and against the definition, greedy pass@1 equal to the
trainer's validation accuracy, per-tag tables from a file, and errors a user can act on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stepcredit.cli import main as cli
from stepcredit.config import ModelConfig, TinyModelConfig
from stepcredit.trainer.evaluate import ks_of, majority_correct, pass_at_k, summarize

SMOKE = ["--preset", "smoke", "data.val_size=8", "rollout.max_new_tokens=12"]


@pytest.fixture(autouse=True)
def _only_our_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    # The parser imports every sub-command module; keep this test independent of the others.
    monkeypatch.setattr(cli, "COMMANDS", {k: v for k, v in cli.COMMANDS.items() if k == "eval"})


def test_pass_at_k_by_hand() -> None:
    # n=4 samples, c=1 correct, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # pass@1 is the fraction correct; all wrong is 0; fewer wrong than k is 1
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(4, 3, 2) == 1.0


def test_pass_at_k_equals_the_combinatorial_definition() -> None:
    # Chen et al. 2021, eq. 1, evaluated with exact binomials
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1.0 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_majority_vote() -> None:
    # "7" twice beats "5" once; the verifier said the "7"s are right
    assert majority_correct(["7", "5", "7", None], [True, False, True, False])
    # a tie goes to the answer seen first ("5"), which is wrong
    assert not majority_correct(["5", "7", "7", "5"], [False, True, True, False])
    # unextracted answers do not vote; no votes at all is wrong
    assert majority_correct([None, None, "3"], [False, False, True])
    assert not majority_correct([None, " "], [False, False])


def test_summarize_per_tag() -> None:
    tags = ["a", "a", "b"]
    answers = [["1", "1"], ["2", "3"], [None, "4"]]
    correct = [[True, True], [False, True], [False, True]]
    t = summarize(tags, answers, correct, 2)
    assert list(t) == ["all", "a", "b"] and ks_of(2) == [1, 2] and ks_of(6) == [1, 2, 4, 6]
    # a: prompt 1 has 2/2, prompt 2 has 1/2 -> pass@1 = (1 + 0.5) / 2; pass@2 = 1; maj@2: "1" right,
    # "2"/"3" tie -> "2" (first), wrong
    assert t["a"] == {"prompts": 2.0, "pass@1": 0.75, "pass@2": 1.0, "maj@2": 0.5}
    assert t["b"]["maj@2"] == 1.0 and t["all"]["pass@1"] == pytest.approx((1 + 0.5 + 0.5) / 3)


def _saved_smoke_model(tmp_path: Path) -> Path:
    from stepcredit.models import load_policy, save_pretrained

    small = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    model, tok = load_policy(small, seed=3)
    path = tmp_path / "model"
    save_pretrained(model, tok, path)
    return path


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_greedy_pass_at_1_on_arith_equals_validation_accuracy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stepcredit.cli.common import build_config
    from stepcredit.cli.main import build_parser
    from stepcredit.data import load_task
    from stepcredit.models import load_policy
    from stepcredit.reward import build_rewarder
    from stepcredit.trainer.validate import validate

    path = _saved_smoke_model(tmp_path)
    out = tmp_path / "samples.jsonl"
    # --score-truncated: validation scores every answer, cut or not
    argv = ["eval", *SMOKE, "--model", str(path), "--temperature", "0", "--out", str(out), "--no-progress"]
    argv += ["--score-truncated"]
    assert cli.main(argv) == 0
    summary = _last_json(capsys.readouterr().out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]

    cfg = build_config(build_parser().parse_args(argv))
    model, tok = load_policy(ModelConfig(path=str(path)))
    with build_rewarder(cfg.reward) as rewarder:
        metrics, val_rows = validate(
            model, tok, load_task(cfg.data)[1], rewarder, max_new_tokens=cfg.rollout.max_new_tokens
        )
    assert summary["prompts"] == len(val_rows) == len(rows) == 8
    assert [r["response"] for r in rows] == [v["response"] for v in val_rows]
    assert summary["pass@1"] == metrics["val/accuracy"]
    assert summary["status"] and sum(summary["status"].values()) == 8


def test_sampling_from_a_file_reports_every_tag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "probs.jsonl"
    rows = [
        {
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"tag": "easy" if i % 2 else "hard"},
        }
        for i in range(4)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "s.jsonl"
    argv = ["eval", *SMOKE, "--data", str(data), "--n", "3", "--temperature", "1.0"]
    assert cli.main([*argv, "--out", str(out), "--no-progress", "--batch-size", "4"]) == 0
    text = capsys.readouterr().out
    summary = _last_json(text)
    assert set(summary["by_tag"]) == {"all", "easy", "hard"}
    assert {"pass@1", "pass@2", "pass@3", "maj@3"} <= set(summary)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(got) == 12 and sorted({(g["index"], g["sample"]) for g in got}) == [
        (i, m) for i in range(4) for m in range(3)
    ]
    assert "easy" in text and "hard" in text and "pass@3" in text


def test_unknown_data_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["eval", *SMOKE, "--data", "nosuch", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--data nosuch" in err and "arith, gsm8k, math500" in err and len(err.strip().splitlines()) == 1


def test_a_run_directory_is_a_model_and_brings_its_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # what `stepcredit train` leaves: config.yaml and checkpoints/final/model
    run = tmp_path / "run"
    model = _saved_smoke_model(tmp_path)
    model.rename(tmp_path / "m")
    (run / "checkpoints" / "final").mkdir(parents=True)
    (tmp_path / "m").rename(run / "checkpoints" / "final" / "model")
    (run / "config.yaml").write_text(
        "model: {path: tiny}\ndata: {task: arith, val_size: 3}\nrollout: {max_new_tokens: 7}\n"
    )
    out = tmp_path / "s.jsonl"
    assert cli.main(["eval", "--model", str(run), "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    summary = _last_json(text)
    # the run's own generation length and validation split, not the default preset's 40 tokens / 200
    assert summary["max_new_tokens"] == 7 and summary["prompts"] == 3
    assert "config.yaml" in summary["settings"] and "(run)" in text
    # the model directory saved inside the run finds the run's settings too
    assert cli.main(["eval", "--model", str(run / "checkpoints" / "final" / "model"), "--no-progress",
                     "--out", str(out)]) == 0  # fmt: skip
    assert _last_json(capsys.readouterr().out)["max_new_tokens"] == 7
    # model.path may name the run too (train starting from a run's model): the one resolver
    from stepcredit.models import load_policy

    assert load_policy(ModelConfig(path=str(run)))[0] is not None
    # anything else is one line that says what --model takes
    assert cli.main(["eval", "--model", str(tmp_path / "nothing"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no such model or run directory" in err and "smollm2" in err


def test_a_packaged_model_uses_its_preset() -> None:
    from stepcredit.cli.common import config_for_model
    from stepcredit.cli.main import build_parser

    # `--model smollm2` alone: the model's preset (200 new tokens), not the default preset's 40
    cfg, model, source = config_for_model(
        build_parser().parse_args(["eval", "--model", "smollm2"]), "smollm2"
    )
    assert model.kind == "packaged" and cfg.model.path == "smollm2"
    assert cfg.rollout.max_new_tokens == 200 and "gsm8k_smollm2" in source
    # an explicit preset wins
    args = build_parser().parse_args(["eval", "--model", "smollm2", "--preset", "smoke"])
    cfg, _, source = config_for_model(args, "smollm2")
    assert cfg.rollout.max_new_tokens == 48 and source == "--preset smoke" and cfg.model.path == "smollm2"


def test_truncated_answers_are_counted_warned_and_not_scored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _saved_smoke_model(tmp_path)
    out = tmp_path / "s.jsonl"
    # 2 new tokens: the random model cannot finish an answer
    argv = ["eval", *SMOKE, "--model", str(path), "--max-new-tokens", "2", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    summary = _last_json(captured.out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cut = [r for r in rows if r["truncated"]]
    assert cut and summary["truncated"] == len(cut) and summary["truncated_frac"] == len(cut) / 8
    assert all(r["status"] == "truncated" and r["score"] is None and not r["correct"] for r in cut)
    assert summary["status"]["truncated"] == len(cut) and not summary["score_truncated"]
    assert "truncated" in captured.out.splitlines()[1]  # a column of the table
    assert "warning: " in captured.err and "hit the token limit (2 new tokens)" in captured.err
    # --score-truncated scores them: no truncated status, still counted
    assert cli.main([*argv, "--score-truncated"]) == 0
    summary = _last_json(capsys.readouterr().out)
    assert "truncated" not in summary["status"] and summary["truncated"] == len(cut)


def test_evaluate_never_scores_a_truncated_answer_by_default() -> None:
    from stepcredit.models import load_policy
    from stepcredit.trainer.evaluate import evaluate
    from stepcredit.types import RewardResult, Sample, Status

    class FullMarks:
        """Scores every response 1.0 and remembers what it was asked to score."""

        def __init__(self) -> None:
            self.seen: list[str] = []

        def score_batch(self, samples: list[Sample], texts: list[str]) -> list[RewardResult]:
            self.seen += texts
            return [RewardResult(score=1.0, status=Status.OK, extracted="1") for _ in texts]

    model, tok = load_policy(ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2,
                                                              intermediate_size=64)), seed=3)  # fmt: skip
    samples = [
        Sample(prompt=({"role": "user", "content": f"What is {i} + 1?"},), ground_truth="1") for i in range(6)
    ]
    rewarder = FullMarks()
    got: list[dict] = []
    report = evaluate(
        model, tok, samples, rewarder, n=2, max_new_tokens=3, temperature=1.0, on_rows=got.extend
    )  # type: ignore[arg-type]
    finished = [r for r in got if not r["truncated"]]
    # only finished answers reach the verifier; pass@1 is their share, as every scored one gets full marks
    assert len(got) == 12 and len(rewarder.seen) == len(finished) == 12 - report.truncated
    assert report.overall["pass@1"] == pytest.approx(len(finished) / 12)
    assert report.overall["truncated"] == pytest.approx(report.truncated / 12)
    report = evaluate(
        model, tok, samples, FullMarks(), n=2, max_new_tokens=3, temperature=1.0, score_truncated=True
    )  # type: ignore[arg-type]
    assert report.overall["pass@1"] == 1.0


def test_eval_and_probe_accept_the_same_dataset_names(tmp_path: Path) -> None:
    from stepcredit.cli.common import build_config
    from stepcredit.cli.eval import load_eval_samples
    from stepcredit.cli.main import build_parser
    from stepcredit.data.prepare import DATASETS, data_names
    from stepcredit.data.wrong_step import load_solutions

    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(
        json.dumps({"question": "Q?", "answer": "So 2 + 3 = 5.\n#### 5"}) + "\n"
    )
    (tmp_path / "math500").mkdir()
    (tmp_path / "math500" / "test.jsonl").write_text(
        json.dumps({"problem": "P?", "answer": "5", "solution": "So 2 + 3 = 5, \\boxed{5}"}) + "\n"
    )
    assert data_names() == ["arith", *DATASETS]
    cfg = build_config(build_parser().parse_args(["eval", *SMOKE]))
    for name in data_names():
        samples = load_eval_samples(cfg, name, tmp_path)
        solutions = load_solutions(name, cfg.data.arith, n=2, seed=0, src=tmp_path)
        assert samples and solutions and all(text.strip() for _, text in solutions), name


def test_without_data_a_preset_is_evaluated_on_what_its_trainer_validates_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --preset tools trains on arith_tools: the default --data is its validation split, not plain arith
    out = tmp_path / "samples.jsonl"
    argv = ["eval", "--preset", "tools", "--model", "tiny", "--limit", "2", "--out", str(out), "--no-progress",
            "rollout.max_new_tokens=8"]  # fmt: skip
    assert cli.main(argv) == 0
    assert _last_json(capsys.readouterr().out)["data"] == "val"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and {r["data_source"] for r in rows} == {"arith_tools"}
