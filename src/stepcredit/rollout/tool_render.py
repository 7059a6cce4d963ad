"""How a tool rollout's text looks: the prompts with the offered tools' schemas, the start-up check of
``rollout.tools.render``, and the tokens appended after a call for its result (the chat template's own
tool turn, or the convention's text), with a tool's output neutralised so that it cannot forge turn
structure (:func:`stepcredit.tools.neutralise`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stepcredit.config import ToolsConfig
from stepcredit.errors import ConfigError
from stepcredit.tools import PARSERS, ToolParser, neutralise, probe_tool_template, schemas, tool_turn_text
from stepcredit.types import Sample


def render_tool_prompts(tok: Any, samples: list[Sample], names: Sequence[str]) -> list[list[int]]:
    """Chat prompts with the offered tools' schemas where the template prints them (Hermes-style
    templates list them in the system turn; :func:`stepcredit.tools.probe_tool_template` probes it);
    other templates get the plain prompt."""
    tools = schemas(names) if probe_tool_template(tok).schemas else None
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
    turns = probe_tool_template(tok)
    if required and not turns.renders:
        raise ConfigError(
            f"config key rollout.tools.render: 'template' needs a chat template that renders tool calls "
            f"and tool messages, and the model's does not ({turns.why_not}); use render=auto or "
            "render=convention, or give the model a template with tools (stepcredit.tools.hermes_template)"
        )
    return wanted and turns.renders


def special_strings(tok: Any) -> list[str]:
    """Every special token's text: the named ones and the added tokens marked special (a tokenizer's
    turn markup, e.g. ``<|im_start|>``, is often only the latter), longest first."""
    found = set(getattr(tok, "all_special_tokens", []) or [])
    found.update(t.content for t in (getattr(tok, "added_tokens_decoder", {}) or {}).values() if t.special)
    return sorted((s for s in found if s), key=len, reverse=True)


def safe_result(tok: Any, result: str) -> str:
    """``result`` as it may be appended: special-token strings dropped, then every registered
    convention's markup and chat-template markup neutralised (:func:`stepcredit.tools.neutralise`), so
    a tool's output cannot end the response, close its own result or open a call or a turn, whichever
    convention or render the run uses."""
    specials, before = special_strings(tok), None
    while before != result:  # until none is left: removing one must not join the halves of another
        before = result
        for s in specials:
            result = result.replace(s, "")
    return neutralise(result)


def observation_ids(
    tok: Any, result: str, *, parser: ToolParser, tools: ToolsConfig, prompt: Sequence[Mapping[str, Any]]
) -> list[int]:
    """The tokens appended after a call for its ``result``: the chat template's own tool turn where it
    renders one (``rollout.tools.render``; :func:`stepcredit.tools.templates.tool_turn_text`: the
    template's end of the call's turn, the tool turn and the next assistant header), else the
    convention's text (``parser.observation``).

    A tool that prints the eos (or any special token's) string, a convention's markup or chat-template
    markup must not end the response, write a turn or a call: the result is neutralised first
    (:func:`safe_result`), and special tokens are dropped from the convention's tokens. The template's
    own markup keeps its special tokens except the eos: a response ends at its first eos (the batch cuts
    it there), so where the template's end of turn is the eos (ChatML models: SmolLM2, Qwen) those
    tokens are left out."""
    result = safe_result(tok, result)
    if not check_tool_template(tok, tools):
        special = set(getattr(tok, "all_special_ids", []) or [])
        ids = tok(parser.observation(result), add_special_tokens=False)["input_ids"]
        return [i for i in ids if i not in special]
    offered = schemas(tools.names) if probe_tool_template(tok).schemas else None
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
    convention's text, exactly as the turn loop appends them. A ValueError when ``block`` is not the
    convention's result text."""
    parser: ToolParser = PARSERS.get(tools.parser)
    result = result_of(parser, block)
    if result is None:
        raise ValueError(f"{block[:60]!r} is not a result block of the {tools.parser!r} convention")
    return observation_ids(tok, result, parser=parser, tools=tools, prompt=prompt)
