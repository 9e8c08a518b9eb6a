"""Tool calls: validation with model-readable messages, and running a call on a session.

Guarantees:
- ``validate_call`` returns a ``ToolCall`` or raises ``ToolCallError`` whose message says exactly
  what is wrong (unknown tool, arguments not a JSON object or not valid JSON, a missing, extra or
  wrongly typed argument, empty SQL), in words a model can act on.
- ``run_tool`` never raises for anything the model wrote: SQL errors come back as error
  observations (the session never raises either).
- ``submit_solution`` does not execute or grade anything: it records the SQL and ends the
  trajectory; rewards grade it later on a fresh session (so a submission cannot depend on state
  the trajectory built up, and grading costs nothing during rollout).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from sqlrl.db.types import QueryResult

from .observation import format_observation, format_tool_error
from .schemas import TOOLS

_JSON_TYPES = {"string": (str, "a string"), "object": (dict, "an object"),
               "integer": (int, "an integer"), "boolean": (bool, "a boolean")}


class ToolCallError(ValueError):
    """An invalid tool call; ``str(exc)`` is the message shown to the model."""


class SupportsExecute(Protocol):
    def execute(self, sql: str) -> QueryResult: ...


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]  # validated; treat as read-only
    call_id: str | None = None


@dataclass(frozen=True)
class ToolOutcome:
    observation: str  # the text the model reads next (observation.py's format)
    is_error: bool
    is_final: bool  # the trajectory ends (submit_solution)
    call: ToolCall | None = None  # None when the call itself was invalid
    result: QueryResult | None = None  # the session's result, for execute_sql
    submitted_sql: str | None = None  # for submit_solution
    extra: dict[str, Any] = field(default_factory=dict)


def _json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def validate_call(name: Any, arguments: Any, call_id: str | None = None) -> ToolCall:
    spec = TOOLS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ToolCallError(f"unknown tool {name!r}; available tools: {', '.join(TOOLS)}")
    if isinstance(arguments, (str, bytes)):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise ToolCallError(f"the arguments of {spec.name} are not valid JSON ({exc}); "
                                'send an object like {"sql": "SELECT ..."}') from None
    if not isinstance(arguments, dict):
        raise ToolCallError(f"the arguments of {spec.name} must be a JSON object like "
                            f'{{"sql": "SELECT ..."}}, got {_json_type_name(arguments)}')
    props = spec.parameters["properties"]
    missing = [k for k in spec.parameters["required"] if k not in arguments]
    if missing:
        raise ToolCallError(f"{spec.name} is missing the required argument "
                            f"{', '.join(repr(k) for k in missing)}")
    extra = sorted(k for k in arguments if k not in props)
    if extra:
        raise ToolCallError(f"{spec.name} got unexpected argument(s) "
                            f"{', '.join(repr(str(k)) for k in extra)}; it takes only "
                            f"{', '.join(repr(k) for k in props)}")
    for key, schema in props.items():
        python_type, words = _JSON_TYPES[schema["type"]]
        if key in arguments and not isinstance(arguments[key], python_type):
            raise ToolCallError(f"the argument {key!r} of {spec.name} must be {words}, "
                                f"got {_json_type_name(arguments[key])}")
    if "sql" in props and not arguments["sql"].strip():
        raise ToolCallError(f"the argument 'sql' of {spec.name} is empty")
    return ToolCall(spec.name, dict(arguments), call_id)


def _execute_sql(call: ToolCall, session: SupportsExecute) -> ToolOutcome:
    result = session.execute(call.arguments["sql"])
    return ToolOutcome(format_observation(result), is_error=not result.ok, is_final=False,
                       call=call, result=result)


def _submit_solution(call: ToolCall, session: SupportsExecute) -> ToolOutcome:
    return ToolOutcome("Solution submitted.", is_error=False, is_final=True, call=call,
                       submitted_sql=call.arguments["sql"])


HANDLERS: dict[str, Callable[[ToolCall, SupportsExecute], ToolOutcome]] = {
    "execute_sql": _execute_sql,
    "submit_solution": _submit_solution,
}
assert set(HANDLERS) == set(TOOLS), "every tool needs a handler"


def run_tool(call: ToolCall, session: SupportsExecute) -> ToolOutcome:
    """Run an already validated call on the trajectory's session."""
    return HANDLERS[call.name](call, session)


def run_raw(name: Any, arguments: Any, session: SupportsExecute,
            call_id: str | None = None) -> ToolOutcome:
    """Validate what the model emitted and run it; an invalid call becomes an error observation."""
    try:
        call = validate_call(name, arguments, call_id)
    except ToolCallError as exc:
        return ToolOutcome(format_tool_error(str(exc)), is_error=True, is_final=False)
    return run_tool(call, session)
