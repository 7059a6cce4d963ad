"""Settings of the reward stage: sandbox, judge, reward model, custom functions, domains, the agent and its breaker."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from stepcredit.config.checks import _check, check_bounds, check_choices
from stepcredit.config.judge_template import check_judge_template
from stepcredit.errors import ConfigError

# ---------------------------------------------------------------------------------------- reward
SANDBOX_NEEDS_URL: dict[str, bool] = {"local": False, "sandbox_fusion": True}
"""The values of ``reward.sandbox.backend`` -> whether it calls a service at ``reward.sandbox.url``."""

RewardModelChannel = Literal["outcome"]
"""Where a reward model's score goes (``reward.reward_model.channel``); ``outcome`` is the only one."""


@dataclass(frozen=True)
class SandboxConfig:
    """The code sandbox (data_source/ability ``code``): limits of one run of one test case."""

    timeout_s: float = 5.0
    """Wall-clock limit of one test case, counted from the program's start; the whole sandbox is killed."""
    cpu_s: int = 0
    """CPU-time limit of one test case: RLIMIT_CPU of each process, and the cap on the CPU seconds all the
    case's processes spend together (checked every 10 ms); 0 = ``ceil(timeout_s) + 1``."""
    memory_mb: int = 512
    """Memory of the program: the address-space limit (RLIMIT_AS) of each of its processes, and the cap on
    the anonymous resident memory they hold together (the sandbox's runner checks it every 10 ms)."""
    file_size_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    tmpfs_mb: int = 64
    """Size of the private in-memory working directory (the program's cwd and /tmp)."""
    max_files: int = 10_000
    """Files, directories and links the program may have in that directory at once (its inodes: each
    costs kernel memory that no other limit counts); one more is refused (ENOSPC)."""
    max_procs: int = 32
    """Processes and threads the program may run at once (RLIMIT_NPROC, counted inside its namespace)."""
    output_limit_kb: int = 1024
    """Cap on stdout and on stderr; a program that writes more is stopped (the case fails, the
    program's status is ``program_error``)."""
    concurrency: int = 2
    """Sandboxes that run at once in one process (with ``sandbox_fusion``: requests in flight at once)."""
    scoring: Literal["fraction", "all"] = "fraction"
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
        check_bounds(
            self,
            "reward.sandbox",
            above_0=("timeout_s",),
            at_least_0=("request_timeout_s", "retries", "cpu_s", "max_cases"),
            at_least_1=("max_procs", "max_files", "output_limit_kb", "concurrency"),
        )
        _check(self.backend in SANDBOX_NEEDS_URL, "reward.sandbox.backend", "local or sandbox_fusion")
        _check(
            not SANDBOX_NEEDS_URL[self.backend] or self.url.startswith(("http://", "https://")),
            "reward.sandbox.url",
            "an http(s):// URL of the service's /run_code endpoint (backend sandbox_fusion)",
        )
        _check(self.memory_mb >= 64, "reward.sandbox.memory_mb", "must be >= 64")
        _check(self.file_size_mb >= 1 and self.tmpfs_mb >= 1, "reward.sandbox.file_size_mb", "must be >= 1")
        check_choices(self, "reward.sandbox")


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
        check_bounds(
            self,
            "reward.judge",
            above_0=("max_score",),
            at_least_1=("concurrency",),
            at_least_0=("max_retries",),
        )
        _check(self.request_timeout_s > 0 and self.deadline_s > 0, "reward.judge.deadline_s", "must be > 0")
        check_judge_template(self.prompt_template)
        try:
            rx = re.compile(self.score_pattern)
        except re.error as e:
            raise ConfigError(f"config key reward.judge.score_pattern: not a regex ({e})") from None
        _check(rx.groups >= 1, "reward.judge.score_pattern", "needs a group (the score)")


