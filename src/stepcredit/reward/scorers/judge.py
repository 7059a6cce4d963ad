"""An LLM judge behind any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, SGLang, OpenAI...).

Each response becomes one chat request built from a prompt template; the judge's reply is turned into a
score by a regex (the last match wins) divided by ``max_score``. The client is asynchronous (httpx)
with at most ``concurrency`` requests in flight, and every request is retried on 429, 5xx, timeouts,
connection errors, malformed JSON and replies without a score, with exponential backoff and full
jitter (``uniform(0, min(backoff_max_s, backoff_s * 2**k))``, the AWS "full jitter" scheme; a
``Retry-After`` header raises the wait up to ``backoff_max_s``). A request never outlives its
``deadline_s``. Failures are typed and never raised: ``error`` after the last retry (or at once on a
non-retryable 4xx), ``timeout`` when the deadline passed or every attempt timed out; both have a NaN
score. Results come back in the order of the requests, each tagged with its index.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stepcredit.config import JudgeConfig
from stepcredit.types import RewardResult, Sample, Status

DEFAULT_TEMPLATE = """You are grading an answer to a question.

Question:
{question}

Reference answer:
{ground_truth}

Answer to grade:
{response}

Judge whether the answer is correct and complete. Reply with one short sentence of justification,
then a final line of the form "Score: N" where N is an integer from 0 (wrong) to 10 (fully correct)."""


@dataclass(frozen=True)
class JudgeRequest:
    """One thing to judge: the question (prompt), the policy's response and the reference answer."""

    question: str
    response: str
    ground_truth: str = ""


def parse_score(text: str, *, pattern: str, max_score: float) -> float | None:
    """The last match of ``pattern`` (its first group) divided by ``max_score``; None if absent or out of range."""
    matches = re.findall(pattern, text)
    if not matches:
        return None
    raw = matches[-1]
    raw = raw[0] if isinstance(raw, tuple) else raw
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or not 0.0 <= value <= max_score:
        return None
    return value / max_score


