"""greedy_bisect: greedy-continuation verdicts only where they change, found by bisection."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from stepcredit.config import ProcessConfig
from stepcredit.models import build_tokenizer
from stepcredit.process import VALUE_ESTIMATORS, compute_prefix_values, score_each
from stepcredit.process.bisection import greedy_bisect
from stepcredit.process.continuation import greedy_continuation
from stepcredit.process.continuation_plan import is_whole
from stepcredit.process.values import PrefixRequest, ValueContext, spending
from stepcredit.rollout import engines
from stepcredit.rollout.engines import Completion
from stepcredit.rollout.stops import WINDOW
from stepcredit.types import Batch, Sample

OK_STEP, BAD_STEP = "So 1 + 1 = 2. ", "So 4 + 4 = 8. "


class GreedyOk:
    """A policy bound to itself as its engine: every continuation is " ok" (so a prefix's verdict is
    whether it is free of the wrong step). ``rows`` counts the continuations asked for, per call."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.module = torch.nn.Linear(1, 1)
        self.rows: list[int] = []
        self.contexts: list[tuple[int, ...]] = []
        engines.bind(self.module, self)  # type: ignore[arg-type]

    def sample(self, model: Any, tok: Any, contexts: Sequence[Sequence[int]], spec: Any, **_: Any) -> list:
        self.rows.append(len(contexts) * spec.n)
        self.contexts += [tuple(c) for c in contexts]
        return [Completion(self.tok(" ok")["input_ids"]) for _ in contexts for _ in range(spec.n)]


def verdict(sample: Sample, text: str) -> float:
    return 1.0 if text.endswith("ok") and "= 8" not in text else 0.0


def _values(batch: Batch, tok: Any, name: str, score: Any = None) -> tuple[list[list[float]], list[int], int]:
    policy = GreedyOk(tok)
    cfg = ProcessConfig(value_estimator=name, mc_max_new_tokens=8, min_episode_tokens=1)
    with spending() as spent:
        got = compute_prefix_values(policy.module, tok, batch, cfg, score_fn=score or score_each(verdict))
    return got.values, policy.rows, spent.generated_tokens


def test_registered_as_a_generating_verifier_estimator() -> None:
    spec = VALUE_ESTIMATORS.get("greedy_bisect")
    assert spec.needs_verifier and spec.generates and spec.terminal_is_reward and spec.success_probability
    assert spec.takes_tools


def test_the_values_of_greedy_continuation_for_a_fraction_of_its_continuations(
    batch_factory: Callable[..., Batch],
) -> None:
    # Eight responses of eight steps to one prompt, the wrong step at step 1..8 (each verdict changes
    # once, there), one with no wrong step that ends "So done." (its own reward 0: the change is at the
    # last step) and one right answer (its reward 1 = V_0: nothing to search).
    tok = build_tokenizer()
    rows = [
        ("q", "".join(BAD_STEP if s == j else OK_STEP for s in range(8)) + "So done.", "7") for j in range(8)
    ]
    rows += [("q", OK_STEP * 8 + "So done.", "7"), ("q", OK_STEP * 8 + "So ok", "7")]
    batch = batch_factory(tok, rows)
    want, greedy_rows, greedy_tokens = _values(batch, tok, "greedy_continuation")
    got, bisect_rows, bisect_tokens = _values(batch, tok, "greedy_bisect")
    assert got == want
    # each row's verdicts: 1 until the wrong step, 0 from it on (checked, so the equality means something)
    for j in range(8):
        assert want[j][0] == 1.0 and want[j][-1] == 0.0 and sum(want[j]) == j + 1
    assert set(want[-1]) == {1.0}
    # V_0: one continuation for the shared prompt; then about log2(9 boundaries) per searched row (9
    # rows), one engine call per round; the right row costs nothing beyond V_0
    steps = len(want[0]) - 1
    assert sum(bisect_rows) <= 1 + 9 * math.ceil(math.log2(steps))
    assert len(bisect_rows) == 1 + math.ceil(math.log2(steps))
    assert sum(bisect_rows) < sum(greedy_rows) and bisect_tokens < greedy_tokens


