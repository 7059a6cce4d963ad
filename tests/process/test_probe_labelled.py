"""The probe on labelled traces (ProcessBench's rows): the file, the episodes, the figures, the command."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from stepcredit.data.labelled_traces import load_labelled_traces
from stepcredit.errors import DataError
from stepcredit.process.probe_labelled import first_drop, labelled_figures, labelled_indicators
from stepcredit.reward.verifiers.math.extract import marked_answer
from stepcredit.stats import auroc


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    {"problem": "What is 2 + 3 * 4?", "steps": ["3 * 4 = 12", "2 + 12 = 15", "So \\boxed{15}."], "label": 1,
     "answer": "14"},
    {"problem": "What is 5 + 6?", "steps": ["5 + 6 = 11", "So \\boxed{11}."], "label": -1, "answer": "11"},
]  # fmt: skip


def _delong_by_brute_force(pos: list[float], neg: list[float]) -> tuple[float, float]:
    psi = [[1.0 if x > y else 0.5 if x == y else 0.0 for y in neg] for x in pos]
    a = sum(map(sum, psi)) / (len(pos) * len(neg))
    v10 = [sum(row) / len(neg) for row in psi]
    v01 = [sum(psi[i][j] for i in range(len(pos))) / len(pos) for j in range(len(neg))]
    var = sum((v - a) ** 2 for v in v10) / (len(pos) - 1) / len(pos)
    var += sum((v - a) ** 2 for v in v01) / (len(neg) - 1) / len(neg)
    return a, math.sqrt(var)


def test_auroc_with_ties_against_a_published_value_and_delongs_variance() -> None:
    # Hanley and McNeil (1982), Table 1: 109 CT images rated 1-5; the area is 0.893
    normal = [1.0] * 33 + [2.0] * 6 + [3.0] * 6 + [4.0] * 11 + [5.0] * 2
    abnormal = [1.0] * 3 + [2.0] * 2 + [3.0] * 2 + [4.0] * 11 + [5.0] * 33
    a, ci = auroc(abnormal, normal)
    assert round(a, 3) == 0.893
    want, se = _delong_by_brute_force(abnormal, normal)
    assert a == pytest.approx(want) and ci.low == pytest.approx(a - 1.96 * se)
    assert ci.high == pytest.approx(a + 1.96 * se)
    rng = random.Random(0)
    for _ in range(5):  # heavily tied scores, as K Monte Carlo samples give
        pos = [float(rng.randint(0, 4)) for _ in range(rng.randint(2, 25))]
        neg = [float(rng.randint(0, 3)) for _ in range(rng.randint(2, 25))]
        a, ci = auroc(pos, neg)
        want, se = _delong_by_brute_force(pos, neg)
        assert a == pytest.approx(want) and ci.low == pytest.approx(max(0.0, a - 1.96 * se))


def test_auroc_by_hand() -> None:
    assert auroc([3.0, 4.0], [1.0, 2.0])[0] == 1.0
    assert auroc([1.0, 2.0], [3.0, 4.0])[0] == 0.0
    # pairs (pos, neg): (2,1) win, (2,2) tie, (2,3) loss, (5, *) 3 wins: (1 + 0.5 + 0 + 3) / 6
    a, ci = auroc([2.0, 5.0], [1.0, 2.0, 3.0])
    assert a == pytest.approx(4.5 / 6)
    # DeLong by hand: V10 = (1.5/3, 3/3) = (0.5, 1); V01 = (1, 0.75, 0.5); A = 0.75
    se = math.sqrt(((0.25**2 + 0.25**2) / 1) / 2 + ((0.25**2 + 0 + 0.25**2) / 2) / 3)
    assert ci.low == pytest.approx(0.75 - 1.96 * se) and ci.high == 1.0  # clipped
    assert math.isnan(auroc([], [1.0])[0])
    a, ci = auroc([2.0], [1.0, 3.0])  # one positive: an area, no variance to estimate
    assert a == 0.5 and math.isnan(ci.low)


def test_indicators_on_a_labelled_trace_by_hand() -> None:
    v = [0.8, 0.8, 0.2, 0.3]  # U = 0, -0.6, +0.1: the value falls at step 1
    got = labelled_indicators(v, 1, tau=0.5)
    assert got == {
        "min_u": pytest.approx(-0.6),
        "final_v": 0.3,
        "predicted_right": 1.0,  # the first U below -0.5 is step 1, the label
        "argmin": 1.0,
        "chance": pytest.approx(1 / 3),
        "argmin_next": 1.0,
        "chance_next": pytest.approx(2 / 3),
        "drop": 1.0,
        "v_before": 0.8,
        "v_after": 0.2,
    }
    # labelled at step 0 (no drop there): a miss; the threshold rule says step 1, not the label
    got = labelled_indicators(v, 0, tau=0.5)
    assert got["argmin"] == 0.0 and got["argmin_next"] == 1.0 and got["predicted_right"] == 0.0
    assert got["drop"] == 0.0
    # a trace with no wrong step: only the trace-level figures; right when no U falls below -tau
    assert labelled_indicators(v, -1, tau=0.7) == {
        "min_u": pytest.approx(-0.6),
        "final_v": 0.3,
        "predicted_right": 1.0,
    }
    assert labelled_indicators(v, -1, tau=0.5)["predicted_right"] == 0.0
    assert first_drop([0.1, -0.2, -0.9], 0.1) == 1 and first_drop([0.1, -0.1], 0.1) == -1
    # a two-way tie at the minimum: half a hit
    assert labelled_indicators([1.0, 0.5, 0.0], 0)["argmin"] == 0.5


def test_the_position_baseline_swaps_labels_among_traces_of_equal_length() -> None:
    from stepcredit.process.probe_labelled import position_baseline

    # three 3-step traces: argmin at 1, 1, (0 and 2 tied); labels 1, 2, 2; one 5-step trace with no peer
    b = position_baseline([(3, [1], 1), (3, [1], 2), (3, [0, 2], 2), (5, [4], 4)])
    assert b is not None and b.n == 3
    assert b.hit == pytest.approx((1.0 + 0.0 + 0.5) / 3)
    # trace 0 against labels 2, 2: 0; trace 1 against 1, 2: 1/2; trace 2 against 1, 2: (0 + 1/2) / 2
    assert b.swapped == pytest.approx((0.0 + 0.5 + 0.25) / 3)
    d = [1.0, -0.5, 0.25]  # own minus swapped, trace by trace
    se = math.sqrt(sum((x - sum(d) / 3) ** 2 for x in d) / 2 / 3)
    assert b.diff_ci.low == pytest.approx(sum(d) / 3 - 1.96 * se) and not b.beaten
    assert position_baseline([(3, [1], 1), (4, [1], 1)]) is None


def _drop_at(k: int, n: int) -> list[float]:
    return [1.0] * (k + 1) + [0.0] * (n - k)  # V falls at step k of n


def test_an_estimator_that_points_at_a_position_is_not_recommended() -> None:
    from stepcredit.process.probe_labelled import recommend_labelled

    # every error at step 1 and every drop at step 1: 4x chance, but so is any trace's label
    fixed = labelled_figures("x", [_drop_at(1, 4)] * 40, [1] * 40, tau=None, solvable=None, s_per_trace=0.1)
    assert fixed is not None and fixed.error is not None and fixed.error.signal
    assert fixed.same_length is not None and fixed.same_length.swapped == 1.0 and not fixed.same_length.beaten
    rec = recommend_labelled({"x": fixed})
    assert rec.estimator is None and "points at a position" in rec.reason
    # errors spread over the steps and each drop on its own trace's error: beats the swapped labels
    labels = [i % 4 for i in range(40)]
    moving = labelled_figures(
        "y", [_drop_at(k, 4) for k in labels], labels, tau=None, solvable=None, s_per_trace=0.1
    )
    assert moving is not None and moving.same_length is not None and moving.same_length.beaten
    assert moving.same_length.hit == 1.0 and moving.same_length.swapped == pytest.approx(
        9 / 39
    )  # 9 of 39 peers share the label
    rec = recommend_labelled({"x": fixed, "y": moving})
    assert rec.estimator == "y" and "more often than where errors usually sit" in rec.reason


def test_figures_and_processbenchs_f1_by_hand() -> None:
    values = [
        [1.0, 1.0, 0.0, 0.0],  # wrong at 1: U = 0, -1, 0 (hit; tau 0.5 predicts 1: right)
        [1.0, 0.0, 0.0, 0.0],  # wrong at 2: U = -1, 0, 0 (miss; predicts 0: wrong)
        [1.0, 1.0, 1.0],  # right: U = 0, 0 (predicts none: right)
        [1.0, 0.4, 1.0],  # right: U = -0.6, +0.6 (predicts 0: wrong)
        [1.0, float("nan"), 1.0],  # the verifier failed: left out, counted
    ]
    labels = [1, 2, -1, -1, 0]
    f = labelled_figures(
        "x", values, labels, tau=0.5, solvable={0}, s_per_trace=0.1, credit_forms=("difference",)
    )
    assert f is not None and f.unscored == 1 and (f.n_error, f.n_correct) == (2, 2)
    assert f.error is not None and f.error.n == 2 and f.error.argmin == 0.5 and f.error.lower is None
    assert f.error.chance == pytest.approx(1 / 3)
    assert f.solvable is not None and f.solvable.n == 1 and f.solvable.argmin == 1.0
    b = f.processbench
    assert (
        b is not None and b.error_accuracy == 0.5 and b.correct_accuracy == 0.5 and b.f1 == pytest.approx(0.5)
    )
    # min U of the erroneous (-1, -1) against the correct (0, -0.6): every pair ranks them right
    assert f.min_u is not None and f.min_u.auroc == 1.0
    # final V: erroneous 0, 0 against 1, 1
    assert f.final_v is not None and f.final_v.auroc == 1.0
    assert f.credits["difference"].argmin == f.error.argmin
    # no trace of one kind: no separation, and ProcessBench's F1 is undefined
    g = labelled_figures("x", values[:2], labels[:2], tau=0.5, solvable=None, s_per_trace=0.1)
    assert g is not None and g.min_u is None and g.processbench is not None and math.isnan(g.processbench.f1)
    assert labelled_figures("x", [[float("nan"), 0.0]], [0], tau=None, solvable=None, s_per_trace=0.1) is None


def test_the_file_and_its_errors_name_the_row_and_key(tmp_path: Path) -> None:
    p = _write(tmp_path / "t.jsonl", ROWS)
    traces, total, _ = load_labelled_traces(p)
    assert [t.label for t in traces] == [1, -1] and traces[0].steps[1] == "2 + 12 = 15"
    s = traces[0].sample
    assert s.ground_truth == "14" and s.data_source == "math" and "\\boxed{}" in s.prompt[0]["content"]
    assert s.uid == f"{p}:1" and total == 2 and load_labelled_traces(p, n=1)[0] == traces[:1]
    # a verl-schema row with steps added keeps its own prompt and data source
    verl = {"prompt": [{"role": "user", "content": "q"}], "data_source": "gsm8k",
            "reward_model": {"ground_truth": "3"}, "steps": ["a", "b"], "label": 0}  # fmt: skip
    (t,), _, _ = load_labelled_traces(_write(tmp_path / "v.jsonl", [verl]))
    assert t.sample.data_source == "gsm8k" and t.sample.prompt[0]["content"] == "q"
    bad = [
        ({**ROWS[0], "answer": None}, "no gold answer: the row has no 'answer'"),
        ({**ROWS[0], "label": 3}, "'label' must be an integer from -1 (no wrong step) to 2"),
        ({**ROWS[0], "label": True}, "'label' must be an integer"),
        ({**ROWS[0], "steps": []}, "'steps' must be a non-empty list of strings"),
        ({**ROWS[0], "steps": ["a", " "]}, "step 1 is empty"),
        ({"steps": ["a"], "label": 0, "answer": "1"}, "needs 'problem' (a ProcessBench row) or 'prompt'"),
    ]
    for row, message in bad:
        p = _write(tmp_path / "bad.jsonl", [ROWS[1], row])
        with pytest.raises(DataError, match=None) as e:
            load_labelled_traces(p)
        assert str(e.value).startswith(f"{p}:2: ") and message in str(e.value)


def test_each_step_is_one_episode_ending_where_the_step_does(tmp_path: Path) -> None:
    from stepcredit.models import build_tokenizer
    from stepcredit.trainer.probe import labelled_requests

    tok = build_tokenizer()
    traces, _, _ = load_labelled_traces(_write(tmp_path / "t.jsonl", ROWS))
    for sep in ("\n\n", "\n"):
        for t, r in zip(traces, labelled_requests(tok, traces, sep=sep), strict=True):
            assert len(r.prefix_lens) == len(t.steps) + 1 and r.complete and r.answer == t.sample.ground_truth
            assert r.response_ids[-1] == tok.eos_token_id
            for k, n in enumerate(r.prefix_lens):
                # prefix k holds the first k steps, each followed by the separator (the last by nothing)
                want = "".join(s + sep for s in t.steps[:k])
                if k == len(t.steps):
                    want = sep.join(t.steps)
                assert tok.decode(r.response_ids[:n]) == want


def _byte_level_bpe():
    """A small byte-level BPE that, like SmolLM2's, writes "\n\n" as one token only before whitespace or
    at the end of the text and as two before a word."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = [
        "3 * 4 = 12\n\n2 + 12 = 15\n\nSo the answer is 15.",
        "First step.\n\nSecond.\n\n Third.\n\n",
    ] * 50
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tk.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"], initial_alphabet=alphabet)
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    return tok


