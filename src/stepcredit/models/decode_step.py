"""One decoding step of a Llama-architecture model without transformers' per-call machinery.

In a sampling loop each token runs the whole model on one position per row; for small models the
cost is then mostly the framework around the matrix products (module calls, building the 4D
attention mask, output objects, cache bookkeeping), not the products. :func:`llama_step` runs the
same modules' weights through the same operations in the same order as ``LlamaForCausalLM.forward``
with ``sdpa`` attention (so the logits are the same up to floating-point ties;
``tests/models/test_decode_step.py``), reading and writing the keys and values of a prefilled cache.
A LoRA policy (``model.lora``: a peft wrapper) takes the same path through its base model, whose
adapted linear layers add the adapters in their own forward (or, merged for the decode,
:func:`stepcredit.models.lora.adapters_merged`, only their base layer). A model run under bfloat16
autocast (``model.dtype=bfloat16``) takes it too, inside the same autocast.

:class:`StaticStep` (``rollout.decode_compile``, off by default): the same step over a *static* KV cache,
one buffer per layer of a fixed width (the decode's length rounded up to :data:`STATIC_ROUND`) written
at the new token's index, attention over the whole width under the mask, and no rows dropped from the
batch, so every token step has the same shapes and ``torch.compile`` compiles it once (with
``reduce-overhead``, replayed as a CUDA graph: one launch per token instead of one per kernel). The
buffers are kept per model and shape for the next decode (their addresses are part of a CUDA graph).
:func:`decode_options` carries the setting from the engine into the sampling loop.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
"""``rollout.decode_compile``: off (the eager step), or a ``torch.compile`` mode of the static step."""

STATIC_ROUND = 64
"""The static cache's width is the decode's (prompt + new tokens) rounded up to a multiple of this,
so prompts of different lengths share one compiled step."""


@dataclass(frozen=True)
class DecodeOptions:
    """How the sampling loop runs the token steps (set by the ``hf`` engine from the config)."""

    compile: str = "off"
    """One of :data:`COMPILE_MODES`."""
    backend: str = "inductor"
    """``torch.compile``'s backend (``aot_eager`` traces and checks the graph without generating code)."""
    merge_lora: bool = True
    """Merge LoRA adapters into their base weights for the decode (``model.lora.merge_for_generation``)."""

    @property
    def compiled(self) -> bool:
        """The token step runs compiled over a static KV cache (``compile`` is not ``off``)."""
        return self.compile != "off"


_OPTIONS: contextvars.ContextVar[DecodeOptions | None] = contextvars.ContextVar(
    "stepcredit_decode_options", default=None
)


@contextlib.contextmanager
def decode_options(options: DecodeOptions) -> Iterator[None]:
    """The sampling loops run in this block use ``options``."""
    token = _OPTIONS.set(options)
    try:
        yield
    finally:
        _OPTIONS.reset(token)


def current_options() -> DecodeOptions:
    """The options of the enclosing :func:`decode_options` block (the defaults outside one)."""
    return _OPTIONS.get() or DecodeOptions()


def _autocast_dtype(model: Any) -> torch.dtype | bool | None:
    """``torch.bfloat16`` when ``model``'s forward is stepcredit's bfloat16 autocast wrapper
    (``use_bf16_autocast``), None when it has no wrapper, False for any other wrapper (left to it)."""
    wrapper = vars(model).get("forward")
    if wrapper is None:
        return None
    from stepcredit.models import _autocast_forward

    return torch.bfloat16 if getattr(wrapper, "__func__", None) is _autocast_forward else False


_LLAMA_STEP_SETTINGS = (("_attn_implementation", "sdpa"), ("hidden_act", "silu"))
"""Model config values :func:`llama_step` is written for (the attention kernel and the MLP's activation)."""


def _llama_inside(model: Any, *, any_mode: bool = False) -> tuple[Any, torch.dtype | None] | None:
    """The ``LlamaForCausalLM`` whose modules compute ``model``'s forward and the autocast dtype its
    forward runs under (None: none), or None: ``model`` itself, or the base model of a peft LoRA
    wrapper (``model.lora``). LoRA's ``W x + (alpha / r) B A x`` (its dropout, a disabled or merged
    adapter) is each adapted linear layer's own forward, which :func:`llama_step` calls like any
    module; the wrapper's forward only passes its arguments on. Other peft methods (prompt tuning:
    virtual tokens before the input) change the forward: left to it, as is a forward wrapper other than
    stepcredit's bfloat16 autocast (whose autocast the step runs under). ``any_mode``: a LoRA wrapper in
    training mode counts too (the decode runs it in eval mode)."""
    from transformers import LlamaForCausalLM

    autocast = _autocast_dtype(model)
    if autocast is False:
        return None
    if hasattr(model, "peft_config") and callable(getattr(model, "get_base_model", None)):
        from peft.tuners.lora import LoraModel

        if not isinstance(getattr(model, "base_model", None), LoraModel) or (model.training and not any_mode):
            return None
        model = model.get_base_model()
        inner_autocast = _autocast_dtype(model)
        if inner_autocast is False:
            return None
        autocast = autocast or inner_autocast
    if type(model) is not LlamaForCausalLM:
        return None
    return model, autocast if isinstance(autocast, torch.dtype) else None


def supports_llama_step(model: Any, *, any_mode: bool = False) -> bool:
    """Can :func:`llama_step` stand in for ``model``'s forward pass? A plain ``LlamaForCausalLM``
    (float32 or bfloat16 weights, or stepcredit's bfloat16 autocast wrapper), bare or with peft LoRA
    adapters, with sdpa attention and no biases, in eval mode (``any_mode``: in either mode, the
    question a start-up check asks of a model that will decode in eval mode)."""
    found = _llama_inside(model, any_mode=any_mode)
    if found is None:
        return False
    inner = found[0]
    cfg = inner.config
    return bool(
        all(getattr(cfg, key, None) == want for key, want in _LLAMA_STEP_SETTINGS)
        and not getattr(cfg, "attention_bias", False)
        and not getattr(cfg, "mlp_bias", False)
        and getattr(cfg, "pretraining_tp", 1) == 1
        and (any_mode or not inner.training)
    )


@torch.no_grad()
def llama_step(
    model: Any, ids_B1: torch.Tensor, pos_B1: torch.Tensor, mask_BW: torch.Tensor, cache: Any
) -> torch.Tensor:
    """Next-token logits ``[B, V]`` after feeding one token per row.

    ``mask_BW``: which cached positions (and the new one, last) each row attends to; ``cache``: a
    transformers cache whose ``layers[i].update(k, v)`` appends and returns the layer's keys and values.
    """
    # as transformers' sdpa mask: none when every position counts (q_len 1 needs no causal mask)
    mask = None if bool(mask_BW.all()) else mask_BW.bool()[:, None, None, :]

    def attend(i: int, attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = cache.layers[i].update(k, v)
        groups = attn.num_key_value_groups
        kw: dict[str, Any] = {}
        if groups > 1 and mask is None:
            kw = {"enable_gqa": True}
        elif groups > 1:  # transformers repeats the heads when a mask is given
            k = k[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)
            v = v[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=0.0, scale=attn.scaling, is_causal=False, **kw
        )

    return _llama_layers(model, ids_B1, pos_B1, attend)


def _llama_layers(
    model: Any, ids_B1: torch.Tensor, pos_B1: torch.Tensor, attend: Callable[..., torch.Tensor]
) -> torch.Tensor:
    """The decoder stack of ``LlamaForCausalLM.forward`` on one new token per row, in its order of
    operations, with each layer's attention over the cached positions left to ``attend(i, attn, q, k, v)``
    (the new token's rotated queries and keys, and values; returns ``[B, heads, 1, head_dim]``)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inner = model.model
    h = inner.embed_tokens(ids_B1)
    cos, sin = inner.rotary_emb(h, pos_B1)
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
        o = attend(i, attn, q, k, v).transpose(1, 2).contiguous().reshape(B, 1, -1)
        h = residual + attn.o_proj(o)
        residual = h
        h = residual + layer.mlp(layer.post_attention_layernorm(h))
    h = inner.norm(h)
    return model.lm_head(h[:, -1, :])


def fast_step(model: Any) -> Callable[..., torch.Tensor] | None:
    """:func:`llama_step` bound to ``model`` (a LoRA wrapper's base model, whose adapted layers carry
    the adapters; under the model's own autocast) when it supports it, else None."""
    if not supports_llama_step(model):
        return None
    found = _llama_inside(model)
    assert found is not None
    inner, autocast = found
    if autocast is None:
        return lambda ids_B1, pos_B1, mask_BW, cache: llama_step(inner, ids_B1, pos_B1, mask_BW, cache)
    device = next(inner.parameters()).device.type

    def step(ids_B1: torch.Tensor, pos_B1: torch.Tensor, mask_BW: torch.Tensor, cache: Any) -> torch.Tensor:
        with torch.autocast(device_type=device, dtype=autocast):
            return llama_step(inner, ids_B1, pos_B1, mask_BW, cache)

    return step


# ---------------------------------------------------------------------------------- static cache
def static_width(n: int) -> int:
    """The static cache's width for a decode of ``n`` positions (prompt + new tokens)."""
    return -(-n // STATIC_ROUND) * STATIC_ROUND


@torch.no_grad()
def static_llama_step(
    model: Any,
    ids_B1: torch.Tensor,
    pos_B1: torch.Tensor,
    mask_BW: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    at_1: torch.Tensor,
) -> torch.Tensor:
    """:func:`llama_step` over static buffers: ``keys[i]``/``values[i]`` (``[B, kv_heads, W, head_dim]``)
    get the new token's keys and values at index ``at_1`` (a one-element long tensor), and attention
    runs over all ``W`` positions with ``mask_BW`` (``[B, W]``, nonzero = attend: the prompt's tokens,
    those generated so far and the new one). Every call has the same shapes."""
    mask = mask_BW.bool()[:, None, None, :]

    def attend(i: int, attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys[i].index_copy_(2, at_1, k.to(keys[i].dtype))
        values[i].index_copy_(2, at_1, v.to(values[i].dtype))
        kw: dict[str, Any] = {"enable_gqa": True} if attn.num_key_value_groups > 1 else {}
        return torch.nn.functional.scaled_dot_product_attention(
            q, keys[i], values[i], attn_mask=mask, dropout_p=0.0, scale=attn.scaling, is_causal=False, **kw
        )

    return _llama_layers(model, ids_B1, pos_B1, attend)


class StaticStep:
    """The token step of one decode over a static cache (module doc): ``step(ids_B1, pos_B1, mask_BW,
    index)`` with ``mask_BW`` of the static width and ``index`` the new token's position in it."""

    def __init__(self, fn: Callable[..., torch.Tensor], keys: list[torch.Tensor], values: list[torch.Tensor]):
        self.fn, self.keys, self.values = fn, keys, values
        self.width = keys[0].shape[2]
        self._at = torch.arange(self.width, device=keys[0].device)

    def __call__(
        self, ids_B1: torch.Tensor, pos_B1: torch.Tensor, mask_BW: torch.Tensor, index: int
    ) -> torch.Tensor:
        return self.fn(ids_B1, pos_B1, mask_BW, self.keys, self.values, self._at[index : index + 1])


_STATIC: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()
"""Per model (the ``LlamaForCausalLM`` that computes): its compiled step per (mode, backend) and its
cache buffers per shape, kept for the next decode."""

_KEEP_SHAPES = 4
"""Buffer sets kept per model (a run decodes a few shapes: rollouts, validation, continuations)."""


def static_step(
    model: Any, cache: Any, rows_B: torch.Tensor, width: int, options: DecodeOptions
) -> StaticStep | None:
    """A :class:`StaticStep` for ``model`` whose buffers hold the prefilled ``cache``'s rows ``rows_B``
    (row b = prefill row ``rows_B[b]``) in a width of ``width`` positions, or None when ``model`` is not
    one :func:`llama_step` supports or the cache is not a plain full-attention ``DynamicCache``."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if not options.compiled or not supports_llama_step(model):
        return None
    if not isinstance(cache, DynamicCache) or any(type(x) is not DynamicLayer for x in cache.layers):
        return None
    found = _llama_inside(model)
    assert found is not None
    inner, autocast = found
    state = _STATIC.setdefault(inner, {})
    layers: list[Any] = list(cache.layers)
    first: torch.Tensor = layers[0].keys
    B, n = len(rows_B), first.shape[2]
    shape = (B, first.shape[1], width, first.shape[3], first.dtype, first.device)
    bufs = state.pop(("bufs", shape), None)
    if bufs is None:
        bufs = (
            [first.new_zeros(shape[:4]) for _ in layers],
            [first.new_zeros(shape[:4]) for _ in layers],
        )
        for t in (*bufs[0], *bufs[1]):
            torch._dynamo.mark_static_address(t)  # a CUDA graph reads them where they are
    state[("bufs", shape)] = bufs  # most recently used last
    for key in [k for k in state if k[0] == "bufs"][:-_KEEP_SHAPES]:
        del state[key]
    keys, values = bufs
    for i, layer in enumerate(layers):
        keys[i][:, :, :n] = layer.keys[rows_B]
        values[i][:, :, :n] = layer.values[rows_B]
    fn = state.get(("fn", options.compile, options.backend))
    if fn is None:
        device = first.device.type

        def run(*args: Any) -> torch.Tensor:
            if autocast is None:
                return static_llama_step(inner, *args)
            with torch.autocast(device_type=device, dtype=autocast):
                return static_llama_step(inner, *args)

        fn = torch.compile(run, mode=options.compile, backend=options.backend, dynamic=False, fullgraph=False)
        state[("fn", options.compile, options.backend)] = fn
    return StaticStep(fn, keys, values)
