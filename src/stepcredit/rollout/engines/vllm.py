"""The ``vllm`` engine: an in-process ``vllm.LLM`` colocated with the trainer.

Built once from the policy as it is at set-up (saved to a temporary Hugging Face directory, which
vLLM loads like any saved model); from then on it never reads a file: before it generates, it checks
that it holds the trainer's current weights (:func:`~stepcredit.rollout.engines.fingerprint`: any
in-place write to a parameter, an optimiser step, SFT or a resume, changes it) and if not, pushes the
state dict through the worker's in-place ``reload_weights`` (the model's ``load_weights``, as TRL's
colocated mode and verl's weight sync call it, then vLLM's re-processing of each layer into its kernel
format), and drops the prefix cache, whose keys and values the old weights computed.
:meth:`VLLMEngine.push` takes any state dict (merged LoRA weights, say) under the Hugging Face names.

What the trainer gets from it: token ids and, per sampled token, vLLM's log-probability under
softmax(logits / temperature) (``logprobs_mode=processed_logprobs``, ``logprobs=0``); the trainer's own
log-probs of the same tokens differ by kernels and precision, which the loss corrects
(``loss.tis_cap``, truncated importance sampling).

Prompts go in as token ids and come out as token ids (``skip_tokenizer_init``): our tokenizer decodes,
so the two engines cannot disagree about text; stop strings are cut by the same function as in ``hf``.
Prefix caching is on: a tree's continuations and a group's samples share their prompts' blocks.
On a GPU, sleep mode (level 1) moves the weights off the GPU and drops the KV cache for the update
(:meth:`sleep`); the next generation wakes it up first.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from stepcredit.errors import ConfigError
from stepcredit.rollout.engines.api import (
    Budgets,
    Completion,
    Contexts,
    Prefixes,
    SamplingSpec,
    cut_at_stop,
    fingerprint,
)

if TYPE_CHECKING:
    from stepcredit.config import Config


def _env_defaults(kv_cache_gib: int) -> None:
    # in-process engine core (else vLLM spawns one and the script needs a __main__ guard); a small CPU
    # KV cache; no thread pinning (the trainer shares the process and its cores)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


_CPU_BATCH_TOKENS = 1 << 17
"""Tokens one CPU scheduler step may take (vLLM's default, 4,096, splits a 48-prompt batch)."""


def _check_cpu_head_size(config: Any) -> None:
    """vLLM's CPU attention kernels exist for a fixed set of head sizes: fail at start-up, not at the
    first generation."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise ConfigError(
            f"config key rollout.engine: vllm's CPU attention supports head sizes {', '.join(map(str, sizes))}; "
            f"the policy's is {head} (hidden_size {config.hidden_size} / {config.num_attention_heads} heads: "
            "for the tiny model set model.tiny.num_heads or hidden_size)"
        )


class VLLMEngine:
    """A vLLM copy of the policy that follows the trainer's weights."""

    external = True

    def __init__(
        self,
        model: Any,
        *,
        dtype: str = "float32",
        seed: int = 0,
        gpu_memory_utilization: float = 0.3,
        kv_cache_gib: int = 1,
        max_model_len: int = 0,
        sleep_mode: bool = True,
    ) -> None:
        _env_defaults(kv_cache_gib)
        from vllm import LLM

        self.device = next(model.parameters()).device
        self.sleeps = sleep_mode and self.device.type == "cuda"
        self.asleep = False
        self.pushes = 0
        """Weight pushes so far (tests and metrics read it)."""
        arch = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
        if self.device.type == "cpu":
            _check_cpu_head_size(model.config)
        with tempfile.TemporaryDirectory(prefix="stepcredit-vllm-") as d:
            model.save_pretrained(d)  # the weights as they are now: no file outlives the engine's start
            try:
                self.llm = LLM(
                    model=d,
                    skip_tokenizer_init=True,
                    dtype=dtype,
                    seed=seed,
                    enforce_eager=True,  # no CUDA graphs: weights change every step
                    enable_prefix_caching=True,
                    gpu_memory_utilization=gpu_memory_utilization,
                    enable_sleep_mode=self.sleeps,
                    logprobs_mode="processed_logprobs",
                    max_logprobs=1,
                    **({"max_model_len": max_model_len} if max_model_len else {}),
                    # vLLM's CPU sampler cannot resume a seeded request's generator at an offset, which a
                    # prompt split across scheduler steps (chunked prefill) needs: a budget that takes a
                    # whole batch's prompts in one step keeps every prompt in one piece
                    **({"max_num_batched_tokens": _CPU_BATCH_TOKENS} if self.device.type == "cpu" else {}),
                )
            except (ValueError, RuntimeError, NotImplementedError) as e:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise ConfigError(
                    f"config key rollout.engine: vllm cannot load the policy ({arch}) from its saved directory: {first}"
                ) from None
        self.synced: tuple[int, ...] | None = fingerprint(model)
        self.weights = model.state_dict
        """What :meth:`sync` pushes: the policy's state dict under Hugging Face names (replace it with a
        function returning merged LoRA weights to serve an adapter-wrapped policy)."""

    # ---------------------------------------------------------------------------------- weights
    def push(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load ``state`` (Hugging Face parameter names) into the engine's model and forget the prefix
        cache (its keys and values are the old weights')."""
        self._wake()
        items = [(k, v.detach()) for k, v in state.items()]
        # the worker's in-place reload: the model's load_weights plus vLLM's re-processing of each
        # layer into its kernel format (a bare load_weights fails once the CPU kernels repacked them)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})
        self.llm.reset_prefix_cache()
        self.pushes += 1

    def sync(self, model: Any) -> None:
        """Push ``model``'s weights unless the engine already holds them."""
        self._wake()
        now = fingerprint(model)
        if now != self.synced:
            self.push(self.weights())
            self.synced = now

    def feed(self, weights: Callable[[], Mapping[str, torch.Tensor]]) -> None:
        """Push ``weights()`` from the next :meth:`sync` on (e.g. LoRA adapters merged into the base)."""
        self.weights = weights
        self.synced = None  # the served weights change now, whatever the fingerprint says

    def sleep(self) -> None:
        """On a GPU: weights to host memory, KV cache dropped, until the next generation. Else a no-op."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        self.llm = None  # type: ignore[assignment]

    # --------------------------------------------------------------------------------- sampling
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
        # prefixes: never given (this engine keeps no Completion.kv); vLLM caches shared prefixes itself
        if spec.entropy:
            raise ValueError("the vllm engine does not report token entropies (rollout.tree.branch_at)")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.sync(model)
        # unseeded calls draw their seed from torch's global stream, which checkpoints save and restore:
        # a resumed run samples what the uninterrupted one did (vLLM's own generator is not saved)
        seed = int(torch.randint(0, 2**31 - 1, (1,))) if spec.seed is None else spec.seed
        params = [
            SamplingParams(
                n=spec.n,
                temperature=spec.temperature,
                top_p=spec.top_p,
                max_tokens=min(budgets[i], spec.max_tokens) if budgets else spec.max_tokens,
                seed=(spec.row_seeds[i] if spec.row_seeds else seed + i) % 2**31,
                stop_token_ids=[tok.eos_token_id],
                logprobs=0 if spec.logprobs else None,
                detokenize=False,
            )
            for i in range(len(contexts))
        ]
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(c)) for c in contexts], params, use_tqdm=False
        )
        result = []
        for out in outs:
            for o in out.outputs:
                ids = list(o.token_ids)
                if tok.eos_token_id in ids:
                    ids = ids[: ids.index(tok.eos_token_id) + 1]
                ids = ids[: cut_at_stop(ids, tok, spec.stop)]
                logp = [next(iter(lp.values())).logprob for lp in o.logprobs or []][: len(ids)]
                # vLLM: the sampled token's log-prob; -inf only where top-p removed it, which it cannot
                result.append(Completion(ids, [float(x) for x in logp] if spec.logprobs else []))
        return result


def build_vllm(cfg: Config, model: Any, tok: Any) -> VLLMEngine:
    v = cfg.rollout.vllm
    return VLLMEngine(
        model,
        dtype=cfg.model.dtype,
        seed=cfg.trainer.seed,
        gpu_memory_utilization=v.gpu_memory_utilization,
        kv_cache_gib=v.cpu_kv_cache_gib,
        max_model_len=v.max_model_len,
        sleep_mode=v.sleep_mode,
    )
