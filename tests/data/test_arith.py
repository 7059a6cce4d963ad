"""The arith task: deterministic, correct answers, natural traces with markers, verl schema."""

from __future__ import annotations

import re

from stepcredit.config import ArithConfig
from stepcredit.data.arith import make_rows


def _eval_trace(trace: str) -> int:
    # the last equation's right-hand side is the final quantity (corrections restate the step)
    return int(re.findall(r"= (-?\d+)\.", trace)[-1])


def test_deterministic_and_split_disjoint() -> None:
    cfg = ArithConfig()
    a = make_rows(cfg, 50, seed=3, split="train")
    assert a == make_rows(cfg, 50, seed=3, split="train")
    assert a != make_rows(cfg, 50, seed=4, split="train")
    assert a != make_rows(cfg, 50, seed=3, split="val")


def test_answers_and_traces_agree() -> None:
    cfg = ArithConfig(min_steps=1, max_steps=4, mistake_prob=0.5)
    rows = make_rows(cfg, 300, seed=0, split="train")
    n_fix = 0
    for r in rows:
        assert set(r) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert r["prompt"][0]["role"] == "user" and r["reward_model"]["style"] == "rule"
        gt = r["reward_model"]["ground_truth"]
        sol = r["extra_info"]["solution"]
        assert sol.startswith("Let me ") and sol.endswith(f"The answer is {gt}.")
        assert _eval_trace(sol) == int(gt) >= 0
        assert 1 <= r["extra_info"]["steps"] <= 4
        n_fix += ("Wait," in sol) or ("Actually," in sol)
    assert 0.35 < n_fix / len(rows) < 0.65  # about mistake_prob of the traces correct themselves


def test_difficulty_knob() -> None:
    easy = make_rows(ArithConfig(min_steps=1, max_steps=1), 20, seed=0, split="train")
    hard = make_rows(ArithConfig(min_steps=5, max_steps=5), 20, seed=0, split="train")
    assert all(r["extra_info"]["steps"] == 1 for r in easy)
    assert all(r["extra_info"]["steps"] == 5 for r in hard)
    assert all(r["prompt"][0]["content"].count("Then ") == 5 for r in hard)


def test_noisy_teacher_leaves_wrong_answers() -> None:
    rows = make_rows(ArithConfig(teacher_error_prob=0.3), 1000, seed=0, split="train")
    wrong = [
        r
        for r in rows
        if not r["extra_info"]["solution"].endswith(f"is {r['reward_model']['ground_truth']}.")
    ]
    assert 0.25 < len(wrong) / len(rows) < 0.35
    for r in wrong:  # the slip is carried on: the trace is self-consistent but its answer is off
        sol = r["extra_info"]["solution"]
        assert sol.endswith(f"The answer is {_eval_trace(sol)}.")
        assert _eval_trace(sol) != int(r["reward_model"]["ground_truth"])


def test_long_chain_knobs() -> None:
    base = ArithConfig(min_steps=6, max_steps=10, max_operand=30, mistake_prob=0.3)
    # slip_prob and waste_prob draw only when non-zero: with both 0 the traces are exactly the old ones
    assert make_rows(base, 30, seed=1, split="train") == make_rows(
        ArithConfig(
            min_steps=6, max_steps=10, max_operand=30, mistake_prob=0.3, slip_prob=0.0, waste_prob=0.0
        ),
        30,
        seed=1,
        split="train",
    )
    long = ArithConfig(
        min_steps=6, max_steps=10, max_operand=30, mistake_prob=0.3, slip_prob=0.1, waste_prob=0.2
    )
    rows = make_rows(long, 200, seed=1, split="train")
    traces = [r["extra_info"]["solution"] for r in rows]
    fixes = [t.count("Wait,") + t.count("Actually,") for t in traces]
    # one slip from mistake_prob (0.3 per trace) + 0.1 per operation (6-10 ops): ~1.1 per trace, some > 1
    assert 0.7 < sum(fixes) / len(fixes) < 1.5 and max(fixes) >= 3
    wasted = [t.count("Let me check:") + t.count("Hmm,") + t.count("I need to keep going") for t in traces]
    assert 1.0 < sum(wasted) / len(wasted) < 2.2  # 0.2 per operation, 8 on average
    for r, t in zip(rows, traces, strict=True):
        # wasted episodes restate the running total and change nothing: the answer still agrees
        assert _eval_trace(t) == int(r["reward_model"]["ground_truth"])
        assert 6 <= r["extra_info"]["steps"] <= 10


def test_max_total_caps_every_running_total() -> None:
    capped = ArithConfig(min_steps=6, max_steps=10, max_operand=12, max_total=40)
    for row in make_rows(capped, 100, seed=2, split="train"):
        totals = [int(x) for x in re.findall(r"= (\d+)\.", row["extra_info"]["solution"])]
        assert max(totals) <= 40 + 1  # a corrected slip may write the true total + 1
        assert _eval_trace(row["extra_info"]["solution"]) == int(row["reward_model"]["ground_truth"])
    # without a cap (the default) the problems are the old ones
    plain = ArithConfig(min_steps=6, max_steps=10, max_operand=12)
    assert make_rows(plain, 20, seed=2, split="train") == make_rows(
        ArithConfig(min_steps=6, max_steps=10, max_operand=12, max_total=0), 20, seed=2, split="train"
    )


def test_step_value_follows_the_true_chain_by_hand() -> None:
    from stepcredit.data.arith import chain_of, step_value

    q = "Ned has 5 apples. Then is given 8 more. Then loses 4. Then sells 2. How many apples now?"
    # states: 5 -> 13 -> 9 -> 7
    assert chain_of(q) == ([5, 13, 9, 7], [("+", 8), ("-", 4), ("-", 2)])
    prefixes = [
        ("", 1.0),  # nothing stated: an ideal continuation gets there
        ("Let me start with 5.", 1.0),
        ("Let me start with 6.", 0.0),  # wrong start
        ("Let me start with 5. So 5 + 8 = 14.", 0.0),  # the slip
        ("Let me start with 5. So 5 + 8 = 14. Actually, 5 + 8 = 13.", 1.0),  # its correction
        ("So 5 + 8 = 13. But 13 - 4 = 9. Hmm, 9 apples so far.", 1.0),  # a wasted restatement changes nothing
        ("So 5 + 8 = 13. But 13 - 5 = 8.", 0.0),  # right arithmetic, wrong operand: off the chain
        ("So 5 + 8 = 13. But 13 - 4 = 9. But 9 - 2 = 7. The answer is 7.", 1.0),
        ("So 5 + 8 = 13. But 13 - 4 = 9. But 9 - 2 = 7. The answer is 8.", 0.0),
    ]
    for text, v in prefixes:
        assert step_value(q, text) == v, text


def test_step_value_of_every_reference_trace_is_its_answers_correctness() -> None:
    from stepcredit.data.arith import step_value

    cfg = ArithConfig(
        min_steps=4, max_steps=6, max_operand=9, max_total=20, mistake_prob=0.5, teacher_error_prob=0.4
    )
    for r in make_rows(cfg, 200, seed=3, split="train"):
        trace, gold = r["extra_info"]["solution"], r["reward_model"]["ground_truth"]
        assert step_value(r["prompt"][0]["content"], trace) == float(trace.endswith(f"answer is {gold}."))
