"""LoRA adapters on the policy (``model.lora``, via peft).

RL trains only the adapters: a layer computes ``W x + (alpha / r) B A x`` with ``W`` frozen (Hu et al.
2021, arXiv:2106.09685). The frozen reference of the KL term is then the same network with the adapters
switched off (:class:`AdapterOffView`), so the base weights are held once, as TRL and OpenRLHF do.
SFT before RL stays full fine-tuning: the adapters start from the SFT policy, which is the reference.

The policy is a ``peft.PeftModel``; its forward takes the transformers keyword arguments
(``logits_to_keep``, ``past_key_values``...) and passes them to the wrapped model.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from stepcredit.config import LoRAConfig
from stepcredit.errors import ConfigError


def lora_enabled(cfg: LoRAConfig) -> bool:
    """``model.lora.rank`` > 0."""
    return cfg.rank > 0


def check_lora(model: Any, cfg: LoRAConfig) -> None:
    """peft is installed and every ``target_modules`` name is a linear layer of ``model`` (else one
    line, at start-up: before SFT, not after it)."""
    if importlib.util.find_spec("peft") is None:
        raise ConfigError("config key model.lora.rank: LoRA needs peft: pip install 'stepcredit[lora]'")
    linear = sorted(
        {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    )
    missing = [t for t in cfg.target_modules if t not in linear]
    if missing:
        raise ConfigError(
            f"config key model.lora.target_modules: {', '.join(missing)} is no linear layer of the model "
            f"(its linear layers: {', '.join(linear)})"
        )


def attach_lora(model: Any, cfg: LoRAConfig) -> Any:
    """``model`` wrapped in fresh adapters (B = 0, so it computes what ``model`` did): every base weight
    frozen, the adapters trainable, on each base layer's device and in its dtype (the storage dtype of
    the model's weights, float32 under bfloat16 autocast)."""
    from peft import LoraConfig, get_peft_model

    check_lora(model, cfg)
    pc = LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # annotated int; peft divides it by r
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    # autocast_adapter_dtype=False: peft would keep float32 adapters beside bfloat16 weights; here they
    # take the base layer's dtype, so a bfloat16 model's adapters are bfloat16 too
    policy = get_peft_model(model, pc, autocast_adapter_dtype=False)
    for name, p in policy.named_parameters():
        assert p.requires_grad == _is_adapter(name), name
        if not p.requires_grad:
            p.grad = None  # SFT's last gradient would otherwise count in every clipped gradient norm
    return policy


def _is_adapter(name: str) -> bool:
    return ".lora_" in name


def adapter_parameters(policy: Any) -> list[torch.nn.Parameter]:
    """The trainable parameters of a LoRA policy (what the optimiser steps)."""
    return [p for n, p in policy.named_parameters() if _is_adapter(n)]


def base_parameters(policy: Any) -> list[torch.nn.Parameter]:
    """The frozen base weights of a LoRA policy (the reference's weights: the same tensors)."""
    return [p for n, p in policy.named_parameters() if not _is_adapter(n)]


class AdapterOffView:
    """The reference policy: ``policy`` called with its adapters switched off (peft's
    ``disable_adapter()``) and in eval mode, i.e. the base model. It holds no weights of its own:
    :meth:`parameters` are the policy's base tensors."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        was_training = self.policy.training
        self.policy.eval()  # as the frozen copy it replaces (no dropout)
        try:
            with self.policy.disable_adapter():
                return self.policy(*args, **kwargs)
        finally:
            self.policy.train(was_training)

    def parameters(self) -> list[torch.nn.Parameter]:
        return base_parameters(self.policy)

    def get_base_model(self) -> Any:
        """The wrapped transformers model (whose forward's signature callers inspect)."""
        return self.policy.get_base_model()


def lora_state_dict(policy: Any, *, with_base: bool) -> dict[str, torch.Tensor]:
    """What a checkpoint holds of a LoRA policy: the adapters, plus the base weights when they cannot
    be rebuilt from the config (``with_base``: SFT changed them)."""
    from peft import get_peft_model_state_dict

    return dict(policy.state_dict()) if with_base else get_peft_model_state_dict(policy)


def load_lora_state_dict(policy: Any, state: dict[str, torch.Tensor], *, with_base: bool) -> None:
    """Restore :func:`lora_state_dict`'s output into a policy made by :func:`attach_lora`."""
    from peft import set_peft_model_state_dict

    if with_base:
        policy.load_state_dict(state)
        return
    result: Any = set_peft_model_state_dict(policy, state)
    missing = [k for k in result.missing_keys if _is_adapter(k)]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"checkpoint adapters do not fit the model: {missing or result.unexpected_keys}")