def test_a_labelled_response_is_tokenized_as_the_policy_would_write_it(tmp_path: Path) -> None:
    from stepcredit.trainer.probe import labelled_requests

    tok = _byte_level_bpe()
    piecewise = tok("3 * 4 = 12\n\n", add_special_tokens=False)["input_ids"]
    whole = tok("3 * 4 = 12\n\n2", add_special_tokens=False)["input_ids"]
    assert whole[: len(piecewise)] != piecewise  # the case: step by step would give other tokens
    traces, _, _ = load_labelled_traces(_write(tmp_path / "t.jsonl", ROWS))
    for t, r in zip(traces, labelled_requests(tok, traces), strict=True):
        text = "\n\n".join(t.steps)
        assert r.response_ids == tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        for k, n in enumerate(r.prefix_lens[1:-1], 1):  # each inner boundary right after a step's separator
            assert tok.decode(r.response_ids[:n]) == "".join(x + "\n\n" for x in t.steps[:k])
        assert r.prefix_lens[-1] == len(r.response_ids) - 1


def test_labelled_traces_give_the_corruption_probes_figures_on_the_same_traces() -> None:
    """The corruption probe's corrupted traces, written as labelled rows (its episodes as steps, its wrong
    step as the label), give the same values and the same hit rate through the labelled path."""
    from stepcredit.config import Config
    from stepcredit.data.labelled_traces import LabelledTrace
    from stepcredit.data.wrong_step import load_solutions
    from stepcredit.models import build_tiny
    from stepcredit.process import ValueContext, estimate
    from stepcredit.trainer.probe import build_cases, labelled_requests, probe_labelled

    cfg = Config()
    model, tok = build_tiny(cfg.model.tiny, seed=0)
    model.eval()
    solutions = load_solutions("arith", cfg.data.arith, n=6, seed=0)
    cases, used = build_cases(tok, solutions, cfg.process, deltas=(-1, 1), rng=random.Random(0))
    assert len(cases) >= 4
    traces = []
    for case, i in zip(cases, used, strict=True):
        r = case.corrupt
        content = r.prefix_lens  # token counts of each prefix: the episodes are the spans between them
        steps = [tok.decode(r.response_ids[a:b]) for a, b in itertools.pairwise(content)]
        traces.append(LabelledTrace(solutions[i][0], tuple(steps), case.corrupt_step))
    reqs = labelled_requests(tok, traces, sep="")
    for case, r in zip(cases, reqs, strict=True):
        assert r.prefix_lens == case.corrupt.prefix_lens and r.response_ids == case.corrupt.response_ids
    import torch

    with torch.no_grad():
        twin = estimate(
            ValueContext(model, tok, [c.corrupt for c in cases], cfg.process), "forced_answer_logprob"
        )
    report = probe_labelled(model, tok, traces, cfg.process, ["forced_answer_logprob"], score_fn=None, sep="")
    want = labelled_figures(
        "forced_answer_logprob", twin, [c.corrupt_step for c in cases], tau=None, solvable=None, s_per_trace=0
    )
    got = report.estimators["forced_answer_logprob"]
    assert want is not None and got.error is not None and want.error is not None
    assert got.error.argmin == pytest.approx(want.error.argmin) and got.error.n == len(cases)
    assert got.drop == pytest.approx(want.drop) and report.n_error == len(cases)


