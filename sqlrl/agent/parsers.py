"""Tool-call parsers: one assistant turn's text -> the tool call it makes, or what is wrong with it.

A registry, ``PARSERS`` (name -> parser), so a model family's call syntax is one entry. Today:
``"hermes"`` (Qwen2.5 / Hermes chat templates)::

    optional free text (reasoning)
    <tool_call>
    {"name": "execute_sql", "arguments": {"sql": "SELECT ..."}}
    </tool_call>

Guarantees:
- ``parse(text)`` never raises, on any input. It returns ``ParsedTurn(content, calls, errors)``;
  every problem is an entry of ``errors`` written for the model to act on (the argument
  problems are ``sqlrl.tools.validate_call``'s own messages).
- **Exactly one tool call per turn.** A turn is valid only when it holds one well-formed
  ``<tool_call>…</tool_call>`` block, with only whitespace after it. Zero calls (a plain-text
  turn), several calls, an unclosed or stray tag, text after the call, bad JSON, a JSON value
  that is not ``{"name": …, "arguments": {…}}``, an unknown tool or wrong arguments are errors.
  One call per turn keeps a turn = one action = one observation, so every observation the model
  reads answers exactly one call and nothing it wrote is silently dropped.
- ``calls`` is non-empty only when ``errors`` is empty (a turn with any error runs nothing).
- ``content`` is the text before the call, stripped (the reasoning); for an invalid turn it is
  the whole text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from sqlrl.tools import ToolCall, ToolCallError, validate_call
from sqlrl.tools.schemas import TOOLS


@dataclass(frozen=True)
class ParsedTurn:
    content: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors and len(self.calls) == 1


class ToolCallParser(Protocol):
    name: str
    example: str  # how a call looks, for prompts

    def parse(self, text: str) -> ParsedTurn: ...


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_EXAMPLE_CALL = {"name": "execute_sql", "arguments": {"sql": "SELECT count(*) FROM orders"}}


class HermesParser:
    """``<tool_call>{"name": …, "arguments": {…}}</tool_call>``, one per turn."""

    name = "hermes"
    example = f"{_OPEN}\n{json.dumps(_EXAMPLE_CALL)}\n{_CLOSE}"

    def parse(self, text: str) -> ParsedTurn:
        if not isinstance(text, str):
            return ParsedTurn("", (), (f"the turn is {type(text).__name__}, not text",))
        opens = [m.start() for m in re.finditer(re.escape(_OPEN), text)]
        closes = [m.start() for m in re.finditer(re.escape(_CLOSE), text)]
        shape = self._shape_error(text, opens, closes)
        if shape:
            return ParsedTurn(text, (), (shape,))
        start, end = opens[0], closes[0]
        body = text[start + len(_OPEN):end]
        try:
            call = self._call(body)
        except ToolCallError as exc:
            return ParsedTurn(text, (), (str(exc),))
        return ParsedTurn(text[:start].strip(), (call,), ())

    def _shape_error(self, text: str, opens: list[int], closes: list[int]) -> str:
        how = f"write exactly one call per turn, like:\n{self.example}"
        if not opens and not closes:
            return f"no tool call found: every turn must call exactly one tool; {how}"
        if len(opens) > 1 or len(closes) > 1:
            return (f"only one tool call per turn is allowed, found {max(len(opens), len(closes))}; "
                    "call one tool, read its result, then call the next")
        if not opens:
            return f"found {_CLOSE} without a matching {_OPEN}; {how}"
        if not closes:
            return f"the {_OPEN} tag is not closed with {_CLOSE}; {how}"
        if closes[0] < opens[0]:
            return f"found {_CLOSE} before {_OPEN}; {how}"
        if text[closes[0] + len(_CLOSE):].strip():
            return (f"text after {_CLOSE} is not allowed: end your turn right after the tool call "
                    "and wait for its result")
        return ""

    @staticmethod
    def _call(body: str) -> ToolCall:
        if not body.strip():
            raise ToolCallError(f"the tool call is empty; write {json.dumps(_EXAMPLE_CALL)}")
        try:
            obj: Any = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise ToolCallError(f"the tool call is not valid JSON ({exc}); write "
                                f"{json.dumps(_EXAMPLE_CALL)}") from None
        if not isinstance(obj, dict):
            raise ToolCallError('the tool call must be a JSON object {"name": ..., "arguments": '
                                f"{{...}}}}, got {_kind(obj)}")
        extra = sorted(str(k) for k in obj if k not in ("name", "arguments"))
        if extra:
            raise ToolCallError(f"the tool call has unexpected key(s) {', '.join(map(repr, extra))}; "
                                "it takes only 'name' and 'arguments'")
        if "name" not in obj:
            raise ToolCallError(f"the tool call has no 'name'; available tools: {', '.join(TOOLS)}")
        if "arguments" not in obj:
            raise ToolCallError("the tool call has no 'arguments'; write "
                                f"{json.dumps(_EXAMPLE_CALL)}")
        return validate_call(obj["name"], obj["arguments"])


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, (int, float)) else type(value).__name__


PARSERS: dict[str, ToolCallParser] = {"hermes": HermesParser()}


def get_parser(name: str) -> ToolCallParser:
    try:
        return PARSERS[name]
    except KeyError:
        raise KeyError(f"unknown tool-call parser {name!r}; known: {', '.join(PARSERS)}") from None
