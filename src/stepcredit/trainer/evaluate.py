"""Evaluation of a model on a prompt set: pass@1, pass@k and maj@k per tag, with truncation counted.

Generation is validation's (:func:`stepcredit.trainer.validate.generate_in_chunks`: same prompt
building, same greedy/sampling settings, same chunks), and scoring is the reward layer's
(:meth:`Rewarder.score_batch`; a response is correct as in validation: scored and full marks). A
response that hit the token limit is not scored by default: its last number is taken from
mid-reasoning, so it gets the status ``truncated`` and counts as wrong (``score_truncated=True``
scores it anyway). With no truncated response, greedy pass@1 on ``arith`` equals the trainer's
``val/accuracy`` for the same model.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepcredit.reward import Rewarder
from stepcredit.rollout.tool_context import CountingRunner, ToolContext
from stepcredit.trainer.validate import generate_in_chunks, is_correct
from stepcredit.types import RewardResult, Sample

TRUNCATED = "truncated"
"""The status of a response that hit the token limit and was not scored."""


# ------------------------------------------------------------------------------------- metrics
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code", eq. 1): ``1 - C(n-c, k) / C(n, k)``, computed as the
    product ``prod_{i=n-c+1}^{n} (1 - k/i)`` so that large ``n`` does not overflow (their Fig. 3)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """maj@k of one prompt: the most frequent extracted answer (ties: the one seen first) is right.

    Samples with no extracted answer do not vote; with no votes at all the prompt counts as wrong.
    The voted answer is right when the samples that gave it were scored correct (the verifier, not
    string equality with the ground truth, decides, as for pass@k)."""
    votes: Counter[str] = Counter()
    first: dict[str, int] = {}
    for i, a in enumerate(answers):
        if a is None or not a.strip():
            continue
        key = a.strip()
        votes[key] += 1
        first.setdefault(key, i)
    if not votes:
        return False
    best = max(votes, key=lambda a: (votes[a], -first[a]))
    return any(c for a, c in zip(answers, correct, strict=True) if a is not None and a.strip() == best)


def ks_of(n: int) -> list[int]:
    """The k of pass@k reported for ``n`` samples: 1, powers of two below n, and n."""
    ks = {1, n}
    k = 2
    while k < n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def summarize(
    tags: Sequence[str],
    answers: Sequence[Sequence[str | None]],
    correct: Sequence[Sequence[bool]],
    n: int,
    truncated: Sequence[Sequence[bool]] | None = None,
) -> dict[str, dict[str, float]]:
    """Per tag (and ``all``): prompts, pass@k for :func:`ks_of`, maj@n (n > 1) and, with ``truncated``,
    the share of responses that hit the token limit."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(tags):
        groups[t].append(i)
    if len(groups) > 1:
        groups = {"all": list(range(len(tags))), **dict(sorted(groups.items()))}
    out: dict[str, dict[str, float]] = {}
    for tag, idx in groups.items():
        row: dict[str, float] = {"prompts": float(len(idx))}
        for k in ks_of(n):
            row[f"pass@{k}"] = sum(pass_at_k(n, sum(correct[i]), k) for i in idx) / len(idx)
        if n > 1:
            row[f"maj@{n}"] = sum(majority_correct(answers[i], correct[i]) for i in idx) / len(idx)
        if truncated is not None:
            row[TRUNCATED] = sum(sum(truncated[i]) for i in idx) / (len(idx) * n)
        out[tag] = row
    return out


# -------------------------------------------------------------------------------------- report
@dataclass(frozen=True)
class EvalReport:
    """What :func:`evaluate` measured."""

    prompts: int
    """Prompts evaluated."""
    n: int
    """Samples per prompt (the k of pass@k and maj@k)."""
    temperature: float
    """Sampling temperature (0 = greedy)."""
    max_new_tokens: int
    """The token limit of each response."""
    table: dict[str, dict[str, float]]
    """Per tag (and ``all`` when there are several): ``prompts``, ``pass@k``, ``maj@n`` (n > 1) and
    ``truncated`` (the share of responses that hit the token limit), as :func:`summarize`."""
    status: dict[str, int]
    """How many responses got each status (``ok``, ``unparseable``, ..., ``truncated``)."""
    truncated: int
    """Responses that hit the token limit (scored only with ``score_truncated``)."""
    score_truncated: bool
    """Truncated responses were scored like the others (else: status ``truncated``, counted wrong)."""
    samples_per_s: float
    """Responses generated and scored per second."""
    tokens_per_s: float
    """Response tokens generated per second."""
    time_s: float
    """Seconds spent generating and scoring."""
    tools: dict[str, float] = field(default_factory=dict)
    """With tools (``rollout.mode=tools``): calls and failed calls per response, failures by kind
    (:meth:`~stepcredit.rollout.tool_context.CountingRunner.counters`); empty without."""
    extra: dict[str, Any] = field(default_factory=dict)
    """What the caller adds to the JSON summary (model, data, output file, load time)."""

    @property
    def overall(self) -> dict[str, float]:
        """The first row of :attr:`table` (``all``, or the only tag)."""
        return self.table[next(iter(self.table))]

    def to_dict(self) -> dict[str, Any]:
        """The JSON summary: the overall figures at the top level, ``by_tag`` when there are tags."""
        return {
            **self.extra,
            "prompts": self.prompts,
            "n": self.n,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            **{k: v for k, v in self.overall.items() if k not in ("prompts", TRUNCATED)},
            "truncated": self.truncated,
            "truncated_frac": self.truncated / max(1, self.prompts * self.n),
            "score_truncated": self.score_truncated,
            "by_tag": self.table if len(self.table) > 1 else {},
            "status": self.status,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "time_s": self.time_s,
            **({"tools": self.tools} if self.tools else {}),
        }


