"""Settings of credit assignment: process rewards, advantage estimation, outcome post-processing and the critic."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from stepcredit.config.checks import _check, check_bounds, check_choices

StepCostAs = Literal["token", "return", "outcome"]
"""Where ``process.step_cost`` is charged (``stepcredit.process.STEP_COST_FORMS``)."""

Placebo = Literal["none", "shuffle_within_response"]
"""How ``process.placebo`` moves the step credits (``stepcredit.process.PLACEBOS``)."""

CreditGroups = Literal["all", "all_equal", "mixed"]
"""Which groups' responses carry step credit (``process.credit_groups``)."""


# --------------------------------------------------------------------------------------- process
@dataclass(frozen=True)
class ProcessConfig:
    enabled: bool = False
    """Compute training-free process rewards (V(prefix) at episode ends) during rollout."""
    value_estimator: str = "forced_answer_logprob"
    """How V(prefix) is estimated (``stepcredit.process.VALUE_ESTIMATORS``): ``forced_answer_logprob`` (the
    policy's own log-prob of the gold answer), ``monte_carlo`` (VinePPO: mean verifier reward of sampled
    continuations), ``greedy_continuation`` (the verifier's score of one greedy continuation),
    ``greedy_bisect`` (those verdicts only where they change, found by bisection), ``tree``
    (a tree rollout's node values: mean outcome of the leaves below; needs ``rollout.mode=tree``),
    ``group_prefix`` (a flat group's values: mean outcome of the group's responses that begin with the
    prefix; no generation) or ``step_oracle`` (exact step values of ``arith``)."""
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
    last_episode: Literal["utility", "zero"] = "utility"
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
    mc_v0: Literal["group", "sample"] = "group"
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
    placebo: Placebo = "none"
    """A control for an experiment's process-credit arm: ``shuffle_within_response`` permutes each
    response's step credits among its own episodes (a seeded permutation, before the step cost), so the
    same numbers, sparsity and scale reach the same credit path on the wrong steps; what step location
    adds is then the arm minus its placebo. ``none``: the credits stay where they were earned."""
    placebo_seed: int = 0
    """Seed of the placebo's permutations (each response's own, from this seed, its group and its rank)."""
    credit_groups: CreditGroups = "all"
    """Which groups' responses get step credit: ``all``; ``all_equal``: only groups whose verified outcomes
    are all equal (all right or all wrong, where outcome GRPO has no signal); ``mixed``: only the others.
    "All equal" is read as GRPO reads it: the verdicts' scores (before length or step-cost shaping) of
    the responses that stay valid after outcome processing, equal within 1e-6. A response left out
    carries no step credit and pays no per-step cost (``step_cost_as=token`` or ``return``; with
    ``outcome`` every response pays), so an estimator that normalises the step term over the rows with
    steps (``grpo_vineppo``, ``grpo_process``, ``prime_rloo``) gives it the outcome advantage alone, and
    ``vineppo`` its RLOO outcome advantage; one that shifts the step term by a batch mean
    (``reinforce_pp``) is refused. It splits step credit's effect between the groups outcome GRPO
    cannot move and those it can; the values are still computed for every row."""

    @property
    def zero_last(self) -> bool:
        """The last episode pays no step credit (``last_episode=zero``): the outcome speaks for it."""
        return self.last_episode == "zero"

    @property
    def placebo_on(self) -> bool:
        """The step credits are moved by a placebo (``placebo`` is not ``none``)."""
        return self.placebo != "none"

    @property
    def v0_from_group(self) -> bool:
        """V_0 is the leave-one-out mean reward of the group's other responses (``mc_v0=group``)."""
        return self.mc_v0 == "group"

    def __post_init__(self) -> None:
        _check(
            len(self.markers) > 0 and all(m.strip() for m in self.markers),
            "process.markers",
            "a non-empty list of non-blank strings",
        )
        check_bounds(
            self,
            "process",
            at_least_1=(
                "min_episode_tokens",
                "max_tokens_per_forward",
                "mc_samples",
                "mc_max_new_tokens",
                "max_answer_chars",
            ),
            above_0=("mc_temperature",),
        )
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
        check_choices(self, "process")  # step_cost_as, last_episode, mc_v0, placebo
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
        check_bounds(self, "algorithm", above_0=("eps",), at_least_0=("process_weight",))


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
    criterion: Literal["std", "mean_bounds"] = "std"
    """``std``: drop groups whose valid scores are all equal; ``mean_bounds``: keep only groups with
    ``mean_low < mean score < mean_high``."""
    mean_low: float = 0.0
    """Lower bound (exclusive) of a kept group's mean score (``criterion=mean_bounds``)."""
    mean_high: float = 1.0
    """Upper bound (exclusive) of a kept group's mean score (``criterion=mean_bounds``)."""
    max_extra_batches: int = 0
    """Extra rollouts of ``rollout.prompts_per_step`` prompts drawn at most per step to refill the batch."""

    def __post_init__(self) -> None:
        check_choices(self, "postprocess.dynamic_sampling")
        _check(self.mean_low < self.mean_high, "postprocess.dynamic_sampling.mean_low", "must be < mean_high")
        check_bounds(self, "postprocess.dynamic_sampling", at_least_0=("max_extra_batches",))


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
        check_bounds(self, "critic", above_0=("lr",), at_least_0=("value_clip", "warmup", "grad_clip"))
