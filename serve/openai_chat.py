"""OpenAI chat-completions semantics over sqlrl's tool chat template (Ray-free, model-free).

- ``APIError`` + ``error_body``: OpenAI's error shape ``{"error": {"message", "type", "param",
  "code"}}`` with its status codes (400 invalid_request_error, 401, 404 model_not_found, 413,
  429, 503, 504).
- ``ChatRequest`` (pydantic): ``model``, ``messages``, ``tools``, ``tool_choice``
  (``auto``/``none``/``required``/named), ``temperature``, ``top_p``, ``max_tokens`` (or
  ``max_completion_tokens``), ``n``, ``stop``, ``seed``, ``stream`` (+ ``stream_options``).
- ``prepare(req)``: the messages for the template (assistant ``tool_calls`` arguments back to
  objects, ``tool`` messages checked against the ``tool_call_id``s the assistant issued), the
  tools to render, and the **forced prefix**: ``tool_choice="required"`` starts the assistant
  turn with ``<tool_call>``, a named function with ``<tool_call>{"name": "<fn>", "arguments": ``
  -- so the choice is enforced by the prompt, not hoped for; ``none`` renders no tools.
- ``parse_reply(text, tool_names)``: hermes ``<tool_call>`` blocks naming a requested tool ->
  ``tool_calls`` (``id``, ``type: function``, ``function.name``, ``function.arguments`` as a JSON
  string); the rest is ``content``. ``finish_reason`` is ``tool_calls`` when there are calls.
- ``stream_chunks(...)``: the ``chat.completion.chunk`` sequence for a finished choice set.

Guarantees: nothing a model writes raises (unparseable blocks stay in ``content``); bad client
input raises ``APIError(400)`` naming the parameter.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout", 413: "invalid_request_error",
               429: "rate_limit_exceeded", 500: "server_error", 503: "server_overloaded",
               504: "timeout"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None


TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_OPEN) + r"(.*?)" + re.escape(TOOL_CLOSE), re.S)


@dataclass(frozen=True)
class Prepared:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_names: tuple[str, ...]
    prefix: str  # text the assistant turn is forced to start with
    stop: tuple[str, ...]


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise APIError(400, f"{where}: only text content parts are supported", param=where)
            parts.append(p["text"])
        return "".join(parts)
    raise APIError(400, f"{where}: content must be a string or a list of text parts", param=where)


def _tool_names(tools: list[dict[str, Any]] | None) -> tuple[str, ...]:
    names = []
    for i, t in enumerate(tools or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if t.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise APIError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                           param=f"tools[{i}]")
        names.append(fn["name"])
    return tuple(names)


def _messages(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    issued: set[str] = set()
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        role = m.get("role")
        if role in ("system", "developer", "user"):
            out.append({"role": "system" if role == "developer" else role,
                        "content": _text(m.get("content"), where)})
        elif role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": _text(m.get("content"), where)}
            calls = []
            for j, c in enumerate(m.get("tool_calls") or []):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise APIError(400, f"{where}.tool_calls[{j}] needs function.name",
                                   param=f"{where}.tool_calls")
                args = fn.get("arguments", "{}")
                try:
                    args = json.loads(args) if isinstance(args, str) else args
                except ValueError:
                    pass  # the template keeps a non-JSON string verbatim
                calls.append({"type": "function", "function": {"name": fn["name"], "arguments": args}})
                if c.get("id"):
                    issued.add(str(c["id"]))
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not call_id or str(call_id) not in issued:
                raise APIError(400, f"{where}: a tool message must answer a tool_call_id that an "
                               "earlier assistant message issued", param=f"{where}.tool_call_id")
            out.append({"role": "tool", "content": _text(m.get("content"), where)})
        else:
            raise APIError(400, f"{where}: unknown role {role!r}", param=f"{where}.role")
    return out


def prepare(req: ChatRequest) -> Prepared:
    names = _tool_names(req.tools)
    choice = req.tool_choice if req.tool_choice is not None else "auto"
    tools, prefix = (req.tools or None), ""
    if choice == "none":
        tools = None
    elif choice == "required":
        if not names:
            raise APIError(400, "tool_choice 'required' needs tools", param="tool_choice")
        prefix = TOOL_OPEN + "\n"
    elif isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in names:
            raise APIError(400, f"tool_choice names function {name!r}, which is not in tools",
                           param="tool_choice")
        prefix = f'{TOOL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": '
    elif choice != "auto":
        raise APIError(400, f"tool_choice must be 'auto', 'none', 'required' or a named function, "
                       f"got {choice!r}", param="tool_choice")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if len(stop) > 4 or any(not s for s in stop):
        raise APIError(400, "stop: at most 4 non-empty strings", param="stop")
    return Prepared(_messages(req.messages), tools, names if tools else (), prefix, stop)


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to (not including) the first stop string, and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[:min(cuts)], True) if cuts else (text, False)


def parse_reply(text: str, tool_names: tuple[str, ...]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of one assistant turn in the hermes format."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if (not isinstance(obj, dict) or obj.get("name") not in tool_names
                or not isinstance(obj.get("arguments", {}), dict)):
            continue
        kept.append(text[pos:m.start()])
        pos = m.end()
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": json.dumps(obj.get("arguments", {}),
                                                           ensure_ascii=False)}})
    kept.append(text[pos:])
    content = "".join(kept).strip() if calls else text
    return (content or None) if calls else content, calls


def finish_reason(backend_reason: str, stopped: bool, calls: list[Any]) -> str:
    if calls:
        return "tool_calls"
    return "length" if backend_reason == "length" and not stopped else "stop"


def completion(model: str, choices: list[dict[str, Any]], prompt_tokens: int,
               completion_tokens: int, *, seed: int | None = None) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "system_fingerprint": None,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def _pieces(text: str, size: int = 16) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or []


def stream_chunks(result: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """``chat.completion.chunk`` objects for a finished completion (``[DONE]`` is the caller's)."""
    base = {"id": result["id"], "object": "chat.completion.chunk", "created": result["created"],
            "model": result["model"], "system_fingerprint": None}
    chunks: list[dict[str, Any]] = []

    def chunk(index: int, delta: dict[str, Any], reason: str | None = None) -> None:
        chunks.append({**base, "choices": [{"index": index, "delta": delta, "logprobs": None,
                                            "finish_reason": reason}]})

    for choice in result["choices"]:
        i, msg = choice["index"], choice["message"]
        chunk(i, {"role": "assistant", "content": ""})
        for piece in _pieces(msg.get("content") or ""):
            chunk(i, {"content": piece})
        for k, call in enumerate(msg.get("tool_calls") or []):
            chunk(i, {"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                      "function": {"name": call["function"]["name"],
                                                   "arguments": ""}}]})
            for piece in _pieces(call["function"]["arguments"]):
                chunk(i, {"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
        chunk(i, {}, choice["finish_reason"])
    if include_usage:
        chunks.append({**base, "choices": [], "usage": result["usage"]})
    return chunks