def test_a_context_is_continued_once_across_the_rounds(batch_factory: Callable[..., Batch]) -> None:
    # Responses to one prompt share their first steps, and their searches reach the same prefixes in
    # different rounds: each context is continued (and scored) once per batch.
    tok = build_tokenizer()
    # of 8, 12 and 16 steps, so the bisections of one prefix fall in different rounds
    rows = [
        ("q", OK_STEP * j + BAD_STEP + OK_STEP * (n - 1 - j) + "So done.", "7")
        for n in (8, 12, 16)
        for j in range(2, n, 3)
    ]
    batch = batch_factory(tok, rows)
    want, _, _ = _values(batch, tok, "greedy_continuation")
    policy = GreedyOk(tok)
    cfg = ProcessConfig(value_estimator="greedy_bisect", mc_max_new_tokens=8, min_episode_tokens=1)
    got = compute_prefix_values(policy.module, tok, batch, cfg, score_fn=score_each(verdict)).values
    assert got == want
    assert len(policy.rows) > 2  # several rounds
    assert len(policy.contexts) == len(set(policy.contexts))


def test_a_verdict_that_changes_twice_keeps_the_sum_and_a_change_inside(
    batch_factory: Callable[..., Batch],
) -> None:
    # Verdicts 1, 0, 0, 1, ...: the wrong step is undone ("fixed"), then the response ends wrong. The
    # search finds one change; the values still start at V_0 and end at the reward.
    tok = build_tokenizer()

    def fickle(sample: Sample, text: str) -> float:
        return 1.0 if text.endswith("ok") and text.count("= 8") != 1 else 0.0

    resp = OK_STEP + BAD_STEP + OK_STEP + BAD_STEP + OK_STEP * 3 + "So done."
    batch = batch_factory(tok, [("q", resp, "7")])
    want, _, _ = _values(batch, tok, "greedy_continuation", score_each(fickle))
    got, _, _ = _values(batch, tok, "greedy_bisect", score_each(fickle))
    assert want[0] != got[0]  # greedy_continuation sees both changes
    assert got[0][0] == want[0][0] == 1.0 and got[0][-1] == want[0][-1] == 0.0
    assert set(got[0]) == {0.0, 1.0}
    flips = [i for i in range(1, len(got[0])) if got[0][i] != got[0][i - 1]]
    assert len(flips) == 1  # one change point, where a computed verdict differs from V_0


def test_a_verdict_that_cannot_be_computed_is_carried_as_nan(batch_factory: Callable[..., Batch]) -> None:
    tok = build_tokenizer()
    resp = "".join(BAD_STEP if s == 5 else OK_STEP for s in range(8)) + "So done."
    batch = batch_factory(tok, [("q", resp, "7")])
    calls: list[int] = []

    def flaky(samples: Any, texts: Any) -> list[float]:
        calls.append(len(texts))
        # the first probe has no verdict: episode 1, where the response leaves V_0's greedy
        # continuation (" ok") at once
        return [math.nan if len(calls) == 2 else verdict(s, t) for s, t in zip(samples, texts, strict=True)]

    got, _, _ = _values(batch, tok, "greedy_bisect", flaky)
    row = got[0]
    assert row[0] == 1.0 and row[-1] == 0.0 and len(calls) == 2  # the search stopped at the NaN
    assert all(math.isnan(v) for v in row[1:-1])


class GreedyPath(GreedyOk):
    """The greedy path is ``PATH``: a context on it is continued with the rest of it (and eos), one off
    it with " So ok" (its text holds the wrong step, so its verdict is 0 all the same)."""

    PATH = OK_STEP * 8 + "So ok"

    def __init__(self, tok: Any, prompt_len: int) -> None:
        super().__init__(tok)
        self.prompt_len = prompt_len

    def sample(self, model: Any, tok: Any, contexts: Sequence[Sequence[int]], spec: Any, **_: Any) -> list:
        self.rows.append(len(contexts) * spec.n)
        out = []
        for c in contexts:
            head = self.tok.decode(list(c[self.prompt_len :]), skip_special_tokens=True)
            rest = self.PATH[len(head) :] if self.PATH.startswith(head) else " So ok"
            out.append(Completion(self.tok(rest)["input_ids"] + [self.tok.eos_token_id]))
        return out