class _Retry(Exception):
    """An attempt failed in a way worth retrying."""

    def __init__(self, message: str, *, timeout: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.retry_after = retry_after


class Judge:
    """An OpenAI-compatible judge client; ``judge``/``ajudge`` return one result per request, in order."""

    def __init__(
        self,
        cfg: JudgeConfig | None = None,
        *,
        transport: Any = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        seed: int | None = None,
    ) -> None:
        self.cfg = cfg or JudgeConfig()
        self._transport = transport
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._url = self.cfg.base_url.rstrip("/") + "/chat/completions"

    # --------------------------------------------------------------------------------- requests
    def messages(self, req: JudgeRequest) -> list[dict[str, str]]:
        template = self.cfg.prompt_template or DEFAULT_TEMPLATE
        fields = {"question": req.question, "response": req.response, "ground_truth": req.ground_truth}
        # format_map with str.replace semantics would break on braces inside responses; only our three
        # fields are substituted.
        user = template
        for k, v in fields.items():
            user = user.replace("{" + k + "}", v)
        msgs = [{"role": "system", "content": self.cfg.system_prompt}] if self.cfg.system_prompt else []
        return [*msgs, {"role": "user", "content": user}]

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.cfg.api_key_env, "") if self.cfg.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    # ------------------------------------------------------------------------------------ async
    async def ajudge(self, requests: Sequence[JudgeRequest]) -> list[RewardResult]:
        """Judge all requests concurrently (at most ``cfg.concurrency`` in flight)."""
        import httpx

        sem = asyncio.Semaphore(self.cfg.concurrency)
        limits = httpx.Limits(
            max_connections=self.cfg.concurrency, max_keepalive_connections=self.cfg.concurrency
        )
        async with httpx.AsyncClient(
            transport=self._transport, limits=limits, headers=self._headers()
        ) as client:
            return list(await asyncio.gather(*(self._one(client, sem, i, r) for i, r in enumerate(requests))))

    async def _one(self, client: Any, sem: asyncio.Semaphore, index: int, req: JudgeRequest) -> RewardResult:
        t0 = time.monotonic()
        try:
            res = await self._attempts(client, sem, req, t0)
        except Exception as e:  # never crash a training run over one judged sample
            res = RewardResult.failure(Status.ERROR, f"judge client failed: {type(e).__name__}: {e}")
        res.latency_s = time.monotonic() - t0
        res.source = res.source or "judge"
        res.info["index"] = index
        return res

    async def _attempts(
        self, client: Any, sem: asyncio.Semaphore, req: JudgeRequest, t0: float
    ) -> RewardResult:
        cfg = self.cfg
        deadline = t0 + cfg.deadline_s
        body = {
            "model": cfg.model,
            "messages": self.messages(req),
            "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens,
        }
        errors: list[str] = []
        all_timeouts = True
        for attempt in range(cfg.max_retries + 1):
            retry_after: float | None = None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                async with sem:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    reply = await asyncio.wait_for(self._post(client, body, remaining), timeout=remaining)
                score = parse_score(reply, pattern=cfg.score_pattern, max_score=cfg.max_score)
                if score is None:
                    raise _Retry(f"no score in the judge's reply: {reply[-200:]!r}")
                return RewardResult(
                    score=score,
                    status=Status.OK,
                    extracted=reply,
                    info={"attempts": attempt + 1},
                    source="judge",
                )
            except _Retry as e:
                errors.append(str(e))
                all_timeouts = all_timeouts and e.timeout
                retry_after = e.retry_after
            except asyncio.TimeoutError:
                errors.append("deadline reached during the request")
                break
            except _Fatal as e:
                return RewardResult.failure(Status.ERROR, str(e), attempts=attempt + 1)
            if attempt == cfg.max_retries:
                break
            wait = self._rng.uniform(0.0, min(cfg.backoff_max_s, cfg.backoff_s * 2**attempt))
            if retry_after is not None:
                wait = max(wait, min(retry_after, cfg.backoff_max_s))
            wait = min(wait, max(0.0, deadline - time.monotonic()))
            await self._sleep(wait)
        n = len(errors)
        last = errors[-1] if errors else "no attempt made"
        if time.monotonic() >= deadline or (errors and all_timeouts):
            return RewardResult.failure(
                Status.TIMEOUT,
                f"judge gave no answer within {cfg.deadline_s:g}s ({n} attempts): {last}",
                attempts=n,
            )
        return RewardResult.failure(Status.ERROR, f"judge failed after {n} attempts: {last}", attempts=n)

    async def _post(self, client: Any, body: dict[str, Any], remaining: float) -> str:
        import httpx

        timeout = min(self.cfg.request_timeout_s, remaining)
        try:
            resp = await client.post(self._url, json=body, timeout=timeout)
        except httpx.TimeoutException as e:
            raise _Retry(f"request timed out ({type(e).__name__})", timeout=True) from None
        except httpx.TransportError as e:
            raise _Retry(f"connection failed: {type(e).__name__}: {e}") from None
        code = resp.status_code
        if code == 429 or code >= 500:
            raise _Retry(f"HTTP {code}", retry_after=_retry_after(resp.headers.get("retry-after")))
        if code >= 400:
            raise _Fatal(f"HTTP {code} from the judge (not retried): {resp.text[:300]}")
        try:
            data = resp.json()
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Retry(f"malformed reply: {resp.text[:200]!r}") from None
        if not isinstance(content, str):
            raise _Retry(f"malformed reply: content is {type(content).__name__}")
        return content

    # ------------------------------------------------------------------------------------- sync
    def judge(self, requests: Sequence[JudgeRequest]) -> list[RewardResult]:
        """Blocking form of :meth:`ajudge`; safe to call from inside a running event loop (uses a thread)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.ajudge(requests))
        out: list[list[RewardResult]] = []
        err: list[BaseException] = []

        def target() -> None:
            try:
                out.append(asyncio.run(self.ajudge(requests)))
            except BaseException as e:  # pragma: no cover - re-raised below
                err.append(e)

        t = threading.Thread(target=target, name="stepcredit-judge")
        t.start()
        t.join()
        if err:
            raise err[0]
        return out[0]


class _Fatal(Exception):
    """An attempt failed in a way retrying will not fix (a 4xx other than 429)."""


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def question_of(sample: Sample) -> str:
    """The last user message of a sample's prompt (what the judge is told was asked)."""
    users = [m.get("content", "") for m in sample.prompt if m.get("role") == "user"]
    return users[-1] if users else (sample.prompt[-1].get("content", "") if sample.prompt else "")


def judge_samples(
    samples: list[Sample], responses: list[str], cfg: JudgeConfig | None = None
) -> list[RewardResult]:
    """Batch form for the rewarder: ``(samples, responses) -> results``."""
    reqs = [
        JudgeRequest(question_of(s), r, "" if s.ground_truth is None else str(s.ground_truth))
        for s, r in zip(samples, responses, strict=True)
    ]
    return Judge(cfg).judge(reqs)


class JudgeScorer:
    """The rewarder's scorer for rows with data_source ``judge`` (or a row style ``judge``)."""

    def __init__(self, cfg: JudgeConfig) -> None:
        self.cfg = cfg

    def score_batch(self, samples: list[Sample], responses: list[str]) -> list[RewardResult]:
        try:
            return judge_samples(samples, responses, self.cfg)
        except Exception as e:
            return [
                RewardResult.failure(Status.ERROR, f"judge: {type(e).__name__}: {e}", source="judge")
            ] * len(samples)


def _register() -> None:
    from stepcredit.reward.base import register_scorer

    @register_scorer("judge", "llm_judge")
    def make_judge_scorer(cfg: Any) -> JudgeScorer:
        return JudgeScorer(cfg.judge)


_register()
