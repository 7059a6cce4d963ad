"""Models: any Hugging Face causal LM by path, or the built-in tiny model, plus save/load.

``load_policy(cfg.model)`` returns ``(model, tokenizer)`` ready for generation and training.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stepcredit.config import ModelConfig
from stepcredit.errors import UserError
from stepcredit.models.tiny import build_tiny, build_tokenizer

__all__ = ["build_tiny", "build_tokenizer", "load_policy", "save_pretrained", "token_logprobs"]


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
    if cfg.path == "tiny":
        model, tok = build_tiny(cfg.tiny, seed=seed, attn_implementation=cfg.attn_implementation)
        return model.to(_dtype(cfg.dtype)), tok
    if not os.path.isdir(cfg.path):
        raise UserError(f"config key model.path: model directory {cfg.path!r} does not exist")
    from transformers import AutoModelForCausalLM

    kw: dict[str, Any] = {"gguf_file": cfg.gguf_file} if cfg.gguf_file else {}
    try:
        tok = _load_tokenizer(cfg.path, cfg.gguf_file)
        model = AutoModelForCausalLM.from_pretrained(
            cfg.path, dtype=_dtype(cfg.dtype), attn_implementation=cfg.attn_implementation, **kw
        )
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"config key model.path: cannot load a model from {cfg.path!r}: {first}") from None
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def save_pretrained(model: Any, tok: Any, path: str | os.PathLike[str]) -> None:
    """Save model and tokenizer so that ``load_policy(ModelConfig(path=...))`` reloads them."""
    model.save_pretrained(path)
    tok.save_pretrained(path)


def token_logprobs(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    *,
    n_response: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    cache_out: list[Any] | None = None,
) -> tuple[Any, Any]:
    """Log-probs (and optionally entropies) of the last ``n_response`` tokens of each row.

    ``input_ids`` is prompt (left-padded) + response (right-padded); position ids follow the
    attention mask so left padding does not shift positions. Returns ``logp_BT`` and ``entropy_BT``
    (or None), both ``[B, n_response]``. With ``cache_out`` (a list) the pass keeps its KV cache and
    appends it there, for a later pass that continues from these tokens (the process stage's suffixes).
    """
    import torch

    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=cache_out is not None
    )
    if cache_out is not None:
        cache_out.append(out.past_key_values)
    logits = out.logits[:, -n_response - 1 : -1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    target = input_ids[:, -n_response:]
    logp = logp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    ent = None
    if with_entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent
