"""One assistant turn's text -> OpenAI ``content`` + ``tool_calls``, finished or while it streams.

The same function reads a finished turn (non-streaming responses) and a turn still being
generated (SSE streaming), so the two cannot disagree:

- ``split_reply(text, tool_names, final)``: hermes ``<tool_call>{"name", "arguments"}</tool_call>``
  blocks that name a requested tool become calls; everything else is content. Whitespace next to
  a call block is dropped, and so is trailing whitespace when the turn has calls. A block that is
  not valid JSON, names an unrequested tool or has non-object arguments stays in the content
  verbatim. With ``final=False`` it returns only what can no longer change: it holds back
  trailing whitespace, a partial ``<tool_call>`` tag at the end, and an unclosed block.
- ``visible(text, stops, final)``: the text up to the first stop string (and whether one was
  found); while streaming it also holds back a trailing partial stop string, and a trailing
  U+FFFD (bytes of a character that the next token completes).
- ``ChoiceStream``: one choice of a streamed completion. ``update(text)`` with the whole text
  generated so far returns the new OpenAI deltas (``{"content": ...}``, one
  ``{"tool_calls": [...]}`` per finished call); ``finish(text, backend_reason)`` the last ones and
  the finish reason.

Guarantees (tested on every prefix of generated texts, tests/unit/test_serve_streaming.py):
what ``split_reply(prefix, final=False)`` returns is a prefix of what it returns for any longer
text, so deltas are never retracted; the deltas of a stream concatenate to exactly the content
and calls of the non-streaming answer for the same text. Nothing a model writes raises.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


def _partial_suffix(text: str, word: str) -> int:
    """Length of the longest proper prefix of ``word`` that ``text`` ends with."""
    for k in range(min(len(word) - 1, len(text)), 0, -1):
        if text.endswith(word[:k]):
            return k
    return 0


def _call(inner: str, tool_names: tuple[str, ...]) -> tuple[str, str] | None:
    try:
        # strict=False: a raw control character inside a string is read as that character (xgrammar's
        # length-bounded JSON strings allow them); the arguments go out re-encoded, valid JSON
        obj = json.loads(inner, strict=False)
    except ValueError:
        return None
    if (not isinstance(obj, dict) or obj.get("name") not in tool_names
            or not isinstance(obj.get("arguments", {}), dict)):
        return None
    return obj["name"], json.dumps(obj.get("arguments", {}), ensure_ascii=False)


def split_reply(text: str, tool_names: tuple[str, ...], final: bool = True) -> tuple[str, list[tuple[str, str]]]:
    """(content, [(name, arguments JSON)]) -- see the module docstring for the rules."""
    if not tool_names:
        return text, []
    pieces: list[str] = []
    calls: list[tuple[str, str]] = []
    pos, after_call = 0, False
    while (i := text.find(TOOL_OPEN, pos)) >= 0:
        j = text.find(TOOL_CLOSE, i + len(TOOL_OPEN))
        if j < 0:
            break  # unclosed: content when final, held back while streaming
        end = j + len(TOOL_CLOSE)
        seg = text[pos:i].lstrip() if after_call else text[pos:i]
        call = _call(text[i + len(TOOL_OPEN):j], tool_names)
        if call is None:
            pieces.append(seg + text[i:end])
        else:
            pieces.append(seg.rstrip())
            calls.append(call)
        after_call, pos = call is not None, end
    rest = text[pos:].lstrip() if after_call else text[pos:]
    if not final:
        k = rest.find(TOOL_OPEN)
        rest = rest[:k] if k >= 0 else rest[:len(rest) - _partial_suffix(rest, TOOL_OPEN)]
        rest = rest.rstrip()
    elif calls:
        rest = rest.rstrip()
    pieces.append(rest)
    return "".join(pieces), calls


def visible(text: str, stops: tuple[str, ...], final: bool = True) -> tuple[str, bool]:
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    if cuts:
        return text[:min(cuts)], True
    if not final:
        text = text[:len(text) - max((_partial_suffix(text, s) for s in stops), default=0)]
        text = text.rstrip("\ufffd")
    return text, False


def finish_reason(backend_reason: str, stopped: bool, has_calls: bool) -> str:
    if has_calls:
        return "tool_calls"
    return "length" if backend_reason == "length" and not stopped else "stop"


def message(content: str, calls: list[tuple[str, str]]) -> dict[str, Any]:
    """The assistant message of a finished turn (ids are fresh ``call_<hex>``)."""
    msg: dict[str, Any] = {"role": "assistant", "content": (content or None) if calls else content}
    if calls:
        msg["tool_calls"] = [_tool_call(name, args) for name, args in calls]
    return msg


def _tool_call(name: str, args: str) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": args}}


class ChoiceStream:
    """The deltas of one streamed choice. ``prefix`` is the forced start of the turn (tool_choice),
    ``stops`` the stop strings (and the end-of-turn text)."""

    def __init__(self, prefix: str, stops: tuple[str, ...], tool_names: tuple[str, ...]) -> None:
        self.prefix, self.stops, self.tool_names = prefix, stops, tool_names
        self.sent, self.n_calls = "", 0

    def _deltas(self, text: str, final: bool) -> tuple[list[dict[str, Any]], bool, bool]:
        shown, stopped = visible(self.prefix + text, self.stops, final)
        content, calls = split_reply(shown, self.tool_names, final or stopped)
        out: list[dict[str, Any]] = []
        if content.startswith(self.sent) and len(content) > len(self.sent):
            out.append({"content": content[len(self.sent):]})
            self.sent = content
        for name, args in calls[self.n_calls:]:
            call = _tool_call(name, args)
            out.append({"tool_calls": [{"index": self.n_calls, **call}]})
            self.n_calls += 1
        return out, stopped, bool(calls)

    def update(self, text: str) -> list[dict[str, Any]]:
        return self._deltas(text, final=False)[0]

    def finish(self, text: str, backend_reason: str) -> tuple[list[dict[str, Any]], str]:
        deltas, stopped, has_calls = self._deltas(text, final=True)
        return deltas, finish_reason(backend_reason, stopped, has_calls)
