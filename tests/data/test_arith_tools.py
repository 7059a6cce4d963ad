"""The ``arith_tools`` task: problems the tiny model cannot do in its head, traces whose calculator
calls give exactly the results written after them, and the exact per-turn values."""

from __future__ import annotations

import re

from stepcredit.config import ArithConfig, DataConfig
from stepcredit.data import STEP_VALUES, load_task
from stepcredit.data.arith import make_tool_rows, tool_chain_of, tool_step_value
from stepcredit.models.tiny import build_tokenizer
from stepcredit.reward import build_rewarder
from stepcredit.tools import PARSERS, TOOLS, ToolCall, execute_call

CFG = ArithConfig(min_steps=1, max_steps=3)


def test_rows_are_deterministic_and_need_a_multiplication() -> None:
    a = make_tool_rows(CFG, 20, seed=1, split="train")
    assert a == make_tool_rows(CFG, 20, seed=1, split="train")
    assert a != make_tool_rows(CFG, 20, seed=1, split="val")
    for r in a:
        q = r["prompt"][0]["content"]
        boxes, per_box = map(int, re.search(r"has (\d+) boxes with (\d+) ", q).groups())
        assert 12 <= boxes <= 99 and 102 <= per_box <= 999  # a 2-digit by 3-digit product
        states = tool_chain_of(q)
        assert states[0] == boxes * per_box and all(10_000 <= s <= 99_999 for s in states)  # 5 digits
        assert r["reward_model"]["ground_truth"] == str(states[-1])
        assert 1 <= r["extra_info"]["steps"] == len(states) <= 3


def test_traces_replay_through_the_calculator() -> None:
    # every call in a trace, run by the real tool, gives exactly the result block written after it
    fenced = PARSERS.get("fenced")
    tools = {"calculator": TOOLS.get("calculator")}
    for r in make_tool_rows(CFG, 30, seed=2, split="train"):
        text, replay = r["extra_info"]["solution"], ""
        while (found := fenced.find(text, tools)) is not None:
            obs = execute_call(found.call, offered=["calculator"])
            replay += text[: found.end] + fenced.observation(obs.text)
            text = text[found.end + len(fenced.observation(obs.text)) :]
            assert not obs.error
        assert replay + text == r["extra_info"]["solution"]
        assert text == "The answer is\n" + r["reward_model"]["ground_truth"]
        # the recorded result spans are exactly the result blocks
        sol, spans = r["extra_info"]["solution"], r["extra_info"]["solution_observations"]
        assert [sol[a:b] for a, b in spans] == re.findall(r"\n```output\n\d+\n```\n", sol)


def test_copied_numbers_keep_their_tokens() -> None:
    # every number the policy writes is a copy, with the same BPE tokens as where it is copied from:
    # the first call's operands from the question; later totals and the answer from the result blocks
    tok = build_tokenizer("bpe")

    def toks(text: str) -> list[str]:
        return tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])

    def has(seq: list[str], sub: list[str]) -> bool:
        return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))

    for r in make_tool_rows(CFG, 30, seed=3, split="train"):
        q, sol = r["prompt"][0]["content"], r["extra_info"]["solution"]
        q_toks, sol_toks = toks(q), toks(sol)
        calls = re.findall(r"```calculator\n(.*?)\n```", sol)
        results = re.findall(r"```output\n(\d+)\n", sol)
        boxes, per_box = calls[0].split(" * ")
        assert has(q_toks, toks(boxes)) and has(q_toks, toks(" " + per_box)) and has(sol_toks, toks(boxes))
        for result in results:  # after a newline, a number is one token per digit
            assert has(sol_toks, ["\n", *result, "\n"])
        for call, prev in zip(calls[1:], results, strict=False):
            total, _, n = call.split(" ")
            assert total == prev and has(sol_toks, ["\n", *prev, toks(" " + _)[0]])
            assert has(q_toks, toks(" " + n)) and has(sol_toks, toks(" " + n))
        assert sol_toks[-len(results[-1]) - 1 :] == ["\n", *results[-1]]


def test_task_step_values_and_reward() -> None:
    train, val = load_task(DataConfig(task="arith_tools", train_size=6, val_size=2))
    assert len(train) == 6 and len(val) == 2 and train[0].data_source == "arith_tools"
    fn = STEP_VALUES.get("arith_tools")
    with build_rewarder() as rewarder:
        for s in train:
            sol = s.extra_info["solution"]
            # on the true chain at every turn end (just before each result) and at the end
            ends = [*PARSERS.get("fenced").observation_starts(sol), len(sol)]
            assert len(ends) == s.extra_info["steps"] + 1
            assert [fn(s, sol[:k]) for k in ends] == [1.0] * len(ends)
            assert rewarder.score(s, sol).score == 1.0
            assert rewarder.score(s, sol.replace("The answer is\n", "The answer is\n1")).score == 0.0


