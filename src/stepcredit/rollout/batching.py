"""What every engine shares: prompts rendered and left-padded, and a batch built from sampled responses
(masks, texts, truncation flags, the behaviour log-prob pass), and the one batch generation every engine
uses, built on its ``sample`` (:func:`generate_batch`).

``generate`` returns a :class:`~stepcredit.types.Batch` with left-padded prompts, right-padded
responses (eos included, so the policy learns to stop), response masks, truncation flags and the
log-probs of the sampled tokens under the generating policy (at the sampling temperature, so the loss
sees the same distribution the tokens were drawn from): one extra forward pass, or the sampling loop's
own logits where they equal that pass's to float rounding (``logprobs_from_sampling``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from stepcredit.models import token_logprobs
from stepcredit.rollout.engines.api import Engine, GenerationSpec, as_tensor_rows, left_pad
from stepcredit.types import Batch, RolloutCache, Sample

if TYPE_CHECKING:
    from stepcredit.config import RolloutConfig


def render_prompts(tok: Any, samples: list[Sample]) -> list[list[int]]:
    """Token ids of each sample's chat prompt with the generation prompt appended."""
    out = []
    for s in samples:
        text = tok.apply_chat_template(list(s.prompt), add_generation_prompt=True, tokenize=False)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


@torch.no_grad()
def generate_batch(
    engine: Engine,
    model: Any,
    tok: Any,
    samples: list[Sample],
    spec: GenerationSpec,
    *,
    times: dict[str, float] | None = None,
) -> Batch:
    """The batch of ``spec.n`` responses per prompt, sampled by ``engine`` (:meth:`Engine.sample`, the
    one primitive every engine has), with the behaviour log-prob pass of :func:`finish_batch`.

    Where the engine runs the trainer's own float32 model and ``spec.logprobs_from_sampling`` asks for
    it, the sampling loop's log-probs are the behaviour log-probs and the pass is skipped
    (:func:`sampling_logprobs_exact`); an external engine's log-probs (vLLM) are kept beside the
    trainer's as ``engine_logp_BT``. Runs under ``torch.no_grad`` (not inference mode: its tensors would
    break the later backward pass); the batch is on the CPU, its cache on the model's device.
    ``times`` (a dict) gets ``time/behaviour_logp_s``, the behaviour log-probs' own cost."""
    was_training = model.training
    model.eval()
    prompts = render_prompts(tok, samples)
    from_sampling = (
        not engine.external
        and spec.with_logprobs
        and spec.logprobs_from_sampling
        and not spec.keep_cache
        and sampling_logprobs_exact(model)
    )
    engine_logp = engine.external and spec.temperature > 0  # vLLM's own numbers, for truncated IS
    comps = engine.sample(model, tok, prompts, spec.sampling(logprobs=from_sampling or engine_logp))
    t0 = time.perf_counter()
    dev = next(model.parameters()).device
    width = max(1, max(len(c.ids) for c in comps))
    resp = as_tensor_rows([c.ids for c in comps], width, float(tok.pad_token_id)).long()
    logp = as_tensor_rows([c.logprobs for c in comps], width, 0.0) if from_sampling or engine_logp else None
    p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
    out = finish_batch(
        model,
        tok,
        samples,
        spec,
        p_ids=p_ids.repeat_interleave(spec.n, dim=0).to(dev),
        p_mask=p_mask.repeat_interleave(spec.n, dim=0).to(dev),
        resp=resp.to(dev),
        sampled_logp_BT=logp.to(dev) if from_sampling and logp is not None else None,
        engine_logp_BT=logp if engine_logp else None,
    )
    if times is not None and spec.with_logprobs:
        # the pass's cost; log-probs from sampling are counted in the sampling loop (their share is small)
        times["time/behaviour_logp_s"] = 0.0 if from_sampling else time.perf_counter() - t0
    if was_training:
        model.train()
    return out


def generation_spec(cfg: RolloutConfig, **fields: Any) -> GenerationSpec:
    """The generation the rollout settings ask for (``rollout.n``, ``max_new_tokens``, ``temperature``,
    ``top_p``, ``logprobs_from_sampling``), with ``fields`` (``group_offset``, ...) set on top."""
    return GenerationSpec(
        n=cfg.n,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        logprobs_from_sampling=cfg.logprobs_from_sampling,
        **fields,
    )


def finish_batch(
    model: Any,
    tok: Any,
    samples: list[Sample],
    spec: GenerationSpec,
    *,
    p_ids: torch.Tensor,
    p_mask: torch.Tensor,
    resp: torch.Tensor,
    sampled_logp_BT: torch.Tensor | None = None,
    engine_logp_BT: torch.Tensor | None = None,
) -> Batch:
    """The batch of sampled responses ``resp`` (``[B, T]``, each row cut at its first eos) to the
    left-padded prompts ``p_ids`` (row b answers ``samples[b // spec.n]``): masks, texts, truncation flags
    and, with ``spec.with_logprobs``, the behaviour log-prob pass (keeping its cache with ``keep_cache``), or the
    sampling loop's log-probs ``sampled_logp_BT`` (``[B, >= T]``) in its place. ``engine_logp_BT``
    (``[B, >= T]``): an external engine's log-probs of the same tokens, kept beside the trainer's."""
    n, with_logprobs, keep_cache = spec.n, spec.with_logprobs, spec.keep_cache
    dev = p_ids.device
    P = p_ids.shape[1]
    greedy = spec.temperature <= 0
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
            temperature=spec.temperature if not greedy else 1.0,
            cache_out=caches,
        )
        logp = torch.where(mask, logp, torch.zeros_like(logp))
    else:
        logp = None
    group = torch.arange(len(samples), dtype=torch.long).repeat_interleave(n) + spec.group_offset
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
        policy_version=spec.policy_version,
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
