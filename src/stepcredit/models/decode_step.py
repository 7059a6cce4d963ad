"""One decoding step of a Llama-architecture model without transformers' per-call machinery.

In a sampling loop each token runs the whole model on one position per row; for small models the
cost is then mostly the framework around the matrix products (module calls, building the 4D
attention mask, output objects, cache bookkeeping), not the products. :func:`llama_step` runs the
same modules' weights through the same operations in the same order as ``LlamaForCausalLM.forward``
with ``sdpa`` attention (so the logits are the same up to floating-point ties;
``tests/models/test_decode_step.py``), reading and writing the keys and values of a prefilled cache.
A LoRA policy (``model.lora``: a peft wrapper) takes the same path through its base model, whose
adapted linear layers add the adapters in their own forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_LLAMA_STEP_SETTINGS = (("_attn_implementation", "sdpa"), ("hidden_act", "silu"))
"""Model config values :func:`llama_step` is written for (the attention kernel and the MLP's activation)."""


def _llama_inside(model: Any) -> Any | None:
    """The ``LlamaForCausalLM`` whose modules compute ``model``'s forward, or None: ``model`` itself, or
    the base model of a peft LoRA wrapper (``model.lora``). LoRA's ``W x + (alpha / r) B A x`` (its
    dropout, a disabled or merged adapter) is each adapted linear layer's own forward, which
    :func:`llama_step` calls like any module; the wrapper's forward only passes its arguments on. Other
    peft methods (prompt tuning: virtual tokens before the input) change the forward: left to it."""
    from transformers import LlamaForCausalLM

    if "forward" in vars(model):  # an autocast wrapper (use_bf16_autocast) must run
        return None
    if hasattr(model, "peft_config") and callable(getattr(model, "get_base_model", None)):
        from peft.tuners.lora import LoraModel

        if not isinstance(getattr(model, "base_model", None), LoraModel) or model.training:
            return None
        model = model.get_base_model()
        if "forward" in vars(model):
            return None
    return model if type(model) is LlamaForCausalLM else None


def supports_llama_step(model: Any) -> bool:
    """Can :func:`llama_step` stand in for ``model``'s forward pass? A plain ``LlamaForCausalLM``
    (float32 or bfloat16 weights, no autocast wrapper), bare or with peft LoRA adapters, with sdpa
    attention and no biases."""
    inner = _llama_inside(model)
    if inner is None:
        return False
    cfg = inner.config
    return bool(
        all(getattr(cfg, key, None) == want for key, want in _LLAMA_STEP_SETTINGS)
        and not getattr(cfg, "attention_bias", False)
        and not getattr(cfg, "mlp_bias", False)
        and getattr(cfg, "pretraining_tp", 1) == 1
        and not inner.training
    )


@torch.no_grad()
def llama_step(
    model: Any, ids_B1: torch.Tensor, pos_B1: torch.Tensor, mask_BW: torch.Tensor, cache: Any
) -> torch.Tensor:
    """Next-token logits ``[B, V]`` after feeding one token per row.

    ``mask_BW``: which cached positions (and the new one, last) each row attends to; ``cache``: a
    transformers cache whose ``layers[i].update(k, v)`` appends and returns the layer's keys and values.
    """
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inner = model.model
    h = inner.embed_tokens(ids_B1)
    cos, sin = inner.rotary_emb(h, pos_B1)
    # as transformers' sdpa mask: none when every position counts (q_len 1 needs no causal mask)
    mask = None if bool(mask_BW.all()) else mask_BW.bool()[:, None, None, :]
    B = h.shape[0]
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        residual = h
        x = layer.input_layernorm(h)
        shape = (B, 1, -1, attn.head_dim)
        q = attn.q_proj(x).view(shape).transpose(1, 2)
        k = attn.k_proj(x).view(shape).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = cache.layers[i].update(k, v)
        groups = attn.num_key_value_groups
        if groups > 1:
            kw: dict[str, Any] = {"enable_gqa": True} if mask is None else {}
            if mask is not None:  # transformers repeats the heads when a mask is given
                k = k[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)
                v = v[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)
        else:
            kw = {}
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=0.0, scale=attn.scaling, is_causal=False, **kw
        )
        o = o.transpose(1, 2).contiguous().reshape(B, 1, -1)
        h = residual + attn.o_proj(o)
        residual = h
        h = residual + layer.mlp(layer.post_attention_layernorm(h))
    h = inner.norm(h)
    return model.lm_head(h[:, -1, :])


def fast_step(model: Any) -> Callable[..., torch.Tensor] | None:
    """:func:`llama_step` bound to ``model`` (a LoRA wrapper's base model, whose adapted layers carry
    the adapters) when it supports it, else None."""
    if not supports_llama_step(model):
        return None
    inner = _llama_inside(model)
    return lambda ids_B1, pos_B1, mask_BW, cache: llama_step(inner, ids_B1, pos_B1, mask_BW, cache)
