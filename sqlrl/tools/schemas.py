"""The agent's tools as OpenAI function-calling schemas, in a registry by name.

Guarantees: ``TOOLS`` is the single source of the tool names, descriptions and argument schemas used
in prompts, chat templates, validation and serving; every schema is a JSON Schema object with
``required`` and ``additionalProperties: false``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments object (treat as read-only)
    final: bool  # calling it ends the trajectory

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling form: ``{"type": "function", "function": {...}}``."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": self.parameters}}


def _sql_parameters(description: str) -> dict[str, Any]:
    return {"type": "object",
            "properties": {"sql": {"type": "string", "description": description}},
            "required": ["sql"], "additionalProperties": False}


EXECUTE_SQL = ToolSpec(
    name="execute_sql",
    description=("Run SQL in your own database session and see the result (or the error). "
                 "Changes persist across your calls in this episode (temporary tables, inserts, "
                 "updates); the original database is never modified."),
    parameters=_sql_parameters("The SQL to run. Several statements may be separated by ';' "
                               "(they run in order; the last one's result is shown)."),
    final=False,
)

SUBMIT_SOLUTION = ToolSpec(
    name="submit_solution",
    description=("Submit your final SQL answer and end the episode. It is graded on a fresh copy "
                 "of the database, so include every statement the solution needs."),
    parameters=_sql_parameters("The final SQL. Several statements may be separated by ';'."),
    final=True,
)

TOOLS: dict[str, ToolSpec] = {t.name: t for t in (EXECUTE_SQL, SUBMIT_SOLUTION)}


def tool_schemas(names: list[str] | None = None) -> list[dict[str, Any]]:
    """Schemas of the named tools (all by default), in registry order."""
    chosen = list(TOOLS) if names is None else names
    unknown = [n for n in chosen if n not in TOOLS]
    if unknown:
        raise KeyError(f"unknown tool(s) {unknown}; known: {', '.join(TOOLS)}")
    return [TOOLS[n].schema() for n in chosen]
