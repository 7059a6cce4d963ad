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
        boxes, per_box = map(int, re.search(r" (\d+) boxes of (\d+)\?", q).groups())
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


def test_every_copied_number_sits_a_fixed_distance_before_its_copy() -> None:
    # every number the policy writes is a copy (of the question's operands, or of a result), and with
    # one token per character each sits the same number of tokens before its copy in every problem with
    # as many steps: the positional copies a tiny model learns in a few hundred SFT steps
    tok = build_tokenizer("char")
    distances: dict[int, set[tuple[int, ...]]] = {}
    for r in make_tool_rows(CFG, 60, seed=3, split="train"):
        q, sol = r["prompt"][0]["content"], r["extra_info"]["solution"]
        prompt = tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
        text = prompt + sol
        assert len(tok(text, add_special_tokens=False)["input_ids"]) == len(tok(prompt)["input_ids"]) + len(
            sol
        )
        boxes, per_box = re.search(r" (\d+) boxes of (\d+)\?", q).groups()
        amounts = re.findall(r" will \w+ (\d+) ", q)
        calls = [m.start(1) + len(prompt) for m in re.finditer(r"```calculator\n(.*?)\n```", sol)]
        results = [m.start(1) + len(prompt) for m in re.finditer(r"```output\n(\d+)\n", sol)]
        answer = len(text) - len(r["reward_model"]["ground_truth"])
        src = [prompt.index(f" {boxes} boxes") + 1, prompt.index(f" {per_box}?") + 1]
        dst = [calls[0] + 1, calls[0] + 1 + len(boxes) + 3]  # " 68 * 692"
        assert text[dst[0] : dst[0] + 2] == boxes and text[dst[1] : dst[1] + 3] == per_box
        for j, n in enumerate(amounts):  # call j + 1: "<result j> <sign> <amount j>"
            src += [results[j], prompt.index(f" {n} ") + 1]
            dst += [calls[j + 1], calls[j + 1] + 5 + 3]
            assert text[dst[-1] : dst[-1] + 3] == n
        src.append(results[-1])
        dst.append(answer)
        assert all(text[s : s + 2] == text[d : d + 2] for s, d in zip(src, dst, strict=True))
        distances.setdefault(len(amounts), set()).add(tuple(d - s for s, d in zip(src, dst, strict=True)))
    assert sorted(distances) == [0, 1, 2] and all(len(d) == 1 for d in distances.values()), distances


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


def test_step_value_by_hand() -> None:
    q = "Ann will sell 40 coins. Ann will find 7 coins. How many coins will Ann have then, starting with 12 boxes of 345?"
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
