"""Offline instruction-following and multiple-choice tasks for the multi-domain preset.

``ifeval``: "Describe the cat in one sentence. Your entire response should be in English, and in all
lowercase letters." Each prompt joins a topic with one or two of IFEval's verifiable constraints
(the real ``instruction_id_list`` and ``kwargs``, so the ``ifeval`` verifier scores it like an IFEval
row); ``extra_info["solution"]`` is a response that meets them, the SFT trace. ``arith_mc``: a sum with
four options; the answer is a letter. Both are plain ASCII (the tiny model's tokenizer) and
deterministic by seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

IFEVAL_SOURCE = "ifeval"
MC_SOURCE = "arith_mc"

_TOPICS = ["cat", "river", "train", "apple", "storm", "garden", "clock", "bridge", "winter", "market"]
_FACTS = {
    "cat": "the cat sleeps in the sun",
    "river": "the river runs to the sea",
    "train": "the train leaves at noon",
    "apple": "the apple is red and sweet",
    "storm": "the storm brings rain and wind",
    "garden": "the garden has tall green trees",
    "clock": "the clock ticks on the wall",
    "bridge": "the bridge spans the wide river",
    "winter": "winter days are short and cold",
    "market": "the market sells fresh bread",
}

# One constraint: (instruction id, kwargs drawn from the rng, its wording, how a solution meets it).
Constraint = tuple[str, dict[str, Any], str, Callable[[str], str]]


def _lower(rng: random.Random) -> Constraint:
    return ("change_case:english_lowercase", {}, "Use only lowercase letters.", str.lower)


def _upper(rng: random.Random) -> Constraint:
    return ("change_case:english_capital", {}, "Use only capital letters.", str.upper)


def _no_comma(rng: random.Random) -> Constraint:
    return ("punctuation:no_comma", {}, "Do not use any commas.", lambda s: s.replace(",", ""))


def _end(rng: random.Random) -> Constraint:
    phrase = rng.choice(["Is there anything else?", "That is all.", "The end."])
    return (
        "startend:end_checker",
        {"end_phrase": phrase},
        f'End your response with "{phrase}".',
        lambda s: f"{s} {phrase}",
    )


def _keyword(rng: random.Random) -> Constraint:
    word = rng.choice(["blue", "quiet", "bright", "small"])
    return (
        "keywords:existence",
        {"keywords": [word]},
        f'Include the word "{word}".',
        lambda s: f"{s} it is {word}.",
    )


def _quote(rng: random.Random) -> Constraint:
    return ("startend:quotation", {}, "Wrap your response in double quotes.", lambda s: f'"{s}"')


def _short(rng: random.Random) -> Constraint:
    n = rng.choice([20, 30, 40])
    return (
        "length_constraints:number_words",
        {"num_words": n, "relation": "less than"},
        f"Answer in fewer than {n} words.",
        lambda s: s,
    )


_CASES = [_lower, _upper]
_OTHERS = [_no_comma, _end, _keyword, _short]
# Applied last (they wrap or append): quotation after everything else.
_LAST = [_quote]


def make_problem(rng: random.Random) -> tuple[str, str, list[str], list[dict[str, Any]]]:
    """(prompt, a response that meets every constraint, instruction ids, their kwargs)."""
    topic = rng.choice(_TOPICS)
    picks = [rng.choice(_OTHERS)(rng)]
    if rng.random() < 0.5:
        picks.insert(0, rng.choice(_CASES)(rng))
    if rng.random() < 0.25:
        picks.append(_LAST[0](rng))
    text = f"{_FACTS[topic].capitalize()}, and that is how it is."
    # a case constraint applies to the whole response, appended text too: it goes last
    for _, _, _, apply in sorted(picks, key=lambda p: p[0].startswith("change_case")):
        text = apply(text)
    prompt = f"Write one sentence about the {topic}. " + " ".join(p[2] for p in picks)
    return prompt, text, [p[0] for p in picks], [p[1] for p in picks]


def _salted(seed: int, split: str, base: int) -> random.Random:
    salt = {"train": 17, "val": 1_000_037, "test": 2_000_081}.get(split, 3_000_061)
    return random.Random(seed * 7_919 + salt + base)


def make_rows(n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` IFEval-schema rows in the verl schema; the constraints are also the ground truth."""
    rng = _salted(seed, split, 0)
    rows = []
    for i in range(n):
        prompt, solution, ids, kwargs = make_problem(rng)
        gt = {"instruction_id_list": ids, "kwargs": kwargs}
        rows.append(
            {
                "data_source": IFEVAL_SOURCE,
                "prompt": [{"role": "user", "content": prompt}],
                "ability": "instruction_following",
                "reward_model": {"style": "rule", "ground_truth": gt},
                "extra_info": {"split": split, "index": i, "solution": solution, "prompt": prompt},
            }
        )
    return rows


def make_mc_rows(n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` four-option sums ("What is 7 + 5? (A) 11 (B) 12 ..."); the key is the right option's letter."""
    rng = _salted(seed, split, 500_009)
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        right = a + b
        wrong = rng.sample([d for d in range(-4, 5) if d], 3)
        options = [str(right + d) for d in [0, *wrong]]
        rng.shuffle(options)
        letter = "ABCD"[options.index(str(right))]
        listed = " ".join(f"({c}) {o}" for c, o in zip("ABCD", options, strict=True))
        question = f"What is {a} + {b}? {listed} Answer with the letter."
        rows.append(
            {
                "data_source": MC_SOURCE,
                "prompt": [{"role": "user", "content": question}],
                "ability": "multiple_choice",
                "reward_model": {"style": "rule", "ground_truth": letter},
                "extra_info": {
                    "split": split,
                    "index": i,
                    "options": options,
                    "solution": f"{a} + {b} = {right}. The answer is ({letter}).",
                },
            }
        )
    return rows
