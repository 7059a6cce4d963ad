"""What every engine shares: prompts rendered and left-padded, and a batch built from sampled responses
(masks, texts, truncation flags, the behaviour log-prob pass). Also the Hugging Face engine's batch
generation (our own decode loop, :mod:`stepcredit.rollout.sampling`).

``generate`` returns a :class:`~stepcredit.types.Batch` with left-padded prompts, right-padded
responses (eos included, so the policy learns to stop), response masks, truncation flags and the
log-probs of the sampled tokens under the generating policy (at the sampling temperature, so the loss
sees the same distribution the tokens were drawn from): one extra forward pass, or the sampling loop's
own logits where they equal that pass's to float rounding (``logprobs_from_sampling``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from stepcredit.models import token_logprobs
from stepcredit.rollout.sampling import decode, row_key
from stepcredit.types import Batch, RolloutCache, Sample


def render_prompts(tok: Any, samples: list[Sample]) -> list[list[int]]:
    """Token ids of each sample's chat prompt with the generation prompt appended."""
    out = []
    for s in samples:
        text = tok.apply_chat_template(list(s.prompt), add_generation_prompt=True, tokenize=False)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), P), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s:
            ids[i, P - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, P - len(s) :] = True
    return ids, mask


@torch.no_grad()
def hf_generate(
    model: Any,
    tok: Any,
    samples: list[Sample],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    group_offset: int = 0,
    with_logprobs: bool = True,
    policy_version: int = 0,
    keep_cache: bool = False,
    logprobs_from_sampling: bool = False,
    times: dict[str, float] | None = None,
    row_seeds: list[int] | None = None,
) -> Batch:
    """Sample ``n`` responses per prompt (greedy when ``temperature == 0``).

    Responses of prompt ``i`` get group id ``group_offset + i``. Runs under ``torch.no_grad`` (not
    inference mode: its tensors would break the later backward pass). ``with_logprobs=False`` skips the
    behaviour log-prob pass (``behaviour_logp_BT`` is then None). ``keep_cache``: the behaviour
    log-prob pass keeps its KV cache in ``batch.kv_cache`` (a :class:`~stepcredit.types.RolloutCache`)
    so the process stage values prefixes without running the responses through the model again.
    Generation runs on the model's device; the returned batch is on the CPU (the cache stays on the device).
    ``logprobs_from_sampling``: the behaviour log-probs are those the sampling loop computed from its own
    logits, with no pass of their own, where that is the training pass's distribution to float rounding
    (:func:`sampling_logprobs_exact`; else, or with ``keep_cache``, the pass runs). ``times`` (a dict)
    gets ``time/behaviour_logp_s``, the behaviour log-probs' own cost. ``row_seeds`` (one per prompt):
    response j of prompt i draws from its own random stream, keyed (row_seeds[i], j)
    (:func:`stepcredit.rollout.sampling.row_key`), so its tokens depend on nothing else in the batch.
    """
    was_training = model.training
    model.eval()
    prompt_ids = render_prompts(tok, samples)
    p_ids, p_mask = left_pad(prompt_ids, tok.pad_token_id)
    dev = next(model.parameters()).device
    p_ids = p_ids.repeat_interleave(n, dim=0).to(dev)
    p_mask = p_mask.repeat_interleave(n, dim=0).to(dev)
    from_sampling = (
        with_logprobs and logprobs_from_sampling and not keep_cache and sampling_logprobs_exact(model)
    )
    sampled_BT = (
        torch.zeros((len(p_ids), max_new_tokens), dtype=torch.float32, device=dev) if from_sampling else None
    )
    keys_B = None
    if row_seeds is not None:
        if len(row_seeds) != len(samples):
            raise ValueError(f"row_seeds: {len(row_seeds)} seeds for {len(samples)} prompts")
        keys_B = torch.tensor([row_key(s, j) for s in row_seeds for j in range(n)], dtype=torch.long)
    t0 = time.perf_counter()
    # our own sampling loop (rollout/sampling.py): model.generate's draws, without generating on for
    # rows that have finished
    resp = decode(
        model,
        p_ids,
        p_mask,
        max_new_tokens=max_new_tokens,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        temperature=temperature,
        top_p=top_p,
        logp_BT=sampled_BT,
        row_keys_B=keys_B,
    )
    t_decode = time.perf_counter() - t0
    out = finish_batch(
        model,
        tok,
        samples,
        n=n,
        p_ids=p_ids,
        p_mask=p_mask,
        resp=resp,
        temperature=temperature,
        group_offset=group_offset,
        with_logprobs=with_logprobs,
        policy_version=policy_version,
        keep_cache=keep_cache,
        sampled_logp_BT=sampled_BT,
    )
    if times is not None and with_logprobs:
        # the pass's cost; log-probs from sampling are counted in the sampling loop (their share is small)
        times["time/behaviour_logp_s"] = 0.0 if from_sampling else time.perf_counter() - t0 - t_decode
    if was_training:
        model.train()
    return out


