"""Model set-up, written once for every command that runs the policy (train, eval, probe, explain, sft):
load it (a run directory, a LoRA run's base + adapter, a model directory, ``tiny`` or a packaged model:
:func:`stepcredit.models.load_policy`), check that its chat template renders tool turns on a run whose
rollouts call tools, put it on ``trainer.device``, and bind the configured rollout engine so that every
stage generates through it (:mod:`stepcredit.rollout.engines`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from stepcredit.config import Config
from stepcredit.models import load_policy
from stepcredit.rollout import ROLLOUT_MODES, engines
from stepcredit.rollout.tool_render import check_tool_template
from stepcredit.trainer.state import resolve_device


def load_model(cfg: Config) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``cfg.model`` on ``trainer.device``; on a run whose rollouts call tools
    with ``rollout.tools.render=template``, a template that cannot render tool turns is one line here."""
    model, tok = load_policy(cfg.model, seed=cfg.trainer.seed)
    if ROLLOUT_MODES.get(cfg.rollout.mode).uses_tools:  # render=template, a template without tool turns
        check_tool_template(tok, cfg.rollout.tools)
    model.to(resolve_device(cfg.trainer.device))
    return model, tok


@contextlib.contextmanager
def engine_bound(cfg: Config, model: Any, tok: Any) -> Iterator[engines.Engine]:
    """The configured engine (``rollout.engine``), built from the policy as it is now and bound to it
    for the block: every generation from ``model`` goes through it. Unbound and closed after."""
    engine = engines.build_engine(cfg, model, tok)
    engines.bind(model, engine)
    try:
        yield engine
    finally:
        engines.unbind(model)
        engine.close()


@contextlib.contextmanager
def policy(cfg: Config) -> Iterator[tuple[Any, Any]]:
    """:func:`load_model` with its engine bound for the block: what a command that only evaluates needs."""
    model, tok = load_model(cfg)
    with engine_bound(cfg, model, tok):
        yield model, tok
