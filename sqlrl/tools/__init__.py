"""The agent's tools: ``execute_sql`` and ``submit_solution``.

- ``schemas``: OpenAI function-calling schemas in a registry (``TOOLS``, ``tool_schemas``).
- ``calls``: ``validate_call`` (clear messages), ``run_tool`` / ``run_raw`` on a session.
- ``observation``: the one observation text format (``format_observation``).
"""

from .calls import ToolCall, ToolCallError, ToolOutcome, run_raw, run_tool, validate_call
from .observation import format_observation, format_tool_error
from .schemas import TOOLS, ToolSpec, tool_schemas

__all__ = ["TOOLS", "ToolCall", "ToolCallError", "ToolOutcome", "ToolSpec", "format_observation",
           "format_tool_error", "run_raw", "run_tool", "tool_schemas", "validate_call"]