@dataclass(frozen=True)
class RewardModelConfig:
    """A Hugging Face reward model (per-row ``reward_model.style: model``)."""

    path: str = ""
    """Model directory (AutoModelForSequenceClassification or AutoModelForTokenClassification, one label)."""
    kind: Literal["auto", "sequence", "token"] = "auto"
    """``sequence``, ``token`` or ``auto`` (from the model's architecture name)."""
    channel: RewardModelChannel = "outcome"
    """``outcome`` (the score at the last valid token) is the only channel: a token model's per-token
    scores are on its own tokenizer and nothing maps them onto the policy's tokens; step credit comes
    from ``process.*`` (values from the policy itself)."""
    batch_size: int = 8
    """Responses per forward pass."""
    max_length: int = 1024
    """Longest prompt + response in tokens (the prompt is cut from the left)."""
    device: str = "cpu"
    """Device of the reward model (``cpu``, ``cuda``, ``cuda:1``)."""
    worker: Literal["inline", "process"] = "inline"
    """``inline`` (in the calling process) or ``process`` (its own worker process, off the policy's device)."""
    threads: int = 1
    """torch threads of the worker process."""

    def __post_init__(self) -> None:
        _check(
            self.channel in get_args(RewardModelChannel),
            "reward.reward_model.channel",
            "outcome (per-token reward-model scores are not mapped onto the policy's tokens; use process.*)",
        )
        check_choices(self, "reward.reward_model")  # kind, worker
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
    trl_format: Literal["standard", "conversational"] = "standard"
    """``style=trl``: ``standard`` (prompts and completions are strings) or ``conversational`` (chat messages)."""

    def __post_init__(self) -> None:
        check_choices(self, "reward.custom")


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
    """Ray cluster to connect to; empty = the one this process already joined, or a new local one of its
    own (never another process's cluster found on the machine)."""
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
    prestart: bool = True
    """Training starts the backend's workers in the background (the process pool's import math-verify,
    ~2-3 s of CPU each) instead of at the first sample the in-process fast path cannot decide, which
    would wait for them mid-run. False: start on first use (a run the fast path decides whole never
    starts them)."""
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
        check_bounds(
            self,
            "reward.agent",
            at_least_0=(
                "max_concurrency",
                "retries",
                "retry_backoff_s",
                "resubmits",
                "batch_size",
                "ray_num_cpus",
            ),
            at_least_1=("max_in_flight", "ray_local_cpus", "max_chunk", "ray_scorer_concurrency"),
            above_0=("deadline_s", "ray_startup_timeout_s"),
        )
        _check(self.timeout_s >= 0, "reward.agent.timeout_s", "must be >= 0 (0 = reward.timeout_s)")
        _check(self.chunk_s >= 0, "reward.agent.chunk_s", "must be >= 0 (0 = one sample per request)")
        for key, res in [("ray_resources", self.ray_resources)] + [
            (f"ray_scorers.{k}", v) for k, v in self.ray_scorers.items()
        ]:
            _check(all(float(v) >= 0 for v in res.values()), f"reward.agent.{key}", "amounts must be >= 0")


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
        check_bounds(self, "reward.breaker", at_least_1=("window_steps", "min_samples"))
        _check(0.0 <= self.max_failure_share < 1.0, "reward.breaker.max_failure_share", "must be in [0, 1)")


@dataclass(frozen=True)
class FailurePolicy:
    """What a failed reward (timeout, error, sandbox error) does to its response and its group."""

    scored: bool
    """The failure gets ``reward.failure_score`` and counts (else it is masked: score 0, not valid)."""
    drops_group: bool
    """Every response of the failure's group is dropped from the step."""


FAILURE_POLICIES: dict[str, FailurePolicy] = {
    "mask": FailurePolicy(scored=False, drops_group=False),
    "score": FailurePolicy(scored=True, drops_group=False),
    "drop_group": FailurePolicy(scored=False, drops_group=True),
}
"""The values of ``reward.failure_policy`` (and of its per-source overrides)."""


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
            self.failure_policy in FAILURE_POLICIES,
            "reward.failure_policy",
            "mask, score or drop_group",
        )
        for src, pol in self.failure_policy_by_source.items():
            _check(
                pol in FAILURE_POLICIES,
                f"reward.failure_policy_by_source.{src}",
                "mask, score or drop_group",
            )
        for tag, dom in self.tag_domains.items():
            _check(
                dom in self.domains,
                f"reward.tag_domains.{tag}",
                f"domain {dom!r} is not in reward.domains ({', '.join(self.domains) or 'none'})",
            )
        check_bounds(self, "reward", above_0=("timeout_s",), at_least_1=("workers",))