RowsFn = Callable[[list[dict[str, Any]]], None]
"""Receives the sample rows of each chunk as it is scored (e.g. to write them to a JSONL file)."""


def _score(
    rewarder: Rewarder, samples: list[Sample], texts: list[str], truncated: list[bool], score_truncated: bool
) -> list[RewardResult | None]:
    """The rewards of the responses to score; None for a truncated one that is not scored."""
    todo = [i for i, t in enumerate(truncated) if score_truncated or not t]
    got = rewarder.score_batch([samples[i] for i in todo], [texts[i] for i in todo]) if todo else []
    out: list[RewardResult | None] = [None] * len(texts)
    for i, r in zip(todo, got, strict=True):
        out[i] = r
    return out


def _row(
    s: Sample, index: int, m: int, text: str, r: RewardResult | None, tokens: int, cut: bool
) -> dict[str, Any]:
    return {
        "index": index,
        "sample": m,
        "uid": s.uid,
        "tag": s.tag,
        "data_source": s.data_source,
        "prompt": s.prompt[-1]["content"],
        "response": text,
        "ground_truth": s.ground_truth,
        "extracted": None if r is None else r.extracted,
        "score": None if r is None or math.isnan(r.score) else r.score,
        "status": TRUNCATED if r is None else r.status.value,
        "correct": r is not None and is_correct(r),
        "tokens": tokens,
        "truncated": cut,
    }


def evaluate(
    model: Any,
    tok: Any,
    samples: list[Sample],
    rewarder: Rewarder,
    *,
    n: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int,
    batch_size: int = 64,
    seed: int = 0,
    score_truncated: bool = False,
    on_rows: RowsFn | None = None,
    tools: ToolContext | None = None,
) -> EvalReport:
    """Generate ``n`` responses per prompt (``batch_size`` responses per call), score them and summarise.
    With ``tools`` the responses call them (validation's tool rollout; calls run through its runner)
    and the report counts the calls.

    ``on_rows`` gets each chunk's sample rows (index, sample, response, extracted, score, status,
    correct, tokens, truncated) as soon as they are scored."""
    import torch

    if n < 1 or batch_size < 1 or max_new_tokens < 1 or not samples:
        raise ValueError("evaluate needs n, batch_size, max_new_tokens >= 1 and at least one prompt")
    torch.manual_seed(seed)
    answers: list[list[str | None]] = []
    correct: list[list[bool]] = []
    cut: list[list[bool]] = []
    status: Counter[str] = Counter()
    n_tokens = 0
    t0 = time.perf_counter()
    counted = None
    if tools is not None:
        counted = CountingRunner(tools.runner)
        tools = tools.with_runner(counted)
    # validation generates 64 prompts per call at n=1: the same chunks keep greedy answers identical
    chunks = generate_in_chunks(
        model, tok, samples, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
        chunk=max(1, batch_size // n), tools=tools,
    )  # fmt: skip
    for start, part, b in chunks:
        lengths = [int(x) for x in b.response_mask_BT.sum(1).tolist()]
        truncated = [bool(x) for x in b.truncated_B.tolist()]
        results = _score(rewarder, b.samples, b.texts, truncated, score_truncated)
        n_tokens += sum(lengths)
        rows = []
        for j, s in enumerate(part):
            at = range(j * n, (j + 1) * n)
            rows += [
                _row(s, start + j, m, b.texts[i], results[i], lengths[i], truncated[i])
                for m, i in enumerate(at)
            ]
            answers.append([r["extracted"] for r in rows[-n:]])
            correct.append([r["correct"] for r in rows[-n:]])
            cut.append([r["truncated"] for r in rows[-n:]])
        status.update(r["status"] for r in rows)
        if on_rows is not None:
            on_rows(rows)
    elapsed = time.perf_counter() - t0
    return EvalReport(
        prompts=len(samples),
        n=n,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        table=summarize([s.tag for s in samples], answers, correct, n, cut),
        status=dict(status),
        truncated=sum(map(sum, cut)),
        score_truncated=score_truncated,
        samples_per_s=len(samples) * n / elapsed,
        tokens_per_s=n_tokens / elapsed,
        time_s=elapsed,
        tools={} if counted is None else counted.counters(len(samples) * n),
    )
