"""The rollout mode ``tools``: multi-turn responses whose turns call tools.

Each turn is sampled by the run's engine for every still-active response of the batch at once; a turn
ends at the first complete tool call (the convention's parser, ``rollout.tools.parser``, finds it;
sampling is causal, so cutting a sampled turn at the call is sampling with a stop string), the calls of
the whole turn run together (through the reward layer's kill-safe workers when the trainer hands the
mode its :class:`~stepcredit.rollout.tool_context.ToolContext`), and each result is appended as
observation tokens (:mod:`stepcredit.rollout.turns`). A response ends with eos (its final answer), at
the length budget (tool results count in it), or at a call past ``rollout.tools.max_turns`` (not
executed, counted as ``tools/turn_limit_reached``; the response has no eos, so it is marked truncated).

The batch marks the results' tokens in ``observation_BT``: they are attended to but left out of
``response_mask_BT``, so they are never trained on and carry no reward. Each tool call's last token
ends a turn, which the segmenter takes as an episode end from those marks: turns are the process
channel's steps.
"""

from __future__ import annotations

from typing import Any

import torch

from stepcredit.config import Config
from stepcredit.errors import ConfigError
from stepcredit.rollout.modes import RolloutRequest
from stepcredit.rollout.tool_context import ToolContext
from stepcredit.rollout.tool_render import render_tool_prompts
from stepcredit.rollout.turns import TurnRow, rows_batch, run_turns, turn_counters
from stepcredit.runtime import require
from stepcredit.tools import PARSERS, TOOLS
from stepcredit.types import Batch
from stepcredit.user_code import load_module


def request_tools(request: RolloutRequest) -> ToolContext:
    """The request's tool context, or (library use without a reward agent) one whose calls run in this
    process from ``request.cfg.tools``."""
    if request.tools is not None:
        return request.tools
    return ToolContext.in_process(request.cfg.tools, request.cfg.max_new_tokens)


@torch.no_grad()
def tools_rollout(model: Any, tok: Any, request: RolloutRequest) -> tuple[Batch, dict[str, float]]:
    """``rollout.n`` multi-turn responses per prompt (greedy when ``temperature == 0``), and the
    rollout's counters: responses, tokens (results included in ``rollout/response_tokens``, not in
    ``rollout/generated_tokens``), tool calls, turns, failed calls by kind and turn limits reached."""
    cfg, samples = request.cfg, request.samples
    tools = request_tools(request)
    was_training = model.training
    model.eval()
    prompts = render_tool_prompts(tok, samples, tools.config.names)
    n = cfg.n
    rows = [TurnRow(prompts[i // n], samples[i // n], cfg.max_new_tokens) for i in range(len(samples) * n)]
    counts = run_turns(model, tok, rows, tools, temperature=request.sampling_temperature, top_p=cfg.top_p)
    batch = rows_batch(model, tok, samples, rows, request)
    if was_training:
        model.train()
    counts.update(turn_counters(rows))
    return batch, counts


def check_tools(cfg: Config) -> None:
    """Start-up check of ``rollout.tools``: import ``modules`` (a user's tools register themselves;
    through the reward layer's loader and its cache, so a file is imported once), then every name and
    the parser must be registered (a ConfigError naming the key otherwise)."""
    tc = cfg.rollout.tools
    for spec in tc.modules:
        try:
            load_module(spec, what="tool")
        except ConfigError as e:  # a missing file, a syntax error, a failing import: one line naming the key
            raise ConfigError(f"config key rollout.tools.modules: {spec}: {e}") from None
    for key, registry, names in (("names", TOOLS, tc.names), ("parser", PARSERS, (tc.parser,))):
        for name in names:
            if name not in registry:
                raise ConfigError(
                    f"config key rollout.tools.{key}: unknown {registry.kind} {name!r} "
                    f"(valid: {', '.join(registry.names())})"
                )
    for (
        name
    ) in tc.names:  # packages a tool imports beyond the core install: before SFT, not at its first call
        require(TOOLS.get(name).requires, what=f"tool {name!r} (config key rollout.tools.names)")
