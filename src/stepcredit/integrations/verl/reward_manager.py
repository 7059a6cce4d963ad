"""The ``stepcredit`` reward manager of verl's reward loop (``reward.reward_manager.name=stepcredit``).

Each response is scored by stepcredit's :class:`~stepcredit.reward.Rewarder`: routing by
``data_source`` (verl's names work: ``openai/gsm8k``, ``lighteval/MATH``, code sources, ...), the
user's ``reward.custom_reward_function`` (loaded by path, so it runs in the kill-safe pool with a
hard deadline: a hang is killed, a raise is status ``error``, never a crashed reward worker), and the
failure policy of ``stepcredit.reward``. It gives the same scores and statuses as
``stepcredit score`` on the same rows.

verl's reward loop carries one float per response, so a result that could not be scored becomes the
failure policy's score for one response (``mask`` and ``drop_group``: 0, ``score``:
``failure_score``) and the typed result travels in ``reward_extra_info`` with the same keys for every
response (verl requires that): :data:`EXTRA_KEYS`. The ``stepcredit_sync`` trainer reads them back
and masks failed responses out of the loss and the baselines as stepcredit's own trainer does.
"""

from __future__ import annotations

import atexit
import dataclasses
import math
from typing import Any

from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from stepcredit.config import RewardConfig, RewardCustomConfig
from stepcredit.errors import ConfigError
from stepcredit.integrations.verl.config import get, stepcredit_config, to_plain
from stepcredit.types import RewardResult, Sample, Status

EXTRA_KEYS = ("acc", "ok", "status", "extracted", "source")
"""``reward_extra_info`` keys of every response: ``acc`` the reward used (float), ``ok`` 1.0 when it
is a real verdict (else the failure policy made it up), ``status`` (``ok``, ``unparseable``,
``timeout``, ``error``, ``sandbox_error``), ``extracted`` the answer found ("" if none), ``source``
the reward function that scored it."""


def reward_config(verl_config: Any) -> RewardConfig:
    """``stepcredit.reward`` of the verl config, with verl's ``reward.custom_reward_function`` as the
    custom function (its ``reward_kwargs`` as keyword arguments)."""
    cfg = stepcredit_config(verl_config).reward
    custom = get(get(verl_config, "reward"), "custom_reward_function")
    path = get(custom, "path")
    if not path:
        return cfg
    spec = f"{path}:{get(custom, 'name') or 'compute_score'}"
    if cfg.custom.path and cfg.custom.path != spec:
        raise ConfigError(
            f"verl config: reward.custom_reward_function ({spec}) and stepcredit.reward.custom.path "
            f"({cfg.custom.path}) disagree; set one"
        )
    kwargs = to_plain(get(custom, "reward_kwargs")) or {}
    return dataclasses.replace(
        cfg, custom=RewardCustomConfig(path=spec, kwargs={**kwargs, **cfg.custom.kwargs}, isolate=True)
    )


def sample_of(non_tensor: dict[str, Any], where: str = "") -> Sample:
    """A Sample from one verl row (``data_source``, ``reward_model``, ``extra_info``), built as
    ``stepcredit score`` builds it; ``extra_info.domain``/``tag`` feed ``reward.domains`` routing."""
    rm = to_plain(non_tensor.get("reward_model")) or {}
    extra = dict(to_plain(non_tensor.get("extra_info")) or {})
    return Sample(
        prompt=(),
        ground_truth=rm.get("ground_truth"),
        data_source=str(non_tensor.get("data_source", "")),
        ability=str(non_tensor.get("ability") or "math"),
        style=str(rm.get("style", "rule") or "rule"),
        extra_info=extra,
        domain=str(extra.get("domain", "default")),
        tag=str(extra.get("tag", "default")),
        uid=where,
    )


def reward_output(res: RewardResult, cfg: RewardConfig) -> dict[str, Any]:
    """verl's ``{"reward_score", "reward_extra_info"}`` for one typed result under the failure policy."""
    from stepcredit.reward import apply_failure_policy

    score_B, _, _ = apply_failure_policy([res], [0], cfg)
    score = float(score_B[0])
    return {
        "reward_score": score,
        "reward_extra_info": {
            "acc": score,
            "ok": 1.0 if res.ok else 0.0,
            "status": res.status.value,
            "extracted": res.extracted or "",
            "source": res.source,
        },
    }


def result_of(extra: dict[str, Any], reward_score: float) -> RewardResult:
    """The typed result back from a response's ``reward_extra_info`` (inverse of :func:`reward_output`
    for what the failure policy reads)."""
    ok = float(extra.get("ok", 1.0)) > 0.5
    return RewardResult(
        score=float(reward_score) if ok else math.nan,
        status=Status(str(extra.get("status", "ok"))),
        extracted=str(extra.get("extracted", "")) or None,
        source=str(extra.get("source", "")),
        verdict=ok,
    )


NAME = "stepcredit"


@register(NAME)
class StepCreditRewardManager(RewardManagerBase):  # type: ignore[misc]
    """stepcredit's verifiers, routing, custom functions and kill-safe execution in verl's reward loop."""

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        compute_score: Any = None,
        reward_router_address: Any = None,
        reward_model_tokenizer: Any = None,
        **_: Any,
    ) -> None:
        super().__init__(config, tokenizer, compute_score)
        from stepcredit.reward import build_rewarder

        self.reward_cfg = reward_config(config)
        # verl's compute_score is ignored: the custom function is loaded again by path, so that it
        # runs in the kill-safe pool (a function object running in this process cannot be stopped).
        self.rewarder = build_rewarder(self.reward_cfg)
        atexit.register(self.rewarder.close)

    async def run_single(self, data: Any) -> dict[str, Any]:
        item = data[-1]  # multi-turn outputs: the last sequence carries the reward (as verl's managers)
        response_ids = item.batch["responses"]
        n = response_ids.shape[-1]
        valid_len = int(item.batch["attention_mask"][-n:].sum())
        tokenizer: Any = self.tokenizer
        text = tokenizer.decode(response_ids[:valid_len], skip_special_tokens=True)
        row = dict(item.non_tensor_batch)
        sample = sample_of(row, where=str(row.get("uid", "")))
        try:
            (res,) = await self.rewarder.ascore_batch([sample], [text])
        except Exception as e:  # the rewarder types every failure itself; this is the last guard
            res = RewardResult.failure(Status.ERROR, f"{type(e).__name__}: {e}")
        return reward_output(res, self.reward_cfg)
