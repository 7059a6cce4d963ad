"""Tools a policy calls inside a multi-turn rollout: declarations, parsed calls, parsers, execution
(:mod:`.core`), chat templates' tool turns (:mod:`.templates`), and the built-in ``calculator`` and ``python`` tools (:mod:`.builtin`), registered on import.
"""

from stepcredit.tools import builtin  # noqa: F401  (registers calculator and python)
from stepcredit.tools.core import (
    PARSERS,
    TOOLS,
    Observation,
    ParsedCall,
    ToolCall,
    ToolError,
    ToolParser,
    ToolSpec,
    execute_call,
    register_http_tool,
    register_tool,
    schemas,
)
from stepcredit.tools.templates import ToolTurns, hermes_template, tool_turn_text, tool_turns

__all__ = [
    "PARSERS",
    "TOOLS",
    "Observation",
    "ParsedCall",
    "ToolCall",
    "ToolError",
    "ToolParser",
    "ToolSpec",
    "ToolTurns",
    "execute_call",
    "hermes_template",
    "register_http_tool",
    "register_tool",
    "schemas",
    "tool_turn_text",
    "tool_turns",
]