def finish_batch(
    model: Any,
    tok: Any,
    samples: list[Sample],
    *,
    n: int,
    p_ids: torch.Tensor,
    p_mask: torch.Tensor,
    resp: torch.Tensor,
    temperature: float,
    group_offset: int,
    with_logprobs: bool,
    policy_version: int,
    keep_cache: bool,
    sampled_logp_BT: torch.Tensor | None = None,
    engine_logp_BT: torch.Tensor | None = None,
) -> Batch:
    """The batch of sampled responses ``resp`` (``[B, T]``, each row cut at its first eos) to the
    left-padded prompts ``p_ids`` (row b answers ``samples[b // n]``): masks, texts, truncation flags and,
    with ``with_logprobs``, the behaviour log-prob pass (keeping its cache with ``keep_cache``), or the
    sampling loop's log-probs ``sampled_logp_BT`` (``[B, >= T]``) in its place. ``engine_logp_BT``
    (``[B, >= T]``): an external engine's log-probs of the same tokens, kept beside the trainer's."""
    dev = p_ids.device
    P = p_ids.shape[1]
    greedy = temperature <= 0
    B = resp.shape[0]
    if resp.shape[1] == 0:
        resp = torch.full((B, 1), tok.eos_token_id, dtype=torch.long, device=dev)
    # A response ends at its first eos (inclusive); everything after is padding.
    is_eos = resp == tok.eos_token_id
    has_eos = is_eos.any(dim=1)
    first_eos = torch.where(
        has_eos, is_eos.float().argmax(dim=1), torch.full_like(has_eos, resp.shape[1] - 1, dtype=torch.long)
    )
    pos = torch.arange(resp.shape[1], device=dev).unsqueeze(0)
    mask = pos <= first_eos.unsqueeze(1)
    T = int(mask.sum(1).max())
    resp = torch.where(mask, resp, torch.full_like(resp, tok.pad_token_id))[:, :T]
    mask = mask[:, :T]
    truncated = ~has_eos
    texts = []
    resp_cpu, lens = resp.cpu(), mask.sum(1).tolist()
    for b in range(B):
        ids = resp_cpu[b, : int(lens[b])].tolist()
        texts.append(tok.decode(ids, skip_special_tokens=True))
    caches: list[Any] | None = [] if keep_cache and with_logprobs else None
    if with_logprobs and sampled_logp_BT is not None and not keep_cache:
        logp = torch.where(mask, sampled_logp_BT[:, :T], torch.zeros_like(mask, dtype=torch.float32))
    elif with_logprobs:
        logp, _ = token_logprobs(
            model,
            torch.cat([p_ids, resp], dim=1),
            torch.cat([p_mask, mask], dim=1).long(),
            n_response=T,
            temperature=temperature if not greedy else 1.0,
            cache_out=caches,
        )
        logp = torch.where(mask, logp, torch.zeros_like(logp))
    else:
        logp = None
    group = torch.arange(len(samples), dtype=torch.long).repeat_interleave(n) + group_offset
    return Batch(
        samples=[s for s in samples for _ in range(n)],
        group_B=group,
        prompt_ids_BP=p_ids.cpu(),
        prompt_mask_BP=p_mask.cpu(),
        response_ids_BT=resp_cpu,
        response_mask_BT=mask.cpu(),
        behaviour_logp_BT=None if logp is None else logp.float().cpu(),
        texts=texts,
        truncated_B=truncated.cpu(),
        policy_version=policy_version,
        kv_cache=RolloutCache(caches[0], (P - p_mask.sum(1)).tolist(), P + T) if caches else None,
        engine_logp_BT=(
            None
            if engine_logp_BT is None
            else torch.where(mask.cpu(), engine_logp_BT[:, :T].float().cpu(), torch.zeros(()))
        ),
    )


def sampling_logprobs_exact(model: Any) -> bool:
    """Are the sampling loop's log-probs the training pass's to float rounding (~1e-6)? Only when the
    model computes in float32 with its own forward: under bfloat16 (parameters or autocast, see
    :func:`stepcredit.models.use_bf16_autocast`) the step-by-step decode and the whole-sequence pass
    round differently (~1e-2), and the loss must see the pass's numbers."""
    if torch.is_autocast_enabled() or any(p.dtype != torch.float32 for p in model.parameters()):
        return False
    return getattr(model.forward, "__func__", None) is type(model).forward
