"""Tools a policy calls inside a multi-turn rollout: declarations, parsed calls, parsers, execution
(:mod:`.core`), and the built-in ``calculator`` and ``python`` tools (:mod:`.builtin`), registered on import.
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

__all__ = [
    "PARSERS",
    "TOOLS",
    "Observation",
    "ParsedCall",
    "ToolCall",
    "ToolError",
    "ToolParser",
    "ToolSpec",
    "execute_call",
    "register_http_tool",
    "register_tool",
    "schemas",
]
