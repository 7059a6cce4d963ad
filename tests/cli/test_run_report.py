"""What a run tells its user (issue 37): the result with intervals and a verdict, plain log lines off a
terminal, the SFT model kept, samples with their step, process panels, no directory after a failed start."""

from __future__ import annotations

import io
import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from stepcredit.stats import wilson_interval
from stepcredit.trainer.metrics import (
    MetricsLogger,
    ValHistory,
    mcnemar_exact_p,
    plot_curves,
    summary_lines,
    two_proportion_p,
)
from stepcredit.trainer.progress import Progress

EXE = [sys.executable, "-m", "stepcredit.cli.main"]


def test_a_run_to_a_file_reports_its_result_in_plain_lines(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--preset", "smoke", "--out", str(out), "sft.steps=4", "data.val_size=8", "trainer.steps=2"]
    args += [
        "trainer.val_every=2",
        "trainer.save_every=0",
        "rollout.max_new_tokens=16",
        "trainer.progress=true",
    ]
    args += ["trainer.generations_every=1", "trainer.generations_to_log=3"]
    proc = subprocess.run([*EXE, "train", *args], capture_output=True, text=True)  # stdout: a pipe
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # one plain line per SFT tenth and per logged step; no bar glyphs, no ellipsis, nothing cut
    assert "━" not in proc.stdout and "…" not in proc.stdout
    assert [ln.split("  ")[0] for ln in lines if ln.startswith("sft step")] == [
        f"sft step {i}/4" for i in range(1, 5)
    ]
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert [s.split("  ")[0] for s in steps] == ["step 0/2", "step 1/2", "step 2/2"]
    assert "val_acc_greedy" in steps[0] and all(
        k in steps[2] for k in ("reward_sampled", "val_acc_greedy", "kl", "s/step")
    )
    # the result: post-SFT, best and final with Wilson intervals, and a verdict from the paired test
    text = "\n".join(lines)
    assert "validation accuracy (greedy, 8 prompts, 95 % Wilson interval):" in text
    for label in ("post-SFT (step 0)", "best (step", "final (step 2)"):
        assert label in text
    verdict = next(ln for ln in lines if "verdict:" in ln)
    assert any(f"verdict: {v} (" in verdict for v in ("up", "down", "within noise"))
    assert "exact McNemar test on 8 paired prompts" in verdict
    summary = json.loads((out / "summary.json").read_text())
    assert summary["post_sft"]["n"] == 8 and summary["verdict"]["verdict"] in ("up", "down", "within noise")
    # the SFT model beside the final one
    assert (out / "checkpoints" / "sft" / "model" / "config.json").exists()
    assert (out / "checkpoints" / "final" / "model" / "config.json").exists()
    # names say sampled vs greedy
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["val/accuracy_greedy"] == rows[0]["val/accuracy"]
    assert rows[1]["train/reward_sampled"] == rows[1]["reward/mean"]
    # samples.jsonl: every validation answer and 3 training completions per step, each with its step
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [(s["step"], s["split"]) for s in samples] == (
        [(0, "val")] * 8 + [(1, "train")] * 3 + [(2, "val")] * 8 + [(2, "train")] * 3
    )
    assert all({"prompt", "response", "ground_truth", "score", "status"} <= set(s) for s in samples)
    events = b"".join(p.read_bytes() for p in (out / "tb").iterdir())
    assert b"samples/val" in events and b"samples/train" in events  # TensorBoard text summaries
    history = [json.loads(x) for x in (out / "validation.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [0, 2] and all(len(h["correct"]) == 8 for h in history)


def test_a_run_that_fails_at_start_up_leaves_no_directory(tmp_path: Path) -> None:
    out = tmp_path / "run"
    bad = [*EXE, "train", "--preset", "smoke", "--out", str(out), "model.path=/does/not/exist"]
    proc = subprocess.run(bad, capture_output=True, text=True)
    assert proc.returncode == 2 and "/does/not/exist" in proc.stderr and not out.exists()
    # a directory that was there before is the user's: kept, whatever it holds
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert subprocess.run(bad, capture_output=True, text=True).returncode == 2
    assert (out / "notes.txt").read_text() == "mine"


def test_progress_bars_on_a_terminal_plain_lines_elsewhere() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    row = {"train/reward_sampled": 0.4551, "kl": 0.00123, "time/step_s": 0.61, "val/accuracy_greedy": 0.7}
    plain = io.StringIO()
    p = Progress(10, True, stream=plain)
    p.update(3, row)
    p.close()
    assert (
        plain.getvalue() == "step 3/10  reward_sampled 0.455  val_acc_greedy 0.700  kl 0.0012  s/step 0.61\n"
    )
    tty = Tty()
    p = Progress(10, True, stream=tty)
    assert not p.plain
    p.update(3, row)
    p.close()
    assert "step 3/10  reward" not in tty.getvalue()  # drawn by rich as a bar, not printed as a line
    quiet = io.StringIO()
    Progress(10, False, stream=quiet).update(3, row)
    assert quiet.getvalue() == ""


def test_wilson_interval_by_hand() -> None:
    # 7/10, z = 1.96: centre (0.7 + 0.19208) / 1.38416 = 0.64450, half 1.96 sqrt(0.021 + 0.0096040) / 1.38416
    # = 0.24767 -> [0.3968, 0.8922] (the textbook Wilson interval of 7/10)
    lo, hi = wilson_interval(7 / 10, 10)
    assert lo == pytest.approx(0.3968, abs=1e-4) and hi == pytest.approx(0.8922, abs=1e-4)
    # 0/16 does not collapse to a point: [0, 2 * 0.0968]
    assert wilson_interval(0 / 16, 16) == (0.0, pytest.approx(0.19361, abs=1e-5))
    assert all(math.isnan(x) for x in wilson_interval(0.0, 0))


def test_paired_and_unpaired_tests_by_hand() -> None:
    # McNemar exact: 6 discordant prompts all one way: 2 * (1/2)^6 = 0.03125; 1 vs 5: 2 * (1 + 6) / 64
    assert mcnemar_exact_p(0, 6) == pytest.approx(0.03125)
    assert mcnemar_exact_p(5, 1) == pytest.approx(14 / 64)
    assert mcnemar_exact_p(0, 0) == 1.0
    # 50/100 vs 60/100: pooled 0.55, se sqrt(0.55 * 0.45 * 0.02) = 0.070356, z = 1.4213, p = 0.1552
    assert two_proportion_p(50, 100, 60, 100) == pytest.approx(0.1552, abs=1e-4)


def test_verdict_up_down_and_noise(tmp_path: Path) -> None:
    h = ValHistory(tmp_path)
    h.add(0, [True] * 10 + [False] * 10, "greedy")
    h.add(5, [True] * 20, "greedy")  # best
    h.add(10, [True] * 10 + [True] * 7 + [False] * 3, "greedy")  # 7 prompts gained, none lost: p = 2/128
    s = h.summary()
    assert s["best"]["step"] == 5 and s["final"]["accuracy"] == 0.85 and s["post_sft"]["accuracy"] == 0.5
    assert s["verdict"]["verdict"] == "up" and s["verdict"]["p_value"] == pytest.approx(2 / 128)
    text = "\n".join(summary_lines(s))
    assert "post-SFT (step 0)" in text and "verdict: up (final vs post-SFT +35.0 points" in text
    h.add(15, [True] * 9 + [False] * 11, "greedy")  # one lost: noise
    assert h.summary()["verdict"]["verdict"] == "within noise"
    h.add(20, [False] * 20, "greedy")
    assert h.summary()["verdict"]["verdict"] == "down"
    # a resumed run keeps the validations up to its checkpoint
    assert [r["step"] for r in ValHistory(tmp_path, ckpt_step=10).rows] == [0, 5, 10]


def _png_width(path: Path) -> int:
    return struct.unpack(">I", path.read_bytes()[16:20])[0]  # IHDR width


def test_curves_have_process_panels_when_process_rewards_are_on(tmp_path: Path) -> None:
    base = {"train/reward_sampled": 0.5, "reward/mean": 0.5, "response_length/mean": 20.0}
    process = {
        "process/u_abs_mean": 0.1,
        "process/u_near_zero_frac": 0.3,
        "process/episodes_per_response": 4.0,
    }
    widths = []
    for extra in ({}, process):
        run = tmp_path / str(len(extra))
        run.mkdir()
        log = MetricsLogger(run)
        for step in range(3):
            log.log({"step": step, **base, **extra})
        log.close()
        png = plot_curves(run)
        assert png is not None
        widths.append(_png_width(png))
    # 5 inches (90 dpi) per panel: reward, validation, length; then the two process panels
    assert widths == [3 * 5 * 90, 5 * 5 * 90]


def test_a_wrong_sandbox_url_is_one_whole_line(tmp_path: Path) -> None:
    from stepcredit.reward.run.health import clip_words

    url = "http://127.0.0.1:9/sandbox/fusion/of/the/cluster/behind/a/long/path/run_code"
    out = tmp_path / "run"
    tiny = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.intermediate_size=64"]
    tiny += ["data.train_size=64", "data.val_size=4", "trainer.progress=false", "sft.steps=0"]
    cmd = [*EXE, "train", "--preset", "multidomain", "--out", str(out), *tiny]
    cmd += ["reward.sandbox.backend=sandbox_fusion", f"reward.sandbox.url={url}", "reward.sandbox.retries=0"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 2 and not out.exists()
    (line,) = proc.stderr.strip().splitlines()
    # the whole reason, to its last word (it was cut at 200 characters, mid-word)
    assert (
        "route 'code'" in line
        and url in line
        and line.endswith("Connection refused; fix the backend or remove its rows")
    )
    # a longer message is cut at a space, never inside a word
    assert (
        clip_words("alpha beta gamma", 14) == "alpha beta..." and clip_words("alpha beta", 10) == "alpha beta"
    )


def test_sft_alone_covers_every_domain_and_prints_an_interval(tmp_path: Path) -> None:
    tiny = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.intermediate_size=64"]
    tiny += ["data.train_size=64", "data.val_size=4", "sft.steps=2", "rollout.max_new_tokens=16"]
    out = tmp_path / "sft"
    cmd = [*EXE, "sft", "--preset", "multidomain", "--out", str(out), *tiny]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "(95 % Wilson interval, 8 prompts)" in proc.stdout  # 4 validation prompts per domain
    m = json.loads((out / "sft_metrics.json").read_text())
    assert {"val/accuracy/arith", "val/accuracy/code"} <= set(m)


def test_step_line_adds_process_tool_and_failure_figures_only_when_there() -> None:
    from stepcredit.trainer.progress import step_line

    base = {"train/reward_sampled": 0.5, "time/step_s": 1.0, "reward/failed": 0.0}
    assert step_line(1, 2, base) == "step 1/2  reward_sampled 0.500  s/step 1.00"  # 0 failures: not shown
    full = {
        **base,
        "process/u_abs_mean": 0.1234,
        "process/episodes_per_response": 3.25,
        "tools/calls_per_response": 1.5,
        "tools/failed_calls_per_response": 0.25,
        "reward/failed": 3.0,
    }
    assert step_line(1, 2, full) == (
        "step 1/2  reward_sampled 0.500  process_|U| 0.123  episodes 3.2  tool_calls 1.50  tool_failed 0.25  "
        "reward_failed 3  s/step 1.00"
    )


def test_other_packages_deprecation_warnings_are_collected_once(tmp_path: Path) -> None:
    import warnings

    from stepcredit.cli.train import WARNINGS_FILE, third_party_warnings

    shown: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda m, *a, **k: shown.append(str(m))
        with third_party_warnings(tmp_path) as collected:
            for _ in range(3):
                warnings.warn_explicit(
                    "`past_key_values` is deprecated", FutureWarning, "/site/transformers/x.py", 7
                )
            warnings.warn_explicit("mine", FutureWarning, str(Path(cli_train_file()).parent / "x.py"), 1)
            warnings.warn_explicit("a user warning", UserWarning, "/site/peft/y.py", 2)
    # the third-party deprecation once, in the log; stepcredit's own and other categories still shown
    assert collected == ["FutureWarning: `past_key_values` is deprecated (/site/transformers/x.py:7)"]
    assert (tmp_path / WARNINGS_FILE).read_text() == collected[0] + "\n"
    assert shown == ["mine", "a user warning"]


def cli_train_file() -> str:
    import stepcredit.cli.train

    return str(stepcredit.cli.train.__file__)


def test_the_run_starts_with_a_banner(
    tmp_path: Path, tiny_train: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from stepcredit.cli.main import main

    run = tmp_path / "run"
    args = [*tiny_train, "sft.steps=1", "trainer.steps=1", "trainer.val_every=0", "trainer.save_every=0"]
    assert main(["train", "--preset", "smoke", *args, "process.enabled=true", "--out", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"stepcredit train: run directory {run.resolve()}"
    banner = "\n".join(out[:7])
    for needle in (
        "tiny (built in: 32 wide, 1 layer)",
        "on cpu in float32",
        "SFT 1 steps trains all; RL trains all",
        "rewards    math (breaker on)",
        "process credit on: forced_answer_logprob values",
        "tools      none",
    ):
        assert needle in banner, banner
