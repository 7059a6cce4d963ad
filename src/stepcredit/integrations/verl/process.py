"""Dense process rewards on verl's tensors: value probes out, process channel in (pure, CPU-tested).

The ``stepcredit_sync`` trainer values prefixes with the actor through verl's own batched
``compute_log_prob``: every V(prefix) is one *probe*, a pseudo-sample whose "prompt" is
``prompt + response[:L] + force prompt`` and whose "response" is the gold answer, so the actor's
per-token log-probs of the probe's response are exactly the answer tokens that stepcredit's
``forced_answer_logprob`` scores (its ``naive`` strategy, which all strategies equal):

    V(prefix) = 1/|a| * sum_j log p(a_j | prompt + prefix + force + a_<j)

This module holds the two pure halves around that call: :func:`plan_probes` (episodes and probes,
by stepcredit's own :func:`~stepcredit.process.build_requests`) and :func:`values_from_logprobs`. The
values become U_i at episode ends on verl's right-padded [B, T] layout by the trainer's own
:func:`stepcredit.process.process_channel`; ``process.step_cost_as=outcome`` charges verl's outcome as
stepcredit's trainer charges its own (:func:`outcome_less_step_cost`). :func:`check_process_config` is
the start-up refusal of what verl's advantage stage cannot serve. None of it imports verl.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from stepcredit.config import Config, ProcessConfig
from stepcredit.errors import ConfigError
from stepcredit.ops import last_token_index
from stepcredit.process import VALUE_ESTIMATORS, build_requests, request_suffixes, step_cost_outcome_B
from stepcredit.types import Sample


@dataclass(frozen=True)
class ValueProbe:
    """One V(prefix) evaluation as a verl sample: score ``answer_ids`` after ``context_ids``."""

    row: int
    """The response (row of the batch) whose prefix this values."""
    index: int
    """i of V_i: 0 = empty response, then one per episode end."""
    context_ids: list[int]
    """prompt + response[:L] + force-prompt tokens (verl's ``prompts`` of the probe)."""
    answer_ids: list[int]
    """The gold answer's tokens (verl's ``responses`` of the probe; all of them are scored)."""


def plan_probes(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    answers: Sequence[str],
    tokenizer: Any,
    cfg: ProcessConfig,
) -> tuple[list[list[int]], list[ValueProbe]]:
    """Episode ends (token indices into each response) and the probes of every V_0..V_S.

    ``prompts``/``responses`` are token ids without padding, ``answers`` the gold answers as text.
    Episodes and prefix lengths come from :func:`stepcredit.process.build_requests`, so they are the
    ones stepcredit's own trainer uses.
    """
    # The response ids are every response token (not verl's loss mask): prefixes then include tool
    # output of multi-turn responses, and episode ends are positions in verl's response tensor.
    samples = [Sample(prompt=(), ground_truth=a, uid=f"row {b}") for b, a in enumerate(answers)]
    ends, requests = build_requests(samples, prompts, responses, tokenizer, cfg)
    suffixes = request_suffixes(
        tokenizer,
        requests,
        cfg.force_prompt,
        row=lambda b, _r: f"row {b}",
        key="stepcredit.process.force_prompt",
    )
    probes: list[ValueProbe] = []
    for b, (r, (suffix, n_answer)) in enumerate(zip(requests, suffixes, strict=True)):
        head, answer_ids = suffix[:-n_answer], suffix[-n_answer:]
        for i, n in enumerate(r.prefix_lens):
            probes.append(ValueProbe(b, i, [*r.prompt_ids, *r.response_ids[:n], *head], list(answer_ids)))
    return ends, probes


def values_from_logprobs(
    probes: Sequence[ValueProbe], answer_logp: Sequence[torch.Tensor], n_rows: int
) -> list[list[float]]:
    """[V_0, ..., V_S] per row: the mean log-prob of each probe's answer tokens, in probe order."""
    if len(answer_logp) != len(probes):
        raise ValueError(f"{len(answer_logp)} log-prob rows for {len(probes)} probes")
    out: list[list[float]] = [[] for _ in range(n_rows)]
    for p, lp in zip(probes, answer_logp, strict=True):
        if lp.numel() != len(p.answer_ids):
            raise ValueError(f"probe of row {p.row}: {lp.numel()} log-probs for {len(p.answer_ids)} tokens")
        if p.index != len(out[p.row]):
            raise ValueError(f"probes of row {p.row} out of order")
        out[p.row].append(float(lp.float().mean()))
    return out


def probe_batch_size(n: int, *, dp: int, micro_batch: int | None, dynamic: bool) -> int:
    """Rows to send for ``n`` probes: the smallest count >= n that verl's actor accepts.

    verl's dispatch splits a batch evenly over the ``dp`` ranks, and with a fixed micro-batch
    (``log_prob_use_dynamic_bsz=false``) each rank's share must be a multiple of
    ``log_prob_micro_batch_size_per_gpu`` (``prepare_micro_batches`` in verl/workers/engine/utils.py
    asserts it), so the padding unit is dp x micro-batch; with dynamic batch size micro-batches are
    cut by tokens and only dp counts. The extra rows repeat a real probe and are dropped afterwards.
    """
    if n <= 0:
        return 0
    unit = dp if dynamic or not micro_batch else dp * int(micro_batch)
    return -(-n // unit) * unit


def probe_cost(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], probes: Sequence[ValueProbe]
) -> dict[str, int]:
    """Token counts of the value probes next to the actor's own log-prob pass, and what a packed
    layout would process instead.

    ``sequence``: prompt + response tokens, what verl's ``compute_log_prob`` over the batch processes;
    ``response``: response tokens; ``probe``: what the probes process (each repeats its prompt and
    prefix: S + 1 sequences per response); ``packed``: one pass over prompt + response plus, per probe,
    its force prompt and answer attending to its prefix (stepcredit's ``packed`` strategy, one causal
    pass with a block mask). ``prompts``/``responses`` are the rows ``probes`` index.
    """
    head = {p.row: len(p.context_ids) - len(prompts[p.row]) for p in probes if p.index == 0}
    rows = sorted(head)
    sequence = sum(len(prompts[b]) + len(responses[b]) for b in rows)
    return {
        "sequence": sequence,
        "response": sum(len(responses[b]) for b in rows),
        "probe": sum(len(p.context_ids) + len(p.answer_ids) for p in probes),
        "packed": sequence + sum(head[p.row] + len(p.answer_ids) for p in probes),
    }


def outcome_less_step_cost(
    scores_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    episode_ends: Sequence[Sequence[int]],
    verdict_B: torch.Tensor,
    cfg: ProcessConfig,
) -> torch.Tensor:
    """verl's outcome channel (the score on each response's last token) less ``process.step_cost`` x
    episodes on the rows with a real verdict, as stepcredit's trainer charges its outcome
    (``process.step_cost_as=outcome``, :func:`stepcredit.process.step_cost_outcome_B`) before the
    estimator's group normalisation; a new tensor (``scores_BT`` itself when nothing is charged). A row
    whose reward failed is never charged: its score is the failure policy's, not an outcome."""
    cost_B = step_cost_outcome_B(episode_ends, cfg).to(scores_BT.device)
    cost_B = torch.where(verdict_B.to(scores_BT.device).bool(), cost_B, torch.zeros_like(cost_B))
    if not bool(cost_B.any()):
        return scores_BT
    out_BT = scores_BT.clone()
    last_B = last_token_index(response_mask_BT.bool())
    rows = torch.arange(out_BT.shape[0], device=out_BT.device)
    out_BT[rows, last_B] -= cost_B.to(out_BT.dtype)
    return out_BT


def _forward_only(estimator: str) -> bool:
    """Can verl's advantage stage compute it: forward passes of the actor only (no generation, no
    verifier, no tree rollout's or group's outcomes, no task-specific exact step values)?"""
    spec = VALUE_ESTIMATORS.get(estimator)
    return not (
        spec.generates
        or spec.needs_verifier
        or spec.from_outcomes
        or spec.from_group
        or spec.needs_step_values
    )


def check_process_config(sc: Config, est: str, algorithm: Any = None) -> None:
    """Start-up refusals of settings verl's advantage stage cannot serve, and stepcredit's own start-up
    checks of the process and estimator settings (one line, key named; ConfigError).

    ``sc``: stepcredit's config from verl's ``stepcredit`` subtree; ``est``: verl's
    ``algorithm.adv_estimator``; ``algorithm``: verl's ``algorithm`` config (its estimator settings are
    checked against the process settings as stepcredit's trainer checks them). Whether a critic runs is
    left to verl (``verl_advantages`` says so at the first step when an estimator needs values)."""
    from stepcredit import advantages, process
    from stepcredit.advantages import ESTIMATORS
    from stepcredit.integrations.verl.config import algorithm_config
    from stepcredit.integrations.verl.estimators import PREFIX

    p = sc.process
    if p.enabled and not est.startswith(PREFIX):
        raise ConfigError(
            f"verl config: stepcredit.process.enabled needs a stepcredit estimator "
            f"(algorithm.adv_estimator={PREFIX}grpo_process, ...), got {est!r}"
        )
    if p.enabled and p.treerl:
        # TreeRL's credit is read off a tree rollout's leaves; verl's rollout samples flat groups
        raise ConfigError(
            "verl config key stepcredit.process.treerl: TreeRL's credit needs tree rollouts "
            "(stepcredit's rollout.mode=tree), which verl does not make; set it to false"
        )
    if p.enabled and p.credit_groups != "all":
        # which groups are all equal is read off the verified outcomes, which verl's stage does not pass in
        raise ConfigError(
            f"verl config key stepcredit.process.credit_groups: {p.credit_groups} needs each group's verified "
            "outcomes when the step credit is placed, which verl's advantage stage does not have; set it to all"
        )
    # Inside verl only the actor's forward passes are at hand: no generation, no verifier.
    usable = [n for n in VALUE_ESTIMATORS.names() if _forward_only(n)]
    if p.enabled and p.value_estimator in VALUE_ESTIMATORS and not _forward_only(p.value_estimator):
        raise ConfigError(
            f"verl config key stepcredit.process.value_estimator: "
            f"{p.value_estimator} generates, needs the verifier, a tree rollout or exact step values, "
            f"which verl's advantage stage cannot give; use one of {', '.join(usable)}"
        )
    name = est[len(PREFIX) :]
    if p.enabled and name in ESTIMATORS and ESTIMATORS.get(name).needs_reward_values:
        raise ConfigError(
            f"verl config key algorithm.adv_estimator: {est} reads step rewards as changes of a value "
            "that ends at the reward (continuation values), which verl's advantage stage cannot compute"
        )
    if not p.enabled:
        return
    # the checks stepcredit's own trainer runs (unknown names, the credit form against the values, the
    # step cost's form against the estimator), with verl's estimator in stepcredit's place
    try:
        process.check_config(sc)
        if name in ESTIMATORS:
            algo = replace(algorithm_config(name, algorithm), use_critic=True)
            advantages.check_config(replace(sc, algorithm=algo))
    except ConfigError as e:
        raise ConfigError(f"verl config, under stepcredit: {e}") from None