def test_reward_wants_the_computed_number_not_an_expression() -> None:
    """The math verifier (like math-verify) evaluates an extracted expression; on this task such an
    answer skips the computation the tool is for, so it is wrong (a verdict, not a failure)."""
    from stepcredit.reward.verifiers.math.score import math_compute_score

    train, _ = load_task(DataConfig(task="arith_tools", train_size=1, val_size=1))
    s = train[0]
    truth = str(s.ground_truth)
    a, b = tool_chain_of(s.prompt[-1]["content"])[0], 1
    hack = f"The answer is {a} * {b} + {int(truth) - a}"
    assert math_compute_score("arith", hack, truth, {}).score == 1.0  # what the math verifier says
    cases = {
        f"The answer is\n{truth}": 1.0,
        f"The answer is {truth}.": 1.0,
        f"The answer is {truth} eggs": 1.0,
        f"The answer is\n{int(truth) + 1}": 0.0,
        f"The answer is {truth} - 0": 0.0,
        hack: 0.0,
    }
    with build_rewarder() as rewarder:
        for text, want in cases.items():
            got = rewarder.score(s, text)
            assert (got.score, got.status.value) == (want, "ok"), text
        got = rewarder.score(s, "no final phrase")
        assert (got.score, got.status.value) == (0.0, "unparseable")


def test_step_value_by_hand() -> None:
    q = "Ann has 12 boxes with 345 pens each. Then sells 40 pens. Then gets 7 more pens. How many pens now?"
    # s_1 = 12 * 345 = 4140, s_2 = 4140 - 40 = 4100, s_3 = 4100 + 7 = 4107
    assert tool_chain_of(q) == [4140, 4100, 4107]
    call = "```calculator\n{}\n```\n"
    assert tool_step_value(q, "") == 1.0
    assert tool_step_value(q, call.format("345*12")) == 1.0  # any expression worth s_1
    assert tool_step_value(q, call.format("12*354")) == 0.0  # a slip
    assert tool_step_value(q, call.format("12*345") + call.format("4140-40")) == 1.0
    assert tool_step_value(q, call.format("12*345") + call.format("4140+40")) == 0.0  # wrong sign
    assert tool_step_value(q, call.format("12*")) == 0.0  # not an expression
    assert tool_step_value(q, "The answer is 4107.") == 1.0
    assert tool_step_value(q, "The answer is\n4107") == 1.0  # the traces' form
    assert tool_step_value(q, call.format("12*345") + "The answer is 4140.") == 0.0
    # a tool result cut mid-way is not a call yet
    assert tool_step_value(q, "```calculator\n12*3") == 1.0
    assert (
        execute_call(ToolCall("calculator", {"expression": "4100+7"}), offered=["calculator"]).text == "4107"
    )


def test_direct_variant_is_the_same_problems_answered_without_a_tool() -> None:
    cfg = DataConfig(task="arith_tools", train_size=5, val_size=2)
    tools = load_task(cfg)
    direct = load_task(DataConfig(task="arith_tools_direct", train_size=5, val_size=2))
    with build_rewarder() as rewarder:
        for a_split, b_split in zip(tools, direct, strict=True):
            for a, b in zip(a_split, b_split, strict=True):
                assert a.prompt == b.prompt and a.ground_truth == b.ground_truth
                assert a.data_source == b.data_source == "arith_tools"  # the same reward and oracle
                assert b.extra_info["solution"] == f"The answer is\n{a.ground_truth}"
                assert "solution_observations" not in b.extra_info
                assert rewarder.score(b, b.extra_info["solution"]).score == 1.0


def test_noisy_teacher_copies_one_number_wrong_and_carries_it() -> None:
    # teacher_error_prob: one copy per noisy trace is wrong by one digit (same digit count); each result
    # block is what the real calculator returns for the call as written, so the answer is wrong too,
    # and the exact step values turn to 0 from the first wrong call on
    fenced = PARSERS.get("fenced")
    tools = {"calculator": TOOLS.get("calculator")}
    noisy = make_tool_rows(
        ArithConfig(min_steps=1, max_steps=3, teacher_error_prob=1.0), 200, seed=4, split="train"
    )
    sites = set()
    for r in noisy:
        q, sol, truth = (
            r["prompt"][0]["content"],
            r["extra_info"]["solution"],
            r["reward_model"]["ground_truth"],
        )
        text, calls, first_zero = sol, [], None
        while (found := fenced.find(text, tools)) is not None:
            obs = execute_call(found.call, offered=["calculator"])
            assert not obs.error
            written = fenced.observation(obs.text)
            assert text[found.end : found.end + len(written)] == written  # the block is the tool's own result
            calls.append(text[: found.end])
            prefix = sol[: len(sol) - len(text) + found.end]
            if first_zero is None and tool_step_value(q, prefix) == 0.0:
                first_zero = len(calls)
            text = text[found.end + len(written) :]
        answer = text.removeprefix("The answer is\n")
        assert answer != truth and answer.isdigit()
        assert tool_step_value(q, sol) == 0.0
        sites.add("answer" if first_zero is None else first_zero)
    assert sites >= {1, 2, "answer"}  # wrong copies land in first calls, later calls and answers
    # with 0 the traces are the default ones, draw for draw
    assert make_tool_rows(CFG, 20, seed=4, split="train") == make_tool_rows(
        ArithConfig(min_steps=1, max_steps=3, teacher_error_prob=0.0), 20, seed=4, split="train"
    )
    half = make_tool_rows(
        ArithConfig(min_steps=1, max_steps=3, teacher_error_prob=0.5), 400, seed=4, split="train"
    )
    wrong = sum(tool_step_value(r["prompt"][0]["content"], r["extra_info"]["solution"]) == 0.0 for r in half)
    assert 150 <= wrong <= 250
