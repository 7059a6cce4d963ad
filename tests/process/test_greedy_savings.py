"""Greedy continuations that cost less and estimate the same: shared along the greedy path, stopped at
the task's answer marker, skipped where the answer is written, continued from the rollout's cache.
Every value is checked against the plain loop (each prefix continued on its own, to eos)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from stepcredit.config import ProcessConfig
from stepcredit.data import ANSWER_ENDS
from stepcredit.models.logprobs import token_logprobs
from stepcredit.process.continuation import continuation_values
from stepcredit.process.values import PrefixRequest, ValueContext, score_each, spending
from stepcredit.rollout import engines
from stepcredit.rollout.engines import Completion, SamplingSpec
from stepcredit.rollout.engines.api import left_pad
from stepcredit.types import RolloutCache, Sample

EOS, PAD = 99, 0
PROMPT = [1, 2]
PATH = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, EOS]
"""The scripted policy's greedy continuation of the bare prompt."""
OFF = [40, 41, EOS]
"""Its greedy continuation of any prefix that left the path."""


class GreedyPath(torch.nn.Module):
    """A deterministic policy bound as its own engine: the greedy continuation of prompt + prefix is the
    rest of ``PATH`` when the prefix is on it, else ``OFF``. ``calls``: the contexts of each call."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.calls: list[int] = []
        self.specs: list[SamplingSpec] = []
        engines.bind(self, self)  # type: ignore[arg-type]

    def sample(self, model: Any, tok: Any, contexts: Sequence[Sequence[int]], spec: Any, **_: Any) -> list:
        self.calls.append(len(contexts))
        self.specs.append(spec)
        out = []
        for c in contexts:
            head = list(c[len(PROMPT) :])
            out.append(Completion(PATH[len(head) :] if PATH[: len(head)] == head else list(OFF)))
        return out


class Tok:
    pad_token_id, eos_token_id = PAD, EOS

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids if not skip_special_tokens or i not in (PAD, EOS))


def score_one(sample: Sample, text: str) -> float:
    # "right" when the text reaches 15 and never left the path (no 40): a verdict of the whole text
    return float("15" in text.split() and "40" not in text.split())


def plain_loop(model: GreedyPath, requests: list[PrefixRequest]) -> tuple[list[list[float]], int]:
    """The reference: every prefix of every request continued on its own (the last one of a complete
    response is its own reward), scored; and the tokens that took."""
    values, tokens = [], 0
    for r in requests:
        row = []
        for i, n in enumerate(r.prefix_lens):
            if r.complete and i == len(r.prefix_lens) - 1:
                row.append(score_one(r.sample, Tok().decode(r.response_ids)))
                continue
            (cont,) = model.sample(model, Tok(), [r.prompt_ids + r.response_ids[:n]], SamplingSpec(n=1))
            tokens += len(cont.ids)
            row.append(score_one(r.sample, Tok().decode(r.response_ids[:n] + cont.ids)))
        values.append(row)
    return values, tokens


def _values(requests: list[PrefixRequest], **cfg: Any) -> tuple[list[list[float]], int, GreedyPath]:
    model = GreedyPath()
    c = ProcessConfig(mc_max_new_tokens=16, mc_prefixes=0, **cfg)
    with spending() as spent:
        got = continuation_values(
            ValueContext(model, Tok(), requests, c, score_each(score_one)),
            samples=1,
            greedy=True,
            temperature=1.0,
        )
    return got, spent.generated_tokens, model


def test_prefixes_on_the_greedy_path_share_one_continuation() -> None:
    s = Sample(prompt=({"role": "user", "content": "q"},), ground_truth="1", data_source="none")
    sure = [0.0] * 8  # log-probs: every token had probability 1, so it was the greedy choice
    # a: on the greedy path, cut off after 8 tokens (prefixes 0, 2, 5 and the whole 8); b: leaves the
    # path at its 3rd token (prefix 4 is off it); c: on the path but with log-probs that do not say so
    a = PrefixRequest(s, PROMPT, PATH[:8], [0, 2, 5, 8], "1", logp=sure)
    b = PrefixRequest(s, PROMPT, [10, 11, 30, 31, 32], [0, 2, 4], "1", logp=sure[:5])
    c = PrefixRequest(s, PROMPT, PATH[:6], [0, 3, 6], "1", logp=[-2.0] * 6)
    got, tokens, model = _values([a, b, c])
    want, plain_tokens = plain_loop(GreedyPath(), [a, b, c])
    assert got == want == [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    # generated: the bare prompt's continuation (11 tokens, shared by a's four prefixes, b's first two
    # and c's first), c's prefixes 3 and 6 (8 and 5 tokens: their log-probs planned no share) in the
    # first call; b's prefix 4, planned as a share but off the path, in a second call (3 tokens)
    assert model.calls == [3, 1] and tokens == 11 + 8 + 5 + 3
    # the plain loop: 11 + 9 + 6 + 3 for a, 11 + 9 + 3 for b, 11 + 8 + 5 for c
    assert plain_tokens == 29 + 23 + 24


class CappedPath(GreedyPath):
    """The same policy with continuations cut at ``len(PATH) - 1`` tokens, before the eos."""

    def sample(self, model: Any, tok: Any, contexts: Sequence[Sequence[int]], spec: Any, **_: Any) -> list:
        return [Completion(c.ids[: len(PATH) - 1]) for c in super().sample(model, tok, contexts, spec)]


@pytest.mark.parametrize("policy", [GreedyPath, CappedPath])
def test_a_share_needs_the_root_continuation_to_have_ended_by_itself(policy: type[GreedyPath]) -> None:
    # A continuation cut at the length cap says nothing about where the later prefix's would end (it may
    # run further): the later prefix is then continued itself, in a second call.
    s = Sample(prompt=({"role": "user", "content": "q"},), ground_truth="1", data_source="none")
    a = PrefixRequest(s, PROMPT, PATH[:8], [0, 4], "1", logp=[0.0] * 8)
    model = policy()
    cfg = ProcessConfig(mc_max_new_tokens=len(PATH) - 1, mc_prefixes=0)
    ctx = ValueContext(model, Tok(), [a], cfg, score_each(score_one))
    assert continuation_values(ctx, samples=1, greedy=True, temperature=1.0) == [[1.0, 1.0]]
    assert model.calls == ([1] if policy is GreedyPath else [1, 1])


@pytest.mark.parametrize(
    ("source", "step", "answer", "after"),
    [
        ("arith", "So 3 + 4 = 7. ", "The answer is 7.", " So 7 + 0 = 7."),
        ("openai/gsm8k", "3 + 4 = 7.\n", "#### 7\n", "Check: 7 - 4 = 3."),
        ("HuggingFaceH4/MATH-500", "3 + 4 = 7, so ", "\\boxed{7}", " is the answer."),
    ],
)
def test_the_answer_marker_stops_continuations_and_values_answered_prefixes(
    source: str, step: str, answer: str, after: str
) -> None:
    # the task's marker (arith's "answer is N.", GSM8K's "#### N", MATH's boxed answer) reaches the
    # engine as the stop pattern; a prefix that already holds it is worth the response's reward, with
    # nothing generated for it
    from stepcredit.models import build_tokenizer

    tok = build_tokenizer()
    ids = tok(step + answer + after)["input_ids"]
    cut = len(tok(step)["input_ids"])
    answered = len(tok(step + answer)["input_ids"])
    s = Sample(prompt=({"role": "user", "content": "q"},), ground_truth="7", data_source=source)
    req = PrefixRequest(s, tok("q")["input_ids"], ids, [0, cut, answered], "7")
    calls: list[tuple[int, str]] = []

    class Policy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            engines.bind(self, self)  # type: ignore[arg-type]

        def sample(self, model: Any, t: Any, contexts: Any, spec: Any, **_: Any) -> list:
            calls.append((len(contexts), spec.stop_pattern))
            return [Completion(tok(answer)["input_ids"]) for _ in contexts]

    scored: list[str] = []

    def verifier(samples: Any, texts: Any) -> list[float]:
        scored.extend(texts)
        return [float(answer in x) for x in texts]

    ctx = ValueContext(Policy(), tok, [req], ProcessConfig(mc_prefixes=0), verifier)
    assert continuation_values(ctx, samples=1, greedy=True, temperature=1.0) == [[1.0, 1.0, 1.0]]
    # V_0 and V_1 continued in one call that stops at the marker; V_2 (answer written) is the whole reward
    assert calls == [(2, ANSWER_ENDS.get(source))]
    assert tok.decode(ids, skip_special_tokens=True) in scored and len(scored) == 3


@pytest.mark.parametrize("case", ["text", "greedy_path", "marker"])
def test_continuing_the_rollout_cache_values_as_the_plain_loop(
    model_factory: Callable[..., tuple[Any, Any]], case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real (random) model, continued from the rollout's cache, shares planned from its own log-probs:
    # the values of every prefix continued on its own (prefilled, to eos or the cap), never more tokens.
    # ``greedy_path``: the responses are its greedy continuations, so every planned share is on the path
    # (but its continuations run to the cap: no share holds); ``marker``: the same with a task marker
    # ("$$$$", which it writes) that stops continuations, so shares hold and tokens are saved.
    model, tok = model_factory("llama", "sdpa")
    monkeypatch.setattr(ANSWER_ENDS, "_items", dict(ANSWER_ENDS._items))  # forgotten after the test
    ANSWER_ENDS.add("dollars", r"\$\$\$\$")
    prompts = [tok("q: 3 + 4?")["input_ids"], tok("q: 12 - 5 + 1?")["input_ids"]]
    engine = engines.engine_for(model)
    if case == "text":
        responses = [tok(x)["input_ids"] for x in ("So 3 + 4 = 7. So done.", "So 12 - 5 = 7. So 7 + 1 = 8.")]
    else:
        responses = [
            c.ids for c in engine.sample(model, tok, prompts, SamplingSpec(temperature=0.0, max_tokens=20))
        ]
    p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
    r_ids, r_mask = left_pad([r[::-1] for r in responses], tok.pad_token_id)
    r_ids, r_mask = r_ids.flip(1), r_mask.flip(1)  # right-padded responses
    caches: list[Any] = []
    ids, mask = torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1).long()
    logp, _ = token_logprobs(model, ids, mask, n_response=r_ids.shape[1], cache_out=caches)
    body = RolloutCache(caches[0], (p_ids.shape[1] - p_mask.sum(1)).tolist(), ids.shape[1])
    source = "dollars" if case == "marker" else "none"
    s = Sample(prompt=({"role": "user", "content": "q"},), ground_truth="7", data_source=source)
    reqs = [
        PrefixRequest(s, p, r, sorted({0, 3, 7, len(r)}), "7", logp=logp[b, : len(r)].tolist())
        for b, (p, r) in enumerate(zip(prompts, responses, strict=True))
    ]

    def verifier(samples: Any, texts: Any) -> list[float]:
        # a verdict of the text up to the first marker (the contract a marker's task keeps)
        return [float(len(x.split("$$$$")[0]) % 3 == 0) for x in texts]

    cfg = ProcessConfig(mc_prefixes=0, mc_max_new_tokens=12)
    with spending() as spent:
        ctx = ValueContext(model, tok, reqs, cfg, verifier, body=body)
        got = continuation_values(ctx, samples=1, greedy=True, temperature=1.0)
    want, tokens = [], 0
    for r in reqs:
        contexts = [r.prompt_ids + r.response_ids[:n] for n in r.prefix_lens]
        conts = [
            c.ids for c in engine.sample(model, tok, contexts, SamplingSpec(temperature=0.0, max_tokens=12))
        ]
        tokens += sum(map(len, conts))
        heads = [r.response_ids[:n] for n in r.prefix_lens]
        want.append(
            verifier(
                None, [tok.decode(h + c, skip_special_tokens=True) for h, c in zip(heads, conts, strict=True)]
            )
        )
    assert got == want and 0 < spent.generated_tokens <= tokens
    if case == "marker":  # the second response writes "$$$$" by its 12th token: stops and shares save
        assert spent.generated_tokens < tokens
