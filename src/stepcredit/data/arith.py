"""The synthetic ``arith`` task: multi-step arithmetic word problems with integer answers.

Each problem starts from a quantity and applies ``steps`` operations (the difficulty knob). The
reference chain-of-thought is written in a natural style with discourse markers ("Let me ", "So ",
"But ", "Wait,", "Actually,") so the process-reward segmenter has real episodes to find; a share of
the traces make an arithmetic slip and correct it. Every trace ends with "The answer is N.".
Generation is deterministic by seed.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from stepcredit.config import ArithConfig

DATA_SOURCE = "arith"

_NAMES = [
    "Ann",
    "Ben",
    "Cal",
    "Dee",
    "Eve",
    "Finn",
    "Gus",
    "Hal",
    "Ivy",
    "Jo",
    "Kim",
    "Lou",
    "Max",
    "Ned",
    "Oli",
    "Pam",
]
_ITEMS = ["apples", "pens", "coins", "cards", "books", "eggs", "shells", "stamps", "beads", "rocks"]
# (verb phrase template, sign); the templates read "She buys 3 more."
_ADD = ["gets {n} more", "buys {n} more", "finds {n} more", "is given {n} more"]
_SUB = ["gives away {n}", "loses {n}", "sells {n}", "uses {n}"]
# Wasted episodes of long chains: they restate the running total and change nothing.
_WASTE = ["Let me check: that leaves {v}.", "Hmm, {v} {item} so far.", "I need to keep going from {v}."]
# the wasted episodes' templates with any number for {v} and any word for {item}
_WASTE_RE = re.compile(
    "|".join(
        re.escape(w).replace(re.escape("{v}"), r"-?\d+").replace(re.escape("{item}"), r"\w+") for w in _WASTE
    )
)


def count_wasted(text: str) -> int:
    """Wasted episodes (restatements that change nothing, ``waste_prob``'s templates) in a response."""
    return len(_WASTE_RE.findall(text))


_SIGN = {"+": 1, "-": -1}
"""A step's sign -> the factor of its amount."""
_LEAD = {"+": "So", "-": "But"}
"""A solution step's first word by the step's sign."""


@dataclass(frozen=True)
class ArithProblem:
    name: str
    item: str
    start: int
    ops: tuple[tuple[str, int, str], ...]
    """(sign '+'/'-', amount, phrase) per step."""

    @property
    def answer(self) -> int:
        v = self.start
        for sign, n, _ in self.ops:
            v += _SIGN[sign] * n
        return v

    @property
    def question(self) -> str:
        parts = [f"{self.name} has {self.start} {self.item}."]
        for _, _, phrase in self.ops:
            parts.append(f"Then {phrase}.")
        parts.append(f"How many {self.item} now?")
        return " ".join(parts)


def make_problem(rng: random.Random, cfg: ArithConfig) -> ArithProblem:
    steps = rng.randint(cfg.min_steps, cfg.max_steps)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    value = rng.randint(1, cfg.max_operand)
    start = value
    ops = []
    for _ in range(steps):
        # subtract only what is there, so every intermediate quantity stays >= 0
        if value > 0 and rng.random() < 0.5:
            n = rng.randint(1, min(value, cfg.max_operand))
            ops.append(("-", n, rng.choice(_SUB).format(n=n)))
            value -= n
        else:
            n = rng.randint(1, cfg.max_operand)
            if 0 < cfg.max_total < value + n:
                # over the cap the same draw subtracts instead: totals stay in a range a tiny model
                # can learn by heart, however long the chain (no extra draw, so no stream changes)
                n = min(n, value)
                ops.append(("-", n, rng.choice(_SUB).format(n=n)))
                value -= n
                continue
            ops.append(("+", n, rng.choice(_ADD).format(n=n)))
            value += n
    return ArithProblem(name=name, item=item, start=start, ops=tuple(ops))


def reference_trace(
    p: ArithProblem,
    rng: random.Random,
    *,
    mistake_prob: float,
    teacher_error_prob: float = 0.0,
    slip_prob: float = 0.0,
    waste_prob: float = 0.0,
) -> str:
    """A natural chain-of-thought for ``p``, sometimes with a slip that is noticed and corrected.

    With probability ``teacher_error_prob`` the teacher slips and does not notice: the wrong value is
    carried on and the final answer is wrong (a noisy demonstration). ``slip_prob`` adds corrected slips
    at any operation and ``waste_prob`` wasted episodes after one (long chains). Draws from ``rng`` happen
    in the same order whatever the probabilities, except for the extra draws of a non-zero
    ``teacher_error_prob``, ``slip_prob`` or ``waste_prob``, so the default traces never change.
    """
    out = [f"Let me start with {p.start}."]
    v = p.start
    slip_at = rng.randrange(len(p.ops)) if rng.random() < mistake_prob else -1
    silent_at = -1
    if teacher_error_prob > 0 and rng.random() < teacher_error_prob:
        silent_at = rng.randrange(len(p.ops))
    for i, (sign, n, _) in enumerate(p.ops):
        new = v + _SIGN[sign] * n
        lead = _LEAD[sign]
        if i == silent_at:
            new = new + 1 if new == 0 or rng.random() < 0.5 else new - 1
            out.append(f"{lead} {v} {sign} {n} = {new}.")
        elif i == slip_at or (slip_prob > 0 and rng.random() < slip_prob):
            wrong = new + rng.choice([-1, 1]) if new > 0 else new + 1
            out.append(f"{lead} {v} {sign} {n} = {wrong}.")
            fix = rng.choice(["Wait,", "Actually,"])
            out.append(f"{fix} {v} {sign} {n} = {new}.")
        else:
            out.append(f"{lead} {v} {sign} {n} = {new}.")
        if waste_prob > 0 and rng.random() < waste_prob:
            out.append(rng.choice(_WASTE).format(v=new, item=p.item))
        v = new
    out.append(f"The answer is {v}.")
    return " ".join(out)


def make_rows(cfg: ArithConfig, n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` rows in the verl parquet schema (data_source, prompt, ability, reward_model, extra_info).

    Train and validation splits use disjoint seeds; the SFT target is ``extra_info["solution"]``.
    """
    salt = {"train": 0, "val": 1_000_003, "test": 2_000_029}.get(split, 3_000_017)
    rng = random.Random(seed * 7_919 + salt)
    rows = []
    for i in range(n):
        p = make_problem(rng, cfg)
        trace = reference_trace(
            p,
            rng,
            mistake_prob=cfg.mistake_prob,
            teacher_error_prob=cfg.teacher_error_prob,
            slip_prob=cfg.slip_prob,
            waste_prob=cfg.waste_prob,
        )
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": p.question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
                "extra_info": {"split": split, "index": i, "steps": len(p.ops), "solution": trace},
            }
        )
    return rows


# ------------------------------------------------------------------------------ exact step values
_START_RE = re.compile(r" has (\d+) ")
_THEN_RE = re.compile(r"Then ([^.]*?)(\d+)( more)?\.")
_EQ_RE = re.compile(r"(-?\d+) ([+-]) (\d+) = (-?\d+)")
_BEGIN_RE = re.compile(r"start with (-?\d+)")
_ANSWER_RE = re.compile(r"answer is (-?\d+)")
_UNCHECKED_RE = re.compile(r"\d")  # a number that no checked statement holds
ANSWER_END = r"answer is -?\d+\."
"""Where an arith response's answer is complete: "The answer is N." with its full stop, the end of every
trace (:func:`make_rows`); the answer is an integer, so the full stop ends the number
(``stepcredit.data.ANSWER_ENDS``)."""
_SUB_VERBS = tuple(t.split(" {n}")[0] for t in _SUB)


def chain_of(question: str) -> tuple[list[int], list[tuple[str, int]]]:
    """(states, ops) of a question written by :func:`make_problem`: the running quantities
    s_0 (the start), s_1, ..., s_k and the operations (sign, amount) between them."""
    m = _START_RE.search(question)
    if m is None:
        raise ValueError(f"not an arith question: {question[:60]!r}")
    states, ops = [int(m.group(1))], []
    for phrase, n, _ in _THEN_RE.findall(question):
        sign = "-" if phrase.strip().startswith(_SUB_VERBS) else "+"
        ops.append((sign, int(n)))
        states.append(states[-1] + _SIGN[sign] * int(n))
    return states, ops


def step_value(question: str, prefix: str) -> float:
    """The exact value of a reasoning prefix: 1.0 when the quantity it last stated is on the problem's
    true chain and checked, else 0.0.

    * a final "The answer is N": 1 iff N is the answer;
    * else the last equation "a +/- n = w": 1 iff it is one of the problem's own steps, done right
      (a = s_j, (+/-, n) = op_(j+1), w = s_(j+1)): a slip makes it 0, its correction 1 again;
    * else "start with N": 1 iff N = s_0; a prefix that has stated nothing yet: 1;
    * a number written after the last such statement that none of them checks ("So 0 + 4." without its
      result, "So 12."): 0 until a later statement is checked. Left at the last checked value, such a
      step dodged the -1 a wrong equation costs, and a policy trained on this credit learned to write
      half its steps that way (docs/results/regime_weaksft.md).
    Wasted restatements ("that leaves N", ``_WASTE``) change nothing.
    """
    states, ops = chain_of(question)
    answers = list(_ANSWER_RE.finditer(prefix))
    if answers:
        return float(int(answers[-1].group(1)) == states[-1])
    eqs = list(_EQ_RE.finditer(prefix))
    begin = list(_BEGIN_RE.finditer(prefix))
    last = max([*eqs[-1:], *begin[-1:]], key=lambda m: m.end(), default=None)
    if _UNCHECKED_RE.search(_WASTE_RE.sub(" ", prefix[last.end() if last else 0 :])):
        return 0.0
    if eqs and last is eqs[-1]:
        a, sign, n, w = last.groups()
        return float(
            any(
                (int(a), sign, int(n), int(w)) == (states[j], ops[j][0], ops[j][1], states[j + 1])
                for j in range(len(ops))
            )
        )
    if last is not None:
        return float(int(last.group(1)) == states[0])
    return 1.0


# ------------------------------------------------------------------------------ the tool variant
TOOLS_DATA_SOURCE = "arith_tools"
_BOX_RE = re.compile(r" has (\d+) boxes with (\d+) ")
# an operation's amount is followed by a space ("Then sells 317 eggs."), never by the full stop, so the
# BPE tokenizer writes it with the same tokens in the question and in the call that copies it
_TOOL_THEN_RE = re.compile(r"Then ([^.\d]*?)(\d+)[ .]")
_CALL_RE = re.compile(r"```calculator\n(.*?)\n```", re.DOTALL)
_TOOL_ANSWER_RE = re.compile(r"answer is\s*(-?\d+)")
_TOOL_MIN, _TOOL_MAX = 10_000, 99_999
"""The range of every running total (5 digits)."""
_TOOL_OBSERVATION = "\n```output\n{}\n```\n"
"""How the ``fenced`` convention appends a result (:data:`stepcredit.tools.PARSERS`), as the traces write it."""


@dataclass(frozen=True)
class ToolProblem:
    """``boxes`` boxes of ``per_box`` items, then add/subtract operations: a multiplication too large
    for a tiny model to do in its head, which the calculator does exactly."""

    name: str
    item: str
    boxes: int
    per_box: int
    ops: tuple[tuple[str, int, str], ...]

    @property
    def states(self) -> list[int]:
        out = [self.boxes * self.per_box]
        for sign, n, _ in self.ops:
            out.append(out[-1] + n if sign == "+" else out[-1] - n)
        return out

    @property
    def question(self) -> str:
        parts = [f"{self.name} has {self.boxes} boxes with {self.per_box} {self.item} each."]
        parts += [f"Then {phrase} {self.item}." for _, _, phrase in self.ops]
        parts.append(f"How many {self.item} now?")
        return " ".join(parts)


def make_tool_problem(rng: random.Random, cfg: ArithConfig) -> ToolProblem:
    """2-digit boxes times 3-digit items per box, then ``min_steps - 1`` to ``max_steps - 1`` additions
    or subtractions of up to 3 digits. Every running total has exactly 5 digits (32 * 316 >= 10,000;
    99 * 999 < 100,000; an operation that would leave that range changes sign), so a number copied
    from a result block into the next call or the answer sits the same number of tokens back."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    boxes, per_box = rng.randint(32, 99), rng.randint(316, 999)
    value, ops = boxes * per_box, []
    for _ in range(rng.randint(cfg.min_steps, cfg.max_steps) - 1):
        n = rng.randint(10, 999)
        sub = rng.random() < 0.5
        if (sub and value - n < _TOOL_MIN) or (not sub and value + n > _TOOL_MAX):
            sub = not sub
        if sub:
            ops.append(("-", n, rng.choice(_SUB).format(n=n)))
            value -= n
        else:
            ops.append(("+", n, rng.choice(_ADD).format(n=n)))
            value += n
    return ToolProblem(name, item, boxes, per_box, tuple(ops))


def _miscopy(n: int, rng: random.Random) -> int:
    """``n`` with one digit copied wrong (a different digit, never a leading 0): the same number of
    digits, so the wrong copy takes the place and the token count of the right one."""
    digits = list(str(n))
    i = rng.randrange(len(digits))
    digits[i] = rng.choice([d for d in "0123456789" if d != digits[i] and (i > 0 or d != "0")])
    return int("".join(digits))


def tool_trace(
    p: ToolProblem, rng: random.Random, *, teacher_error_prob: float = 0.0
) -> tuple[str, list[tuple[int, int]]]:
    """The SFT trace and the character spans of its result blocks (never trained on): one fenced
    ``calculator`` call per operation, each followed by its result block (as the ``fenced``
    convention appends it), then "The answer is" and the last result on its own line.

    Every number the policy writes is a copy, written so that the tokenizer gives it the same tokens
    as where it is copied from: the first call's operands as in the question (after a space), a later
    call's running total and the answer as in the result block (after a newline, one digit per token).
    A tiny model learns to copy tokens; mapping the question's "▁23" token to the result's "2" "3", or
    a result's digits to "▁23" "0" "8" "4." in "The answer is 23084.", is a digit lookup it did not
    learn in 300 SFT steps (0 % validation accuracy with the older format).

    With probability ``teacher_error_prob`` (draws from ``rng``; none when it is 0, so the default
    traces never change) the teacher copies one number wrong, one digit of it, and does not notice: an
    operand of the first call, a running total carried into the next call, or the answer. Each result
    block holds what the calculator returns for the call as written, so the wrong value is carried on
    and the final answer is wrong: the tool analogue of ``reference_trace``'s silent slip.
    """
    # the copy the noisy teacher gets wrong: 0 = an operand of the first call, j = the running total
    # copied into call j + 1, len(ops) + 1 = the answer; -1 = none (no draw from rng at all)
    wrong_at = -1
    if teacher_error_prob > 0 and rng.random() < teacher_error_prob:
        wrong_at = rng.randrange(len(p.ops) + 2)
    boxes, per_box = p.boxes, p.per_box
    if wrong_at == 0 and rng.random() < 0.5:
        boxes = _miscopy(boxes, rng)
    elif wrong_at == 0:
        per_box = _miscopy(per_box, rng)
    exprs, value = [f" {boxes} * {per_box}"], boxes * per_box  # value: what the calculator returns
    values = [value]
    for j, (sign, n, _) in enumerate(p.ops, start=1):
        copied = _miscopy(value, rng) if wrong_at == j else value
        value = copied + n if sign == "+" else copied - n
        exprs.append(f"{copied} {sign} {n}")
        values.append(value)
    text, spans = "", []
    for expr, result in zip(exprs, values, strict=True):
        text += f"```calculator\n{expr}\n```"
        obs = _TOOL_OBSERVATION.format(result)
        spans.append((len(text), len(text) + len(obs)))
        text += obs
    answer = _miscopy(value, rng) if wrong_at == len(p.ops) + 1 else value
    return text + f"The answer is\n{answer}", spans


def direct_trace(answer: str) -> str:
    """The trace of the same problem answered without a tool (the answer in the traces' own form)."""
    return f"The answer is\n{answer}"


def make_tool_rows(cfg: ArithConfig, n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` rows of the tool task in the verl schema (the SFT target is ``extra_info["solution"]``,
    its result blocks' character spans ``extra_info["solution_observations"]``)."""
    salt = {"train": 0, "val": 1_000_003, "test": 2_000_029}.get(split, 3_000_017)
    rng = random.Random(seed * 7_919 + salt + 17)
    rows = []
    for i in range(n):
        p = make_tool_problem(rng, cfg)
        trace, spans = tool_trace(p, rng, teacher_error_prob=cfg.teacher_error_prob)
        rows.append(
            {
                "data_source": TOOLS_DATA_SOURCE,
                "prompt": [{"role": "user", "content": p.question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(p.states[-1])},
                "extra_info": {
                    "split": split,
                    "index": i,
                    "steps": len(p.ops) + 1,
                    "solution": trace,
                    "solution_observations": [list(s) for s in spans],
                },
            }
        )
    return rows


def tool_chain_of(question: str) -> list[int]:
    """The running totals s_1 (the product), ..., s_k of a question written by :func:`make_tool_problem`."""
    m = _BOX_RE.search(question)
    if m is None:
        raise ValueError(f"not an arith_tools question: {question[:60]!r}")
    states = [int(m.group(1)) * int(m.group(2))]
    for phrase, n in _TOOL_THEN_RE.findall(question):
        sign = "-" if phrase.strip().startswith(_SUB_VERBS) else "+"
        states.append(states[-1] + int(n) if sign == "+" else states[-1] - int(n))
    return states


def tool_step_value(question: str, prefix: str) -> float:
    """The exact value of a multi-turn prefix under an ideal continuation (the calculator is exact, so
    a call is worth what it computes, before its result is read):

    * a final "The answer is N" (N on the same or the next line): 1 iff N is the answer;
    * else the j-th ``calculator`` call: 1 iff its expression's value is s_j (s_k for calls past the
      k-th), 0 for a wrong or unreadable expression;
    * a prefix with no call yet: 1.
    """
    from stepcredit.tools import ToolError
    from stepcredit.tools.builtin import calculate

    states = tool_chain_of(question)
    answers = _TOOL_ANSWER_RE.findall(prefix)
    if answers:
        return float(int(answers[-1]) == states[-1])
    calls = _CALL_RE.findall(prefix)
    if not calls:
        return 1.0
    try:
        got = calculate(calls[-1])
    except ToolError:
        return 0.0
    return float(got == states[min(len(calls), len(states)) - 1])