@torch.no_grad()
def merged_state_dict(policy: Any, *, merge: bool = True) -> dict[str, torch.Tensor]:
    """The policy's weights under the plain model's names (peft's ``base_layer.`` and adapter entries
    gone): each adapted layer's weight is ``W + (alpha / r) B A`` (or ``W`` with ``merge=False``: the
    base). The policy is not changed; weights of layers without adapters are its own tensors (no copy).
    For pushing the adapted policy's weights to an inference engine."""
    from peft.tuners.lora import LoraLayer

    model = policy.get_base_model()
    out: dict[str, torch.Tensor] = {}
    for key, t in model.state_dict().items():
        if not _is_adapter(key):
            out[key.replace(".base_layer.", ".")] = t
    if merge:
        for name, m in model.named_modules():
            if isinstance(m, LoraLayer):
                layer: Any = m  # peft's LoRA layer classes (Linear...) define get_delta_weight
                w: torch.Tensor = layer.get_base_layer().weight
                for a in layer.active_adapters:
                    if a in layer.lora_A:
                        w = w + layer.get_delta_weight(a).to(w.dtype)
                out[f"{name}.weight"] = w
    return out


def export_lora(policy: Any, tok: Any, final_dir: Path, cfg: LoRAConfig, *, base_source: str | None) -> None:
    """Write ``final_dir/adapter`` (peft's adapter files and the tokenizer), the base they apply to
    as ``final_dir/base`` unless ``base_source`` (a model directory whose weights are the base) is
    given, and with ``cfg.merge_on_export`` the merged model as ``final_dir/model`` (a plain model
    directory: ``stepcredit eval --model`` loads it)."""
    model = policy.get_base_model()
    base_dir = base_source if base_source is not None else str((final_dir / "base").resolve())
    if base_source is None:
        _save_plain(model, tok, final_dir / "base", merged_state_dict(policy, merge=False))
    peft_cfg = policy.peft_config[policy.active_adapter]
    peft_cfg.base_model_name_or_path = base_dir  # where peft's loaders find the base
    policy.save_pretrained(str(final_dir / "adapter"))
    tok.save_pretrained(str(final_dir / "adapter"))
    if cfg.merge_on_export:
        _save_plain(model, tok, final_dir / "model", merged_state_dict(policy))


def _save_plain(model: Any, tok: Any, path: Path, state: dict[str, torch.Tensor]) -> None:
    # the model's own save with the plain names: its config, and tied weights written once
    model.save_pretrained(str(path), state_dict=state)
    tok.save_pretrained(str(path))


def base_source(path: str, *, sft_steps: int) -> str | None:
    """The model directory that holds the adapters' base, or None when the base must be written out
    (SFT changed it, or it is built in code or converted from another format)."""
    return (
        os.path.abspath(path)
        if sft_steps == 0 and os.path.isfile(os.path.join(path, "config.json"))
        else None
    )


@contextlib.contextmanager
def adapters_merged(policy: Any) -> Iterator[int]:
    """Within the block each active adapter of ``policy`` (a peft LoRA model in eval mode, adapters
    enabled) is merged into its base weight, ``W <- W + (alpha / r) B A``, and marked merged, so each
    adapted layer runs its base layer alone: generation then costs the base model's products, not
    theirs plus two small ones per layer per token. Afterwards every base weight is copied back from a
    saved copy, bit for bit (an unmerge by subtraction would leave rounding in the frozen weights,
    which are also the reference's), in the same storage (a compiled decode step keeps its guards).
    Yields the number of merged layers (0: nothing to merge, the block runs unchanged: not a LoRA
    model, training mode, adapters disabled or already merged, DoRA)."""
    if (
        not (hasattr(policy, "peft_config") and callable(getattr(policy, "get_base_model", None)))
        or policy.training
    ):
        yield 0
        return
    from peft.tuners.lora import LoraLayer

    merged: list[tuple[Any, torch.Tensor, torch.Tensor, list[str]]] = []
    try:
        with torch.no_grad():
            for m in policy.get_base_model().modules():
                if not isinstance(m, LoraLayer) or m.disable_adapters or m.merged:
                    continue
                layer: Any = m
                names = [a for a in layer.active_adapters if a in layer.lora_A]
                if not names or any(layer.use_dora.get(a, False) for a in names):
                    continue
                w: torch.Tensor = layer.get_base_layer().weight
                saved = w.detach().clone()
                merged.append((layer, w, saved, names))
                for a in names:
                    w.add_(layer.get_delta_weight(a).to(w.dtype))
                layer.merged_adapters.extend(names)
        yield len(merged)
    finally:
        with torch.no_grad():
            for layer, w, saved, names in merged:
                w.copy_(saved)
                for a in names:
                    layer.merged_adapters.remove(a)
