"""The rollout-mode extension point: one request object (:class:`RolloutRequest`) that every mode takes,
the registry of modes (:data:`ROLLOUT_MODES`) and the start-up check of the rollout settings.

A mode is one registered function ``fn(model, tok, request) -> (batch, counters)``; a new capability of
the call (a new input every mode may read) is one field of the request, not a parameter written in every
mode. The built-in modes (``flat``, ``tree``, ``tools``, ``tools_tree``) are registered by
:mod:`stepcredit.rollout.builtin`, which ``import stepcredit.rollout`` runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from stepcredit.config import RolloutConfig
from stepcredit.errors import ConfigError
from stepcredit.registry import Registry
from stepcredit.rollout.batching import generation_spec
from stepcredit.rollout.engines import ENGINES, GenerationSpec, installed
from stepcredit.rollout.tool_context import ToolContext
from stepcredit.rollout.tree import BRANCH_RULES, Boundaries
from stepcredit.types import Batch, Sample

if TYPE_CHECKING:
    from stepcredit.config import Config


@dataclass(frozen=True)
class RolloutRequest:
    """What a rollout mode is asked for: ``cfg.n`` responses to each of ``samples``."""

    samples: list[Sample]
    """The prompts (rows) of this batch."""
    cfg: RolloutConfig
    """The run's ``rollout`` settings (n, lengths, temperature, the mode's own sub-tree)."""
    boundaries: Boundaries
    """Episode ends of a response (what tree modes branch at)."""
    group_offset: int = 0
    """Responses to ``samples[i]`` get group id ``group_offset + i``."""
    policy_version: int = 0
    """The policy's clock, stamped on the batch."""
    with_logprobs: bool = True
    """Compute the behaviour log-probs (False: ``behaviour_logp_BT`` is None)."""
    keep_cache: bool = False
    """Keep the behaviour pass's KV cache in ``batch.kv_cache`` for the process stage."""
    tools: ToolContext | None = None
    """The run's tools and where their calls run (modes that call tools; None: a mode that calls
    tools runs them in this process from ``cfg.tools``)."""
    temperature: float | None = None
    """Sampling temperature in place of ``cfg.temperature`` (0: greedy, as validation samples)."""

    @property
    def sampling_temperature(self) -> float:
        return self.cfg.temperature if self.temperature is None else self.temperature

    def generation(self) -> GenerationSpec:
        """The batch generation this request asks for (``rollout.*`` with this request's group offset,
        policy version, log-prob pass and cache), as the engines and ``finish_batch`` read it."""
        return generation_spec(
            self.cfg,
            group_offset=self.group_offset,
            policy_version=self.policy_version,
            with_logprobs=self.with_logprobs,
            keep_cache=self.keep_cache,
        )


class RolloutMode(Protocol):
    def __call__(self, model: Any, tok: Any, request: RolloutRequest) -> tuple[Batch, dict[str, float]]: ...


@dataclass(frozen=True)
class RolloutModeSpec:
    """A registered way of sampling a prompt's group, and what later stages must know about it."""

    fn: RolloutMode
    """Returns the batch (``rollout.n`` responses per prompt, each prompt's contiguous, one group per
    prompt) and the rollout's counters (sums: ``rollout/responses``, ``rollout/generated_tokens``...)."""
    shares_prefixes: bool
    """The group's responses share prefixes and the batch carries ``tree_ends`` / ``tree_nodes``, so the
    mean outcome below a node values its prefix (what ``from_outcomes`` value estimators need)."""
    check: Callable[[Config], None] | None = None
    """The mode's own start-up check of its settings (raises ConfigError), run by :func:`check_config`."""
    uses_tools: bool = False
    """Its responses call ``rollout.tools`` (the caller hands it a :class:`ToolContext`; validation,
    SFT and the process stage's continuations then use the tools too)."""


ROLLOUT_MODES: Registry[RolloutModeSpec] = Registry("rollout mode")


def check_config(cfg: Config) -> None:
    """Start-up checks of the rollout settings the config tree cannot see: a known mode and engine,
    the engine installed, and able to do what the mode asks of it (raises ConfigError)."""
    mode = ROLLOUT_MODES.get(cfg.rollout.mode)  # an unknown name: one line with the valid ones
    check_decode_switches(cfg)
    engine = installed(cfg.rollout.engine)
    if mode.check is not None:
        mode.check(cfg)
    rule = BRANCH_RULES.get(cfg.rollout.tree.branch_at)
    if mode.shares_prefixes and rule.needs_entropy and not engine.returns_entropy:
        raise ConfigError(
            f"config key rollout.tree.branch_at: {cfg.rollout.tree.branch_at} reads each token's entropy, "
            f"which rollout.engine={cfg.rollout.engine} does not report (use branch_at=episode or engine=hf)"
        )


def check_decode_switches(cfg: Config) -> None:
    """The decode loop's switches (``rollout.decode_compile``, ``model.lora.merge_for_generation``)
    asked of an engine that does not run that loop: one line, before its package is looked for (the
    settings contradict each other whatever is installed)."""
    name = cfg.rollout.engine
    if ENGINES.get(name).runs_decode_loop:
        return
    if cfg.rollout.decode_compile != "off":
        raise ConfigError(
            f"config key rollout.decode_compile: {cfg.rollout.decode_compile} compiles stepcredit's decode "
            f"loop, which rollout.engine={name} does not run (set rollout.decode_compile=off or use engine=hf)"
        )
    if cfg.model.lora.rank > 0 and not cfg.model.lora.merge_for_generation:
        raise ConfigError(
            f"config key model.lora.merge_for_generation: rollout.engine={name} is fed the policy's weights "
            "with the adapters merged; false (adapters beside the weights) needs engine=hf"
        )