def test_a_response_on_the_greedy_path_until_its_slip_costs_one_continuation(
    batch_factory: Callable[..., Batch],
) -> None:
    # Responses that follow the policy's greedy path (PATH) until a slip at step j: V_0's continuation
    # is the path, so every boundary before the slip shares its verdict for free, and the first probe,
    # the episode where the response left the path, is the change: one continuation per response.
    # greedy_continuation (which shares too) continues every boundary after the slip.
    tok = build_tokenizer()
    rows = [("q", OK_STEP * j + BAD_STEP + OK_STEP * (7 - j) + "So done.", "7") for j in range(8)]
    batch = batch_factory(tok, rows)
    prompt_len = int(batch.prompt_mask_BP[0].sum())
    assert bool(batch.prompt_mask_BP[0, -prompt_len:].all())  # left-padded: the prompt is the last tokens

    def run(name: str) -> tuple[list[list[float]], list[int]]:
        policy = GreedyPath(tok, prompt_len)
        cfg = ProcessConfig(value_estimator=name, mc_max_new_tokens=200, min_episode_tokens=1)
        got = compute_prefix_values(policy.module, tok, batch, cfg, score_fn=score_each(verdict))
        return got.values, policy.rows

    want, greedy_rows = run("greedy_continuation")
    got, bisect_rows = run("greedy_bisect")
    assert got == want
    assert all(want[j][j] == 1.0 and want[j][j + 1] == 0.0 for j in range(8))  # the change is at the slip
    assert bisect_rows == [1, 8]  # V_0 once for the shared prompt, then one probe per response
    assert sum(greedy_rows) > sum(bisect_rows)


def test_continuing_the_rollout_cache_gives_the_values_of_the_plain_loop(
    model_factory: Callable[..., tuple[Any, Any]],
) -> None:
    # A real (random) model: the search continued from the rollout's KV cache (training) and from
    # prefilled contexts (the probe) reaches the same verdicts, and the same search, round by round.
    from stepcredit.models.logprobs import token_logprobs
    from stepcredit.process.bisection import greedy_bisect
    from stepcredit.process.values import PrefixRequest, ValueContext
    from stepcredit.rollout.engines.api import left_pad
    from stepcredit.types import RolloutCache

    model, tok = model_factory("llama", "sdpa")
    prompts = [tok("q: 3 + 4?")["input_ids"], tok("q: 12 - 5 + 1?")["input_ids"]]
    responses = [
        tok(x)["input_ids"] for x in ("So 3 + 4 = 7. So 7 - 1 = 6. So done.", "So 12 - 5 = 7. So 7 + 1 = 8.")
    ]
    p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
    r_ids, r_mask = left_pad([r[::-1] for r in responses], tok.pad_token_id)
    r_ids, r_mask = r_ids.flip(1), r_mask.flip(1)  # right-padded responses
    caches: list[Any] = []
    ids, mask = torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1).long()
    with torch.no_grad():
        token_logprobs(model, ids, mask, n_response=r_ids.shape[1], cache_out=caches)
    body = RolloutCache(caches[0], (p_ids.shape[1] - p_mask.sum(1)).tolist(), ids.shape[1])
    s = Sample(prompt=({"role": "user", "content": "q"},), ground_truth="7")
    reqs = [
        PrefixRequest(s, p, r, list(range(0, len(r) + 1, 3)), "7")
        for p, r in zip(prompts, responses, strict=True)
    ]
    seen: list[list[str]] = []

    def verifier(samples: Any, texts: Any) -> list[float]:
        seen.append(sorted(texts))
        return [float(len(x) % 3 == 0) for x in texts]  # any deterministic verdict of the text

    cfg = ProcessConfig(mc_max_new_tokens=6)
    with torch.no_grad():
        cached = greedy_bisect(ValueContext(model, tok, reqs, cfg, verifier, body=body))
        rounds, seen[:] = list(seen), []
        plain = greedy_bisect(ValueContext(model, tok, reqs, cfg, verifier))
    assert cached == plain and rounds == seen
    assert len(rounds) > 1  # a search ran (some response's ends differ)