def test_probe_command_on_labelled_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stepcredit.cli.main import main

    p = tmp_path / "t.json"  # a JSON array, as some datasets ship
    p.write_text(json.dumps(ROWS * 2))
    png = tmp_path / "t.png"
    argv = ["probe", "--model", "tiny", "--traces", str(p), "--json", "--png", str(png)]
    argv += ["--threshold", "forced_answer_logprob=1,monte_carlo=0.2", "--step-sep", "\\n"]
    argv += ["--estimators", "forced_answer_logprob,monte_carlo", "--credits", "difference,blame"]
    argv += ["trainer.threads=1", "process.mc_samples=2", "process.mc_max_new_tokens=6"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["n"] == 4 and summary["n_error"] == 2 and summary["traces"] == str(p)
    for name, e in summary["estimators"].items():
        assert e["n_error"] == 2 and e["n_correct"] == 2 and e["error"]["lower"] is None
        assert e["processbench"]["tau"] == (0.2 if name == "monte_carlo" else 1.0)
        assert 0.0 <= e["min_u"]["auroc"] <= 1.0
        # the two erroneous traces are the same trace: against each other's label they score as their own
        assert e["same_length"]["n"] == 2 and e["same_length"]["swapped"] == e["same_length"]["hit"]
        # blame compares V with a certain success: only beside an estimator whose V is a probability
        assert set(e["credits"]) == ({"difference", "blame"} if name == "monte_carlo" else {"difference"})
    assert summary["solvable_by"] == "monte_carlo"
    assert "ProcessBench's metric" in out and "recommendation:" in out and png.stat().st_size > 1000
    assert f"{p}: the first 4 of 4 traces" in out and "swapped" in out


def test_the_step_separator_reads_escapes_and_keeps_other_text() -> None:
    from stepcredit.cli.probe_traces import _sep

    assert _sep(None) == "\n\n" and _sep("\\n") == "\n" and _sep("\\n\\n") == "\n\n"
    assert _sep("\u2192\\n") == "\u2192\n" and _sep(" | ") == " | "


def test_probe_command_errors_on_labelled_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stepcredit.cli.main import main

    p = _write(tmp_path / "t.jsonl", [ROWS[0], {**ROWS[1], "answer": ""}])
    assert main(["probe", "--model", "tiny", "--traces", str(p), "--data-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert f"{p}:2: no gold answer" in err and f"no GSM8K or MATH-500 file under {tmp_path / 'none'}" in err
    assert "--skip-no-gold" in err
    # every row left out: nothing to probe, said in one line
    lone = _write(tmp_path / "lone.jsonl", [{**ROWS[1], "answer": ""}])
    argv = ["probe", "--model", "tiny", "--traces", str(lone), "--skip-no-gold", "--data-dir", str(tmp_path)]
    assert main(argv) == 2
    assert "every row read was left out for want of a gold answer" in capsys.readouterr().err
    assert main(["probe", "--model", "tiny", "--data", "arith", "--threshold", "0.1"]) == 2
    assert "--threshold is a flag of --traces, and this probe reads --data" in capsys.readouterr().err
    good = _write(tmp_path / "g.jsonl", ROWS)
    assert main(["probe", "--model", "tiny", "--traces", str(good), "--threshold", "-1"]) == 2
    assert "--threshold -1: -1.0 must be >= 0" in capsys.readouterr().err
    assert main(["probe", "--model", "tiny", "--traces", str(good), "--preset", "tools"]) == 2
    assert "--traces: labelled traces have no tool turns" in capsys.readouterr().err
    base = ["probe", "--model", "tiny", "--traces", str(good)]
    for extra, message in [
        (["--seed", "3"], "--seed is a flag of --data, and this probe reads --traces: drop it"),
        (["--deltas", "1"], "--deltas is a flag of --data"),
        (["--grow-trees"], "--grow-trees branches a tree at the config's episode ends"),
        (["--threshold", "1,2"], "--threshold 1,2: expected TAU or name=TAU"),
        (["--threshold", "tree=1"], "'tree' is not one of --estimators"),
        (["--estimators", "monte_carlo", "--threshold", "monte_carlo=-0.5"], "-0.5 must be >= 0"),
    ]:
        assert main(base + extra) == 2
        assert message in capsys.readouterr().err
    assert main(["probe", "--model", "tiny", "--data", "arith", "--skip-no-gold"]) == 2
    assert "--skip-no-gold is a flag of --traces" in capsys.readouterr().err
    assert main(["probe", "--model", "tiny", "--data", "arith", "--step-sep", "x"]) == 2
    assert "--step-sep is a flag of --traces, and this probe reads --data" in capsys.readouterr().err
    # with a tools preset the labelled traces are refused first (not after advice about --grow-trees)
    assert main([*base, "--grow-trees", "--preset", "tools"]) == 2
    assert "--grow-trees branches a tree" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: one source of traces, not two
        main(["probe", "--model", "tiny", "--traces", str(good), "--data", "arith"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_example_writes_gsm8k_traces_labelled_at_the_changed_line(tmp_path: Path) -> None:
    import importlib.util

    from stepcredit.data.prepare import shared_data_dir

    if not (shared_data_dir() / "gsm8k" / "test.jsonl").exists():
        pytest.skip(f"{shared_data_dir()} has no GSM8K")  # CI runs beside ../shared, which has it
    path = Path(__file__).parents[2] / "examples" / "labelled_traces.py"
    spec = importlib.util.spec_from_file_location("labelled_traces_example", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.labelled_rows(20, seed=0)
    again = mod.labelled_rows(20, seed=0)  # the same draw: deterministic
    assert rows == again and sum(r["label"] >= 0 for r in rows) >= 8
    p = _write(tmp_path / "g.jsonl", rows)
    for r, t in zip(rows, load_labelled_traces(p)[0], strict=True):
        written = [x for x in r["extra_info"]["answer"].split("\n") if x.strip()]
        if t.label < 0:
            assert list(t.steps) == written  # left as written
        else:  # the steps before the label as written, the labelled one changed
            assert list(t.steps[: t.label]) == written[: t.label] and t.steps[t.label] != written[t.label]


def _raw_datasets(root: Path) -> Path:
    (root / "gsm8k").mkdir(parents=True)
    q = "Janet\u2019s ducks lay 16 eggs per day.  She eats three.\nHow many are left?"
    (root / "gsm8k" / "test.jsonl").write_text(
        json.dumps({"question": q, "answer": "16 - 3 = 13\n#### 1,013"}) + "\n"
    )
    (root / "math500").mkdir()
    row = {"problem": "Compute $\\frac{1}{2}+\\frac{1}{3}$.", "answer": "\\frac{5}{6}"}
    (root / "math500" / "test.jsonl").write_text(json.dumps(row) + "\n")
    return root


def test_a_processbench_row_without_an_answer_gets_the_gold_of_its_dataset_or_its_own_marked_answer(
    tmp_path: Path,
) -> None:
    from stepcredit.data.labelled_traces import gold_sources

    src = _raw_datasets(tmp_path / "raw")
    rows = [
        # ProcessBench's own fields: no answer; the problem as GSM8K has it, white space and forms changed
        {"id": "gsm8k-0", "problem": "Janet\u2019s ducks lay 16 eggs per day. She eats three. How many are left? ",
         "steps": ["16 - 3 = 13", "\\boxed{13}"], "label": 0, "final_answer_correct": False},
        {"problem": "Compute $\\frac{1}{2}+\\frac{1}{3}$.", "steps": ["\\boxed{\\frac{5}{6}}"], "label": -1,
         "final_answer_correct": True},
        # not in any dataset, its final answer marked correct: that answer is the gold
        {"problem": "What is 7 * 6?", "steps": ["7 * 6 = 42.", "The answer is \\boxed{42}."], "label": -1,
         "final_answer_correct": True},
        {"problem": "What is 2 + 2?", "steps": ["2 + 2 = 4"], "label": -1, "answer": "4"},
    ]  # fmt: skip
    traces, total, _ = load_labelled_traces(
        _write(tmp_path / "pb.jsonl", rows), src=src, final_answer=marked_answer
    )
    assert total == 4 and [t.gold_from for t in traces] == ["gsm8k", "math500", "final_answer", "row"]
    got = [(t.sample.ground_truth, t.sample.data_source) for t in traces]
    assert got == [
        ("1013", "openai/gsm8k"),  # GSM8K's gold with its separators removed, and GSM8K's source
        ("\\frac{5}{6}", "HuggingFaceH4/MATH-500"),
        ("42", "math"),
        ("4", "math"),
    ]
    assert gold_sources(traces).startswith("1 from gsm8k, 1 from math500, 1 from the traces' own final")
    # an answer the row gives wins over the dataset's
    (t,), _, _ = load_labelled_traces(
        _write(tmp_path / "a.jsonl", [{**rows[0], "answer": "7"}]), src=src, final_answer=marked_answer
    )
    assert (t.sample.ground_truth, t.gold_from) == ("7", "row")


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"final_answer_correct": False}, "the row does not mark its final answer correct"),
        ({}, "the row does not mark its final answer correct"),
        # marked correct, but no box, #### or answer phrase to take it from: not guessed from a last number
        ({"final_answer_correct": True, "steps": ["so it is 42"]}, "its final answer is not marked plainly"),
    ],
)
def test_a_row_whose_gold_cannot_be_found_is_refused_by_name(tmp_path: Path, row: dict, needle: str) -> None:
    src = _raw_datasets(tmp_path / "raw")
    base = {"problem": "What is 7 * 6?", "steps": ["\\boxed{42}"], "label": -1}
    with pytest.raises(DataError, match=r"x\.jsonl:1: no gold answer") as e:
        load_labelled_traces(
            _write(tmp_path / "x.jsonl", [{**base, **row}]), src=src, final_answer=marked_answer
        )
    assert (
        needle in str(e.value)
        and "gsm8k test, math500 test under" in str(e.value)
        and "--data-dir" in str(e.value)
    )
    # without a reader of the trace's own answer that source is not used, and the message says so
    with pytest.raises(DataError, match="no reader of a trace's own final answer"):
        load_labelled_traces(_write(tmp_path / "y.jsonl", [{**base, "final_answer_correct": True}]), src=src)


def test_the_real_gsm8k_test_split_gives_processbench_rows_their_gold() -> None:
    from stepcredit.data.labelled_traces import GoldLookup
    from stepcredit.data.prepare import shared_data_dir

    if not (shared_data_dir() / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"{shared_data_dir()} has no GSM8K")  # CI runs beside ../shared, which has it
    first = json.loads((shared_data_dir() / "gsm8k" / "test.jsonl").read_text().splitlines()[0])
    found = GoldLookup().find(first["question"].replace(". ", ".  "))
    assert found == ("18", "openai/gsm8k", "gsm8k")


def test_a_row_without_gold_is_left_out_and_named_when_asked_and_a_bad_dataset_file_is_only_left_out(
    tmp_path: Path,
) -> None:
    from stepcredit.data.labelled_traces import GoldLookup

    src = _raw_datasets(tmp_path / "raw")
    (src / "gsm8k" / "train.jsonl").write_text("{oops\n")  # unreadable: left out, named, not fatal
    rows = [
        {"problem": "What is 7 * 6?", "steps": ["\\boxed{41}"], "label": 0, "final_answer_correct": False},
        {"problem": "Compute $\\frac{1}{2}+\\frac{1}{3}$.", "steps": ["\\boxed{1}"], "label": 0},
        # 'answer' null, 'ground_truth' given: the second is the gold
        {"problem": "What is 1 + 2?", "steps": ["\\boxed{3}"], "label": -1, "answer": None, "ground_truth": 3},
        {"problem": "What is 9 - 9?", "steps": ["\\boxed{1}"], "label": 0},
    ]  # fmt: skip
    p = _write(tmp_path / "pb.jsonl", rows)
    with pytest.raises(DataError, match=r"pb\.jsonl:1: no gold answer") as e:
        load_labelled_traces(p, src=src, final_answer=marked_answer)
    assert "gsm8k test, math500 test under" in str(e.value)
    assert "left out, unreadable: " in str(e.value) and "train.jsonl:1: invalid JSON" in str(e.value)
    traces, total, skipped = load_labelled_traces(p, src=src, final_answer=marked_answer, skip_no_gold=True)
    assert total == 4 and skipped == [f"{p}:1", f"{p}:4"]
    assert [(t.sample.ground_truth, t.gold_from) for t in traces] == [
        ("\\frac{5}{6}", "math500"),
        ("3", "row"),
    ]
    # n counts the traces kept, not the rows read
    kept, _, skipped = load_labelled_traces(p, src=src, final_answer=marked_answer, skip_no_gold=True, n=1)
    assert len(kept) == 1 and skipped == [f"{p}:1"]
    assert GoldLookup(tmp_path / "empty").find("What is 7 * 6?") is None


def test_the_probe_says_where_the_gold_answers_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stepcredit.cli.main import main

    src = _raw_datasets(tmp_path / "raw")
    rows = [
        {"problem": "Compute $\\frac{1}{2}+\\frac{1}{3}$.", "steps": ["1/2 + 1/3 = 5/6", "\\boxed{\\frac{5}{6}}"],
         "label": -1},
        {"problem": "What is 7 * 6?", "steps": ["7 * 6 = 41", "\\boxed{41}"], "label": 0, "final_answer_correct": False},
        {"problem": "What is 7 * 6?", "steps": ["7 * 6 = 42", "\\boxed{42}"], "label": -1, "final_answer_correct": True},
    ]  # fmt: skip
    p = _write(tmp_path / "pb.jsonl", rows)
    argv = ["probe", "--model", "tiny", "--traces", str(p), "--data-dir", str(src), "--skip-no-gold"]
    argv += ["--estimators", "forced_answer_logprob", "trainer.threads=1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "the first 2 of 3 traces (--n 60); gold answers: 1 from math500, 1 from the traces' own final" in out
    )
    assert f"left out for want of a gold answer (--skip-no-gold): 1 rows ({p}:2)" in out
