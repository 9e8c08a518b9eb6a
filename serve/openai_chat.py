"""OpenAI chat-completions semantics over sqlrl's tool chat template (Ray-free, model-free).

- ``APIError`` + ``error_body``: OpenAI's error shape ``{"error": {"message", "type", "param",
  "code"}}`` with its status codes (400 invalid_request_error, 401, 404 model_not_found, 413,
  429, 503, 504).
- ``ChatRequest`` (pydantic): ``model``, ``messages``, ``tools``, ``tool_choice``
  (``auto``/``none``/``required``/named), ``temperature``, ``top_p``, ``max_tokens`` (or
  ``max_completion_tokens``), ``n``, ``stop``, ``seed``, ``stream`` (+ ``stream_options``; a
  strict boolean: ``"yes"`` is a 400), ``logprobs`` (the sampled token's log-probability under the
  sampling distribution; ``top_logprobs`` above 0 is refused: the engines give only that one).
  Parameters sqlrl does not implement are refused with 400 naming them, never silently ignored:
  ``response_format`` other than ``{"type": "text"}``, a non-empty ``logit_bias``,
  ``ignore_eos: true`` (``UNSUPPORTED``).
- ``prepare(req)``: the messages for the template (assistant ``tool_calls`` arguments back to
  objects, ``tool`` messages checked against the ``tool_call_id``s the assistant issued), the
  tools to render, and the **forced prefix**: ``tool_choice="required"`` starts the assistant
  turn with ``<tool_call>``, a named function with ``<tool_call>{"name": "<fn>", "arguments": ``
  -- so the choice is enforced by the prompt, not hoped for; ``none`` renders no tools.
- ``call_constraint(p)``: for a forced call, the grammar the rest of the turn must follow
  (``sqlrl.policy.constraints``): the call object ``{"name": <a forced tool>, "arguments": <JSON
  valid under that tool's parameters schema>}`` -- for a named function only the arguments and the
  closing ``}`` (the prefix holds the rest) -- then ``\n</tool_call>``, after which only the
  end-of-turn token is allowed. The engines that honour it (HF, vLLM) mask their logits with it, so
  a forced call always parses into ``tool_calls`` (unless ``max_tokens`` cuts it); ``auto`` and
  ``none`` stay free (None). A tool's schema that cannot be compiled is a 400 naming the tool.
- ``completion(...)`` / ``chunk(...)``: the ``chat.completion`` and ``chat.completion.chunk``
  objects. Reading the model's turn (content and hermes tool calls, finished or streaming) is
  ``serve/streaming.py``.

Guarantees: nothing a model writes raises (unparseable blocks stay in ``content``); bad client
input raises ``APIError(400)`` naming the parameter.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from .streaming import TOOL_CLOSE, TOOL_OPEN

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 408: "timeout",
               409: "invalid_request_error", 410: "invalid_request_error",  # the gateway's: the client's, not ours
               413: "invalid_request_error",
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
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    logprobs: StrictBool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, Any] | None = None
    ignore_eos: StrictBool = False

    def refuse_unsupported(self) -> None:
        """``APIError(400)`` naming the first parameter given a value sqlrl does not implement."""
        for name, (is_default, why) in UNSUPPORTED.items():
            if not is_default(getattr(self, name)):
                raise APIError(400, f"{name}: {why}", param=name, code="unsupported_parameter")


# parameter -> (is the value one sqlrl honours?, why another is refused)
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "response_format": (lambda v: v is None or v == {"type": "text"},
                        "only {'type': 'text'} is supported (no JSON mode or JSON schema output)"),
    "logit_bias": (lambda v: not v, "not supported"),
    "ignore_eos": (lambda v: not v, "not supported: generation always ends at the end-of-turn token"),
    "top_logprobs": (lambda v: not v, "not supported: the engines return the sampled token's "
                                      "log-probability only (logprobs: true)"),
}


@dataclass(frozen=True)
class Prepared:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_names: tuple[str, ...]
    prefix: str  # text the assistant turn is forced to start with
    stop: tuple[str, ...]
    # a forced call: (name, parameters schema) of each tool it may call (empty: free); named: the
    # prefix already names the one function (call_constraint)
    forced: tuple[tuple[str, str], ...] = ()
    named: bool = False


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
        if not isinstance(m, dict):
            raise APIError(400, f"{where} must be an object", param=where)
        role = m.get("role")
        if role in ("system", "developer", "user"):
            out.append({"role": "system" if role == "developer" else role,
                        "content": _text(m.get("content"), where)})
        elif role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": _text(m.get("content"), where)}
            calls = []
            raw_calls = m.get("tool_calls") or []
            if not isinstance(raw_calls, list):
                raise APIError(400, f"{where}.tool_calls must be a list of tool calls, got "
                               f"{type(raw_calls).__name__}", param=f"{where}.tool_calls")
            for j, c in enumerate(raw_calls):
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


def _parameters(tools: list[dict[str, Any]] | None) -> dict[str, str]:
    """Each tool's parameters schema as canonical JSON (no schema: an object of no arguments)."""
    out = {}
    for i, t in enumerate(tools or []):
        schema = t["function"].get("parameters")
        if schema is None:
            schema = {"type": "object", "properties": {}}
        if not isinstance(schema, dict):
            raise APIError(400, f"tools[{i}].function.parameters must be a JSON schema object",
                           param=f"tools[{i}].function.parameters")
        out.setdefault(t["function"]["name"], json.dumps(schema, sort_keys=True))
    return out