# ---------------------------------------------------------------------------- answered prefixes
ANSWER_PATH = "the answer is 7. So done."  # the policy's greedy path from the bare prompt


class AnswerPath:
    """Greedy decoding that follows ANSWER_PATH (then eos); ``honor_stop=False`` ignores the answer
    marker's stop rule, as the vLLM engine does (it runs on to eos)."""

    def __init__(self, tok: Any, plen: int, honor_stop: bool) -> None:
        self.tok, self.plen, self.honor_stop = tok, plen, honor_stop
        self.module = torch.nn.Linear(1, 1)
        engines.bind(self.module, self)  # type: ignore[arg-type]

    def sample(self, model: Any, tok: Any, contexts: Any, spec: Any, **_: Any) -> list:
        out = []
        for c in contexts:
            head = self.tok.decode(list(c[self.plen :]), skip_special_tokens=True)
            assert ANSWER_PATH.startswith(head)
            ids = self.tok(ANSWER_PATH[len(head) :], add_special_tokens=False)["input_ids"] + [
                self.tok.eos_token_id
            ]
            ids = ids[: spec.max_tokens]
            if spec.stop_pattern and self.honor_stop:
                for t in range(len(ids)):
                    w = self.tok.decode(ids[max(0, t + 1 - WINDOW) : t + 1], skip_special_tokens=True)
                    if re.search(spec.stop_pattern, w):
                        ids = ids[: t + 1]
                        break
            out.append(Completion(ids))
        return out


def ends_ok(samples: Any, texts: Any) -> list[float]:
    return [1.0 if t.endswith("ok") else 0.0 for t in texts]


@pytest.mark.parametrize(
    ("honor_stop", "cuts"),
    [
        (True, ["the answ", "the answer is 7. "]),  # a boundary inside the marker (hf engine)
        (False, ["the answer is 7. "]),  # a sentence-start boundary, engine without the stop rule
    ],
)
def test_an_answered_prefix_is_worth_the_reward(honor_stop: bool, cuts: list[str]) -> None:
    # A prefix that holds the answer marker is worth the response's own reward (greedy_continuation's
    # plan). A continuation that began inside the marker (its own text never completes it), or one from
    # an engine that runs past the marker, goes on to eos through the answered prefix: sharing its
    # verdict there gave the answered prefix V_0's value and moved the change a step late.
    tok = build_tokenizer()
    prompt = tok("<|user|>q<|assistant|>", add_special_tokens=False)["input_ids"]
    text = "the answer is 7. ok"
    resp = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    lens = [0] + [len(c) for c in cuts] + [len(text)]  # char tokenizer: one token per character
    s = Sample(prompt=({"role": "user", "content": "q"},), ground_truth="7", data_source="arith")
    req = PrefixRequest(s, prompt, resp, lens, "7", complete=True)
    answered = lens.index(len("the answer is 7. "))
    assert is_whole(req, lens[answered], tok)  # worth the response's reward (1.0)
    policy = AnswerPath(tok, len(prompt), honor_stop)
    cfg = ProcessConfig(mc_max_new_tokens=64)
    want = greedy_continuation(ValueContext(policy.module, tok, [req], cfg, ends_ok))
    got = greedy_bisect(ValueContext(policy.module, tok, [req], cfg, ends_ok))
    assert want[0][answered] == 1.0 and want[0][0] == 0.0  # verdicts change once
    assert got == want, (got, want)
