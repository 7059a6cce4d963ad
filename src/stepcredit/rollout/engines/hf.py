"""The ``hf`` engine: the trainer's own model generates with our decode loop
(:func:`stepcredit.rollout.sampling.decode`). Nothing to sync, nothing to put to sleep."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from stepcredit.errors import ConfigError
from stepcredit.models.decode_step import DecodeOptions, decode_options, supports_llama_step
from stepcredit.models.lora import adapters_merged
from stepcredit.rollout.cached_decode import decode_cached
from stepcredit.rollout.engines.api import (
    Budgets,
    CachedContexts,
    Completion,
    Contexts,
    Prefixes,
    SamplingSpec,
    cut_at_stop,
    left_pad,
)
from stepcredit.rollout.prefix_kv import KeptKV, PrefixKV
from stepcredit.rollout.sampling import decode, row_key
from stepcredit.rollout.stops import PatternStop

if TYPE_CHECKING:
    from stepcredit.config import Config


@contextlib.contextmanager
def seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Draw from a stream seeded with ``seed``, leaving the global random state as it was (None: the
    global stream itself, as every rollout draws)."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class HFEngine:
    """Generation by the model it is given (the trainer's policy); ``options``: how its sampling loop
    runs the token steps (``rollout.decode_compile``, ``model.lora.merge_for_generation``)."""

    external = False
    continues_cache = True
    """It can continue contexts from the rollout's KV cache (:meth:`sample_cached`)."""

    def __init__(self, options: DecodeOptions | None = None) -> None:
        self.options = options or DecodeOptions()

    @torch.no_grad()
    def sample(
        self,
        model: Any,
        tok: Any,
        contexts: Contexts,
        spec: SamplingSpec,
        *,
        budgets: Budgets = None,
        prefixes: Prefixes = None,
    ) -> list[Completion]:
        rows = [list(c) for c in contexts for _ in range(spec.n)]
        limits = [min(b, spec.max_tokens) for b in budgets for _ in range(spec.n)] if budgets else None
        width = max(limits) if limits else spec.max_tokens
        dev = next(model.parameters()).device
        ids, mask = left_pad(rows, tok.pad_token_id)
        ent = torch.zeros(len(rows), width, device=dev) if spec.entropy else None
        logp = torch.zeros(len(rows), width, dtype=torch.float32, device=dev) if spec.logprobs else None
        keys = None
        if spec.row_seeds:
            if len(spec.row_seeds) != len(contexts):
                raise ValueError(
                    f"SamplingSpec.row_seeds: {len(spec.row_seeds)} seeds for {len(contexts)} contexts"
                )
            keys = torch.tensor([row_key(s, j) for s in spec.row_seeds for j in range(spec.n)], device=dev)
        # the kept keys and values of each row's context but its last token: no prefill of those
        prefix = (
            PrefixKV([h for h in prefixes for _ in range(spec.n)], [len(r) - 1 for r in rows])
            if prefixes is not None and all(h is not None for h in prefixes)
            else None
        )
        keep = KeptKV() if spec.keep_kv else None
        stop = PatternStop(tok, spec.stop_pattern, len(rows)) if spec.stop_pattern else None
        was_training = model.training
        model.eval()
        with seeded(spec.seed, dev), decode_options(self.options):
            resp = decode(
                model,
                ids.to(dev),
                mask.to(dev),
                max_new_tokens=width,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                temperature=spec.temperature,
                top_p=spec.top_p,
                entropy_BT=ent,
                logp_BT=logp,
                limit_B=None if limits is None else torch.tensor(limits, dtype=torch.long, device=dev),
                row_keys_B=keys,
                prefix=prefix,
                keep=keep,
                stop=stop,
            ).cpu()
        if was_training:
            model.train()
        ent_cpu = ent.cpu() if ent is not None else None
        logp_cpu = logp.cpu() if logp is not None else None
        out = []
        for r in range(len(rows)):
            row = _ended(resp[r, : limits[r] if limits else width].tolist(), r, tok, spec, stop)
            out.append(
                Completion(
                    row,
                    logp_cpu[r, : len(row)].tolist() if logp_cpu is not None else [],
                    ent_cpu[r, : len(row)].tolist() if ent_cpu is not None else [],
                    keep.row(r) if keep is not None else None,
                )
            )
        return out

    @torch.no_grad()
    def sample_cached(
        self, model: Any, tok: Any, cached: CachedContexts, spec: SamplingSpec
    ) -> list[Completion] | None:
        """``spec.n`` completions of each of ``cached.contexts``, continued from the rollout's KV cache
        (:func:`~stepcredit.rollout.cached_decode.decode_cached`): what :meth:`sample` gives for them,
        without prefilling them. None (the caller samples) for what it does not do: a compiled decode,
        per-row seeds, log-probs or entropies, or a cache it cannot read."""
        if self.options.compiled or spec.row_seeds or spec.logprobs or spec.entropy:
            return None
        rows = [r for r in cached.rows for _ in range(spec.n)]
        contexts = [c for c in cached.contexts for _ in range(spec.n)]
        dev = next(model.parameters()).device
        stop = PatternStop(tok, spec.stop_pattern, len(rows)) if spec.stop_pattern else None
        was_training = model.training
        model.eval()
        merge = adapters_merged(model) if self.options.merge_lora else contextlib.nullcontext(0)
        with seeded(spec.seed, dev), merge:
            resp = decode_cached(
                model,
                cached.body,
                rows,
                contexts,
                max_new_tokens=spec.max_tokens,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                temperature=spec.temperature,
                top_p=spec.top_p,
                stop=stop,
            )
        if was_training:
            model.train()
        if resp is None:
            return None
        resp = resp.cpu()
        return [Completion(_ended(resp[r].tolist(), r, tok, spec, stop)) for r in range(len(rows))]

    def sync(self, model: Any) -> None:
        """The engine runs the trainer's model itself: always current."""

    def sleep(self) -> None:
        """Nothing of its own to free."""

    def feed(self, weights: Any) -> None:
        """The engine runs the (wrapped) model itself: nothing to feed."""

    def close(self) -> None:
        """Nothing to close."""


def _ended(row: list[int], r: int, tok: Any, spec: SamplingSpec, stop: PatternStop | None) -> list[int]:
    """Row ``r`` of a decode up to where it ended: the token that completed the stop pattern, else its
    first eos, then cut after a stop string."""
    if stop is not None and stop.ended[r]:
        row = row[: stop.ended[r]]
    elif tok.eos_token_id in row:
        row = row[: row.index(tok.eos_token_id) + 1]
    return row[: cut_at_stop(row, tok, spec.stop)]


HF_ENGINE = HFEngine()


def build_hf(cfg: Config, model: Any, tok: Any) -> HFEngine:
    options = DecodeOptions(
        compile=cfg.rollout.decode_compile, merge_lora=cfg.model.lora.merge_for_generation
    )
    if options.compiled and not supports_llama_step(model, any_mode=True):
        # the compiled step is the Llama step over a static cache: anything else would decode eagerly
        raise ConfigError(
            f"config key rollout.decode_compile: {options.compile} compiles the Llama decode step, and "
            f"the policy ({type(model).__name__}: {getattr(getattr(model, 'config', None), 'model_type', '?')}, "
            "sdpa attention, no biases) is not one it runs; set rollout.decode_compile=off"
        )
    return HF_ENGINE if options == HF_ENGINE.options else HFEngine(options)