def prepare(req: ChatRequest) -> Prepared:
    names = _tool_names(req.tools)
    choice = req.tool_choice if req.tool_choice is not None else "auto"
    tools, prefix = (req.tools or None), ""
    forced: tuple[tuple[str, str], ...] = ()
    if choice == "none":
        tools = None
    elif choice == "required":
        if not names:
            raise APIError(400, "tool_choice 'required' needs tools", param="tool_choice")
        prefix = TOOL_OPEN + "\n"
        forced = tuple(_parameters(req.tools).items())
    elif isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in names:
            raise APIError(400, f"tool_choice names function {name!r}, which is not in tools",
                           param="tool_choice")
        prefix = f'{TOOL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": '
        forced = ((name, _parameters(req.tools)[name]),)
    elif choice != "auto":
        raise APIError(400, f"tool_choice must be 'auto', 'none', 'required' or a named function, "
                       f"got {choice!r}", param="tool_choice")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if len(stop) > 4 or any(not s for s in stop):
        raise APIError(400, "stop: at most 4 non-empty strings", param="stop")
    return Prepared(_messages(req.messages), tools, names if tools else (), prefix, stop, forced,
                    named=isinstance(choice, dict))


def call_constraint(p: Prepared) -> Any:
    """The grammar of a forced call's rest (module docstring; None when the turn is free)."""
    return _call_grammar(p.forced, p.named) if p.forced else None


@functools.lru_cache(maxsize=256)
def _call_grammar(forced: tuple[tuple[str, str], ...], named: bool) -> Any:
    from sqlrl.policy.constraints import json_grammar

    tail = "\n" + TOOL_CLOSE
    try:
        if named:
            return json_grammar(json.loads(forced[0][1]), suffix="}" + tail)
        calls = [{"type": "object", "properties": {"name": {"const": name}, "arguments": json.loads(schema)},
                  "required": ["name", "arguments"]} for name, schema in forced]
        return json_grammar(calls[0] if len(calls) == 1 else {"anyOf": calls}, suffix=tail)
    except ValueError as exc:
        raise APIError(400, f"a forced tool call's parameters schema cannot be enforced: {exc}",
                       param="tools") from None


def completion(model: str, choices: list[dict[str, Any]], prompt_tokens: int,
               completion_tokens: int, *, seed: int | None = None) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "system_fingerprint": None,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def token_logprobs(tokenizer: Any, token_ids: Any, logprobs: Any) -> dict[str, Any]:
    """OpenAI's ``logprobs`` object for generated tokens: one entry per token (the end-of-turn token
    included), its text, UTF-8 bytes and the sampling distribution's log-probability."""
    content = []
    for tok, lp in zip(token_ids, logprobs):
        text = tokenizer.decode([int(tok)], skip_special_tokens=False)
        content.append({"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8")),
                        "top_logprobs": []})
    return {"content": content}


def chunk(completion_id: str, created: int, model: str, index: int | None, delta: dict[str, Any] | None,
          reason: str | None = None, usage: dict[str, int] | None = None,
          logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk``: a choice's delta (``index``), or the usage chunk (no choices)."""
    out: dict[str, Any] = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                           "model": model, "system_fingerprint": None, "choices": []}
    if index is not None:
        out["choices"] = [{"index": index, "delta": delta or {}, "logprobs": logprobs, "finish_reason": reason}]
    if usage is not None:
        out["usage"] = usage
    return out
