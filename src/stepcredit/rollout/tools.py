"""Multi-turn rollouts whose turns call tools (``rollout.mode=tools``).

Each turn is sampled by the run's engine (:func:`stepcredit.rollout.engines.engine_for`) for every
still-active response of the batch at once; a turn ends at the first complete tool call (the template's parser, ``rollout.tools.parser``, finds it; sampling is
causal, so cutting a sampled turn at the call is sampling with a stop string), the calls of the
whole turn run together (through the reward layer's kill-safe workers when the trainer hands the
mode its :class:`~stepcredit.reward.tools.ToolRunner`), and each result is appended as observation
tokens. A response ends with eos (its final answer), at the length budget (tool results count in
it), or at a call past ``rollout.tools.max_turns`` (not executed, counted as
``tools/turn_limit_reached``; the response has no eos, so it is marked truncated).

The batch marks the results' tokens in ``observation_BT``: they are attended to but left out of
``response_mask_BT``, so they are never trained on and carry no reward. Each tool call's last token
ends a turn, which the segmenter (:func:`stepcredit.process.segment.segment_episodes`) takes as an
episode end: turns are the process channel's steps.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from stepcredit.config import Config, RolloutConfig, ToolsConfig
from stepcredit.errors import ConfigError
from stepcredit.rollout import ROLLOUT_MODES, RolloutModeSpec
from stepcredit.rollout.batching import finish_batch, left_pad
from stepcredit.rollout.engines import GenerationSpec, SamplingSpec, engine_for
from stepcredit.rollout.tree import BRANCH_RULES, Boundaries, BranchContext, Leaf, leaf_segments
from stepcredit.tools import PARSERS, TOOLS, Observation, ToolCall, ToolParser, execute_call, schemas
from stepcredit.tools.templates import tool_turn_text, tool_turns
from stepcredit.types import Batch, Sample

ToolRunner = Callable[[Sequence[ToolCall], Sequence[Mapping[str, Any] | None]], list[Observation]]
"""(calls, each call's row ``tools_kwargs``) -> one observation per call."""


def run_in_process(offered: Sequence[str], max_chars: int) -> ToolRunner:
    """A runner that executes calls in this process (library use without a reward agent: no hard
    deadline for a tool that hangs; the trainer always runs tools through its agent)."""

    def run(calls: Sequence[ToolCall], kwargs: Sequence[Mapping[str, Any] | None]) -> list[Observation]:
        return [
            execute_call(c, offered=offered, tools_kwargs=kw, max_chars=max_chars)
            for c, kw in zip(calls, kwargs, strict=True)
        ]

    return run


@dataclass
class CountingRunner:
    """A runner that counts the calls it ran and the failed ones by kind (``stepcredit eval``'s tool
    counters; every executed call goes through the runner, so nothing is missed)."""

    run: ToolRunner
    calls: int = 0
    failed: dict[str, int] = field(default_factory=dict)

    def __call__(
        self, calls: Sequence[ToolCall], kwargs: Sequence[Mapping[str, Any] | None]
    ) -> list[Observation]:
        got = self.run(calls, kwargs)
        self.calls += len(got)
        for o in got:
            if o.error:
                self.failed[o.error] = self.failed.get(o.error, 0) + 1
        return got

    def counters(self, responses: int) -> dict[str, float]:
        """``tools/calls_per_response``, ``tools/failed_calls_per_response`` and ``tools/failed_<kind>``
        (sums), as the trainer logs them."""
        n = max(1, responses)
        return {
            "tools/calls_per_response": self.calls / n,
            "tools/failed_calls_per_response": sum(self.failed.values()) / n,
            **{f"tools/failed_{k}": float(v) for k, v in sorted(self.failed.items())},
        }


@dataclass
class ToolRow:
    """One multi-turn response as the turn loop (:func:`run_turns`) grows it: its own state, mutated
    by the loop only."""

    prompt: list[int]
    sample: Sample
    limit: int
    """Most response tokens (results included): the length budget."""
    ids: list[int] = field(default_factory=list)
    """Response tokens so far (the policy's and the results')."""
    obs: list[bool] = field(default_factory=list)
    """Per token of ``ids``: a result's token (never trained on)."""
    calls: int = 0
    """Calls executed so far (the turn limit counts them)."""
    pending: ToolCall | None = None
    """A call that ends ``ids`` and has not run yet: the loop runs it before sampling the next turn."""
    outcomes: list[str] = field(default_factory=list)
    """Per call run so far: its failure's kind, "" when the tool answered."""
    done: bool = False


def render_tool_prompts(tok: Any, samples: list[Sample], names: Sequence[str]) -> list[list[int]]:
    """Chat prompts with the offered tools' schemas where the template prints them (Hermes-style
    templates list them in the system turn; :func:`stepcredit.tools.templates.tool_turns` probes it);
    other templates get the plain prompt."""
    tools = schemas(names) if tool_turns(tok).schemas else None
    out = []
    for s in samples:
        text = tok.apply_chat_template(
            list(s.prompt), tools=tools, add_generation_prompt=True, tokenize=False
        )
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


_RENDER: dict[str, tuple[bool, bool]] = {
    "auto": (True, False),
    "template": (True, True),
    "convention": (False, False),
}
"""``rollout.tools.render`` -> (use the template's tool turn where it renders one, refuse a template
that cannot)."""


def check_tool_template(tok: Any, tools: ToolsConfig) -> bool:
    """Are results appended as the chat template's own tool turn? The start-up check of
    ``rollout.tools.render=template``: a ConfigError naming the key when ``tok``'s template cannot
    render a tool call and a tool message."""
    wanted, required = _RENDER[tools.render]
    turns = tool_turns(tok)
    if required and not turns.renders:
        raise ConfigError(
            f"config key rollout.tools.render: 'template' needs a chat template that renders tool calls "
            f"and tool messages, and the model's does not ({turns.why_not}); use render=auto or "
            "render=convention, or give the model a template with tools (stepcredit.tools.hermes_template)"
        )
    return wanted and turns.renders


def _cut_at(tok: Any, ids: list[int], end: int) -> int:
    """The fewest leading tokens of ``ids`` whose decoded text covers ``end`` characters."""
    lo, hi = 1, len(ids)
    while lo < hi:  # decoded length grows with the prefix: binary search
        mid = (lo + hi) // 2
        if len(tok.decode(ids[:mid], skip_special_tokens=True)) >= end:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _observation_ids(
    tok: Any, result: str, *, parser: ToolParser, tools: ToolsConfig, prompt: Sequence[Mapping[str, Any]]
) -> list[int]:
    """The tokens appended after a call for its ``result``: the chat template's own tool turn where it
    renders one (``rollout.tools.render``; :func:`stepcredit.tools.templates.tool_turn_text`: the
    template's end of the call's turn, the tool turn and the next assistant header), else the
    convention's text (``parser.observation``).

    A tool that prints the eos (or any special token's) string must not end the response or write the
    template's markup: special tokens are dropped from the convention's tokens, and special-token
    strings from the result before the template renders it. The template's own markup keeps its
    special tokens except the eos: a response ends at its first eos (the batch cuts it there), so where
    the template's end of turn is the eos (ChatML models: SmolLM2, Qwen) those tokens are left out."""
    if not check_tool_template(tok, tools):
        special = set(getattr(tok, "all_special_ids", []) or [])
        ids = tok(parser.observation(result), add_special_tokens=False)["input_ids"]
        return [i for i in ids if i not in special]
    for s in _special_strings(tok):
        result = result.replace(s, "")
    offered = schemas(tools.names) if tool_turns(tok).schemas else None
    # the call is not passed down here, so the tool message carries the first offered tool's name:
    # Hermes/ChatML tool turns do not print it (a template that does would show that name)
    text = tool_turn_text(tok, result, prompt=prompt, call=tools.names[0], tools=offered)
    return [i for i in tok(text, add_special_tokens=False)["input_ids"] if i != tok.eos_token_id]


def result_of(parser: ToolParser, block: str) -> str | None:
    """The result that ``block``, a result block in ``parser``'s convention text (what
    ``parser.observation`` writes), holds; None when ``block`` is not one."""
    marker = "\x00"  # no result holds it: the convention's text on either side of the result
    head, tail = parser.observation(marker).split(marker)
    if len(block) < len(head) + len(tail) or not (block.startswith(head) and block.endswith(tail)):
        return None
    return block[len(head) : len(block) - len(tail)]


def trace_observation_ids(
    tok: Any, block: str, *, tools: ToolsConfig, prompt: Sequence[Mapping[str, Any]]
) -> list[int]:
    """The tokens a tool rollout appends for the result that ``block`` (a trace's result block in
    ``tools.parser``'s convention text) holds, after a call to the conversation ``prompt``: the chat
    template's own tool turn where results are rendered by it (``rollout.tools.render``), else the
    convention's text, exactly as :func:`run_turns` appends them. A ValueError when ``block`` is not the
    convention's result text."""
    parser: ToolParser = PARSERS.get(tools.parser)
    result = result_of(parser, block)
    if result is None:
        raise ValueError(f"{block[:60]!r} is not a result block of the {tools.parser!r} convention")
    return _observation_ids(tok, result, parser=parser, tools=tools, prompt=prompt)


def _special_strings(tok: Any) -> list[str]:
    """Every special token's text: the named ones and the added tokens marked special (a tokenizer's
    turn markup, e.g. ``<|im_start|>``, is often only the latter), longest first."""
    found = set(getattr(tok, "all_special_tokens", []) or [])
    found.update(t.content for t in (getattr(tok, "added_tokens_decoder", {}) or {}).values() if t.special)
    return sorted((s for s in found if s), key=len, reverse=True)


def run_turns(
    model: Any,
    tok: Any,
    rows: Sequence[ToolRow],
    tools: ToolsConfig,
    run_tools: ToolRunner,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> dict[str, float]:
    """The turn loop of a tool rollout, from each row's state (an empty response, or a prefix of one
    with its results, perhaps ending at a ``pending`` call): run the pending calls of every row at once
    and append their results, then sample the next turn of every active row at once (cut at its first
    call), until every row ends: with eos, at its length budget ``limit`` (results count), or at a call
    past ``tools.max_turns`` (not run). The rows are grown in place; returns the loop's counters
    (``tools/turn_limit_reached``, ``rollout/generated_tokens``)."""
    tc = tools
    parser: ToolParser = PARSERS.get(tc.parser)
    offered = {n: TOOLS.get(n) for n in tc.names}
    counts = {"tools/turn_limit_reached": 0.0, "rollout/generated_tokens": 0.0}
    for r in rows:
        if r.pending is not None and r.calls >= tc.max_turns:
            # a call past the limit ends its response unexecuted, as when the loop found it
            counts["tools/turn_limit_reached"] += 1
            r.pending, r.done = None, True
        if len(r.ids) >= r.limit:
            r.pending, r.done = None, True  # no room for a result, nor for another turn
    while True:
        calls = [r for r in rows if r.pending is not None]
        if calls:
            results = run_tools(
                [r.pending for r in calls if r.pending is not None],
                [r.sample.extra_info.get("tools_kwargs") for r in calls],
            )
            for r, res in zip(calls, results, strict=True):
                r.calls += 1
                r.pending = None
                r.outcomes.append(res.error)
                obs = _observation_ids(tok, res.text, parser=parser, tools=tc, prompt=r.sample.prompt)
                obs = obs[: r.limit - len(r.ids)]
                r.ids += obs
                r.obs += [True] * len(obs)
                if len(r.ids) >= r.limit:
                    r.done = True
        active = [r for r in rows if not r.done]
        if not active:
            return counts
        budget = [r.limit - len(r.ids) for r in active]
        # the run's engine samples each turn (for every active response at once); a convention whose
        # calls end in a fixed string stops there, the others are cut at the call below
        spec = SamplingSpec(temperature=temperature, top_p=top_p, max_tokens=max(budget), stop=parser.stop)
        turns = engine_for(model).sample(model, tok, [r.prompt + r.ids for r in active], spec, budgets=budget)
        for r, done in zip(active, turns, strict=True):
            got = list(done.ids)
            text = tok.decode(got, skip_special_tokens=True)
            found = parser.find(text, offered)
            if found is not None:
                got = got[: _cut_at(tok, got, found.end)]
            if found is not None and r.calls >= tc.max_turns:
                # the policy wanted another call past the limit: the response ends there, unexecuted
                counts["tools/turn_limit_reached"] += 1
                found = None
            if found is not None:
                r.pending = found.call
            else:
                r.done = True
            r.ids += got
            r.obs += [False] * len(got)
            counts["rollout/generated_tokens"] += len(got)
            if len(r.ids) >= r.limit:
                r.done = True  # out of budget (a call cut at the limit is not run: no room for its result)
                r.pending = None


def resume_row(
    tok: Any, prompt: list[int], sample: Sample, ids: Sequence[int], tools: ToolsConfig, *, limit: int
) -> ToolRow:
    """A row of the turn loop that goes on from ``ids``, a prefix of a tool rollout's response (its
    results kept as they are): the calls so far are its results (``tools.parser``'s result blocks), and
    a call that ends the prefix's last turn (an episode end: the last token of a call, before its
    result) is ``pending``, so :func:`run_turns` runs it and appends its result before the next turn.
    ``obs`` marks the prefix's tokens False: a continuation is scored, never trained on."""
    parser: ToolParser = PARSERS.get(tools.parser)
    text = tok.decode(list(ids), skip_special_tokens=True)
    spans = parser.observation_spans(text)
    last = text[spans[-1][1] :] if spans else text  # the prefix's last turn
    found = parser.find(last, {n: TOOLS.get(n) for n in tools.names})
    # a call followed by more of the policy's text was not cut at (a trace, not a rollout): no call runs
    pending = found.call if found is not None and not last[found.end :].strip() else None
    return ToolRow(list(prompt), sample, limit, list(ids), [False] * len(ids), len(spans), pending)


def tool_batch(
    model: Any,
    tok: Any,
    samples: list[Sample],
    rows: Sequence[ToolRow],
    *,
    n: int,
    temperature: float,
    group_offset: int,
    policy_version: int,
    with_logprobs: bool,
    keep_cache: bool,
) -> Batch:
    """The batch of finished rows (``n`` per sample, each sample's contiguous): results' tokens marked
    in ``observation_BT``, out of ``response_mask_BT``, with behaviour log-prob 0."""
    dev = next(model.parameters()).device
    T = max(1, max(len(r.ids) for r in rows))
    resp = torch.full((len(rows), T), tok.pad_token_id, dtype=torch.long)
    obs_BT = torch.zeros((len(rows), T), dtype=torch.bool)
    for b, r in enumerate(rows):
        resp[b, : len(r.ids)] = torch.tensor(r.ids, dtype=torch.long)
        obs_BT[b, : len(r.obs)] = torch.tensor(r.obs, dtype=torch.bool)
    p_ids, p_mask = left_pad([r.prompt for r in rows], tok.pad_token_id)
    batch = finish_batch(
        model,
        tok,
        samples,
        GenerationSpec(
            n=n,
            temperature=temperature,
            group_offset=group_offset,
            with_logprobs=with_logprobs,
            policy_version=policy_version,
            keep_cache=keep_cache,
        ),
        p_ids=p_ids.to(dev),
        p_mask=p_mask.to(dev),
        resp=resp.to(dev),
    )
    Tb = batch.response_ids_BT.shape[1]
    obs_BT = obs_BT[:, :Tb] & batch.response_mask_BT  # finish_batch cut at eos: nothing after it counts
    logp = batch.behaviour_logp_BT
    return replace(
        batch,
        response_mask_BT=batch.response_mask_BT & ~obs_BT,
        observation_BT=obs_BT,
        behaviour_logp_BT=None if logp is None else torch.where(obs_BT, 0.0, logp),
    )


def default_runner(tools: ToolsConfig, run_tools: ToolRunner | None) -> ToolRunner:
    """``run_tools``, or (library use without a reward agent) a runner in this process; every name
    and the parser must be registered (one line listing the registered ones otherwise)."""
    for name in tools.names:
        TOOLS.get(name)
    PARSERS.get(tools.parser)
    return run_tools or run_in_process(tools.names, tools.max_result_chars)


@torch.no_grad()
def tool_generate(
    model: Any,
    tok: Any,
    samples: list[Sample],
    tools: ToolsConfig,
    *,
    n: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    group_offset: int = 0,
    policy_version: int = 0,
    with_logprobs: bool = True,
    keep_cache: bool = False,
    run_tools: ToolRunner | None = None,
) -> tuple[Batch, dict[str, float]]:
    """``n`` multi-turn responses per prompt (greedy when ``temperature == 0``), and the rollout's counters: responses, tokens
    (observations included in ``rollout/response_tokens``, not in ``rollout/generated_tokens``), tool
    calls, turns, failed calls by kind and turn limits reached."""
    tc = tools
    runner = default_runner(tc, run_tools)
    was_training = model.training
    model.eval()
    prompts = render_tool_prompts(tok, samples, tc.names)
    rows = [ToolRow(prompts[i // n], samples[i // n], max_new_tokens) for i in range(len(samples) * n)]
    counts = run_turns(model, tok, rows, tc, runner, temperature=temperature, top_p=top_p)
    batch = tool_batch(
        model,
        tok,
        samples,
        rows,
        n=n,
        temperature=temperature,
        group_offset=group_offset,
        policy_version=policy_version,
        with_logprobs=with_logprobs,
        keep_cache=keep_cache,
    )
    if was_training:
        model.train()
    counts.update(tool_counters(rows))
    counts["rollout/responses"] = float(len(rows))
    counts["rollout/response_tokens"] = float(sum(len(r.ids) for r in rows))
    return batch, counts


def tool_counters(rows: Sequence[ToolRow]) -> dict[str, float]:
    """Sums over the responses: calls, turns (calls + the final turn), failed calls and each failure kind."""
    out = {
        "tools/calls": float(sum(r.calls for r in rows)),
        "tools/turns": float(sum(r.calls + 1 for r in rows)),
        "tools/failed_calls": float(sum(1 for r in rows for kind in r.outcomes if kind)),
    }
    for r in rows:
        for kind in filter(None, r.outcomes):
            out[f"tools/failed_{kind}"] = out.get(f"tools/failed_{kind}", 0.0) + 1.0
    return out


@dataclass(frozen=True)
class ToolRollout:
    """The registered mode: :func:`tool_generate` with the run's tool runner (``with_runner``; without
    one, calls run in this process)."""

    run_tools: ToolRunner | None = None

    def with_runner(self, runner: ToolRunner) -> ToolRollout:
        return replace(self, run_tools=runner)  # the same mode (a subclass stays itself)

    def __call__(
        self,
        model: Any,
        tok: Any,
        samples: list[Sample],
        cfg: RolloutConfig,
        *,
        group_offset: int,
        policy_version: int,
        with_logprobs: bool,
        keep_cache: bool,
        boundaries: Callable[[list[int]], list[int]],
    ) -> tuple[Batch, dict[str, float]]:
        """``rollout.n`` multi-turn responses per prompt (:func:`tool_generate` with ``rollout``'s settings)."""
        return tool_generate(
            model,
            tok,
            samples,
            cfg.tools,
            n=cfg.n,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            group_offset=group_offset,
            policy_version=policy_version,
            with_logprobs=with_logprobs,
            keep_cache=keep_cache,
            run_tools=self.run_tools,
        )


def check_tools(cfg: Config) -> None:
    """Start-up check of ``rollout.tools``: import ``modules`` (a user's tools register themselves),
    then every name and the parser must be registered (a ConfigError naming the key otherwise)."""
    tc = cfg.rollout.tools
    for spec in tc.modules:
        try:
            if spec.endswith(".py"):
                path = os.path.abspath(os.path.expanduser(spec))
                found = importlib.util.spec_from_file_location(
                    f"stepcredit_user_tools_{len(sys.modules)}", path
                )
                if found is None or found.loader is None:
                    raise ImportError(f"{path} is not a Python file")
                module = importlib.util.module_from_spec(found)
                sys.modules[found.name] = module
                found.loader.exec_module(module)
            else:
                importlib.import_module(spec)
        except Exception as e:  # a missing file, a syntax error, a failing import: one line naming the key
            raise ConfigError(f"config key rollout.tools.modules: {spec}: {type(e).__name__}: {e}") from None
    for key, registry, names in (("names", TOOLS, tc.names), ("parser", PARSERS, (tc.parser,))):
        for name in names:
            if name not in registry:
                raise ConfigError(
                    f"config key rollout.tools.{key}: unknown {registry.kind} {name!r} "
                    f"(valid: {', '.join(registry.names())})"
                )


def branch_row(tok: Any, row: ToolRow, point: int, tools: ToolsConfig) -> ToolRow:
    """A new row that goes on from ``row``'s first ``point`` tokens (a branch of a tool tree): the
    results, their marks and the outcomes of the calls in that prefix are kept, and a call that ends
    there is pending (the branch runs it again, as a continuation does)."""
    child = resume_row(tok, row.prompt, row.sample, row.ids[:point], tools, limit=row.limit)
    child.obs = row.obs[:point]
    # the calls so far are the prefix's results (each one run of result tokens)
    child.calls = sum(1 for t in range(point) if child.obs[t] and (t == 0 or not child.obs[t - 1]))
    child.outcomes = row.outcomes[: child.calls]
    return child


@torch.no_grad()
def tool_tree_generate(
    model: Any,
    tok: Any,
    samples: list[Sample],
    cfg: RolloutConfig,
    *,
    boundaries: Boundaries,
    group_offset: int = 0,
    policy_version: int = 0,
    with_logprobs: bool = True,
    keep_cache: bool = False,
    run_tools: ToolRunner | None = None,
) -> tuple[Batch, dict[str, float]]:
    """A tree of tool rollouts per prompt (``rollout.mode=tools_tree``): :mod:`stepcredit.rollout.tree`'s
    construction (``rollout.n`` leaves, ``rollout.tree.branching``, the ``branch_at`` rule) with every
    response a tool rollout (:func:`run_turns`). The segmenter's episode ends of a tool response are its
    calls' ends, so ``branch_at=episode`` branches at turn boundaries: a branch goes on from the prefix
    that ends at a call, runs that call again and samples the turns after it, so the mean outcome of the
    leaves below a node is a Monte Carlo value of the turn's prefix under the policy with the tools. The
    batch carries ``tree_ends`` / ``tree_nodes`` (what ``process.value_estimator=tree`` reads) and the
    results' marks; the counters count each response's calls (a shared prefix's in every leaf) and the
    tokens generated (a shared prefix's once)."""
    tc = cfg.tools
    runner = default_runner(tc, run_tools)
    rule = BRANCH_RULES.get(cfg.tree.branch_at)
    branching = cfg.branching()
    was_training = model.training
    model.eval()
    prompts = render_tool_prompts(tok, samples, tc.names)
    counts: dict[str, float] = {}

    def grow(rows: list[ToolRow]) -> None:
        got = run_turns(model, tok, rows, tc, runner, temperature=cfg.temperature, top_p=cfg.top_p)
        for key, v in got.items():
            counts[key] = counts.get(key, 0.0) + v

    first = [
        ToolRow(prompts[p], samples[p], cfg.max_new_tokens)
        for p in range(len(samples))
        for _ in range(branching[0])
    ]
    grow(first)
    trees: list[list[tuple[Leaf, ToolRow]]] = [[] for _ in samples]
    for j, row in enumerate(first):
        p = j // branching[0]
        trees[p].append((Leaf(p, row.ids, [], [(0, 0)]), row))
    level1 = [leaf for tree in trees for leaf, _ in tree]
    ctx = BranchContext(
        boundaries=boundaries,
        mean_ends=sum(len(boundaries(leaf.ids)) for leaf in level1) / max(1, len(level1)),
        entropy_threshold=0.0,  # the check refuses rules that read entropies: tool turns record none
    )
    next_node = [1] * len(samples)  # node 0 is each tree's root
    for b in branching[1:]:
        if b == 1:  # one child per node: nothing branches, no node to value
            continue
        jobs: list[tuple[Leaf, ToolRow, int]] = []
        for tree in trees:
            for leaf, row in list(tree):
                point = rule.fn(leaf, ctx)
                leaf.path.append((next_node[leaf.prompt], point))
                next_node[leaf.prompt] += 1
                jobs += [(leaf, row, point)] * (b - 1)
        children = [branch_row(tok, row, point, tc) for _, row, point in jobs]
        grow(children)
        for (parent, _, _), child in zip(jobs, children, strict=True):
            trees[parent.prompt].append((Leaf(parent.prompt, child.ids, [], list(parent.path)), child))
    pairs = [pair for tree in trees for pair in tree]
    rows = [row for _, row in pairs]
    batch = tool_batch(
        model,
        tok,
        samples,
        rows,
        n=cfg.n,
        temperature=cfg.temperature,
        group_offset=group_offset,
        policy_version=policy_version,
        with_logprobs=with_logprobs,
        keep_cache=keep_cache,
    )
    if was_training:
        model.train()
    segments = [leaf_segments(leaf) for leaf, _ in pairs]
    batch.tree_ends = [e for e, _ in segments]
    batch.tree_nodes = [n for _, n in segments]
    counts.update(tool_counters(rows))
    counts["rollout/responses"] = float(len(rows))
    counts["rollout/response_tokens"] = float(sum(len(r.ids) for r in rows))
    counts["tree/branch_points"] = float(sum(len(n) - 1 for n in batch.tree_nodes))
    counts["tree/depth"] = float(len(branching) * len(rows))
    return batch, counts


@dataclass(frozen=True)
class ToolTreeRollout(ToolRollout):
    """The registered mode ``tools_tree``: :func:`tool_tree_generate` with the run's tool runner."""

    def __call__(
        self,
        model: Any,
        tok: Any,
        samples: list[Sample],
        cfg: RolloutConfig,
        *,
        group_offset: int,
        policy_version: int,
        with_logprobs: bool,
        keep_cache: bool,
        boundaries: Callable[[list[int]], list[int]],
    ) -> tuple[Batch, dict[str, float]]:
        """One tree of ``rollout.n`` tool-rollout leaves per prompt (:func:`tool_tree_generate`)."""
        return tool_tree_generate(
            model,
            tok,
            samples,
            cfg,
            boundaries=boundaries,
            group_offset=group_offset,
            policy_version=policy_version,
            with_logprobs=with_logprobs,
            keep_cache=keep_cache,
            run_tools=self.run_tools,
        )


def check_tool_tree(cfg: Config) -> None:
    """:func:`check_tools`, and a branch rule that reads the prefix only (tool turns record no entropies)."""
    check_tools(cfg)
    if BRANCH_RULES.get(cfg.rollout.tree.branch_at).needs_entropy:
        ok = ", ".join(n for n in BRANCH_RULES if not BRANCH_RULES.get(n).needs_entropy)
        raise ConfigError(
            f"config key rollout.tree.branch_at: rollout.mode=tools_tree records no token entropies, which "
            f"{cfg.rollout.tree.branch_at} reads; use {ok} (it branches at turn boundaries)"
        )


# registered here rather than in the package's __init__ (this module imports it); the trainer imports
# this module, and hands the mode the run's tool runner (``ToolRollout.with_runner``)
ROLLOUT_MODES.add("tools", RolloutModeSpec(ToolRollout(), shares_prefixes=False, check=check_tools))
ROLLOUT_MODES.add(
    "tools_tree", RolloutModeSpec(ToolTreeRollout(), shares_prefixes=True, check=check_tool_tree)
)
