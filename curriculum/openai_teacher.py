"""A teacher behind any OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, SGLang, a
hosted API), with retries, a rate limit and a resumable on-disk cache.

    teacher = OpenAITeacher(OpenAIConfig(base_url="http://localhost:8000/v1", model="Qwen2.5-7B",
                                         cache_path="runs/teacher_cache.jsonl", rate_per_s=5))
    teacher.reasoning(task, schema)              # one call (cached)
    teacher.complete_many(list_of_message_lists) # a thread pool with a progress bar

Guarantees:
- Transport: the standard library's ``urllib`` (no extra dependency); the API key, when given,
  goes in an ``Authorization: Bearer`` header and is never written to the cache, logs or errors.
- Retries: HTTP 429 and 5xx, connection errors, timeouts and a 200 whose body is not a
  chat-completion JSON are retried up to ``max_retries`` times with exponential back-off
  (``backoff_s * 2**attempt``, capped at ``max_backoff_s``; a ``Retry-After`` header in seconds is
  honoured when it is longer). Other 4xx answers fail at once. Failure raises ``TeacherError``
  naming the status and the server's message.
- Rate limit: at most ``rate_per_s`` requests start per second across all threads (requests are
  spaced ``1/rate_per_s`` apart; retries count too). ``None`` = unlimited.
- Cache: a JSONL file of ``{"key", "text"}`` lines, ``key`` = SHA-256 of the canonical JSON of
  (model, messages, sampling params). Every finished call is appended and flushed at once, so an
  interrupted run loses nothing it finished and a rerun skips it; failures are never cached. A
  torn last line (a crash mid-write) is ignored on load and counted in ``cache_bad_lines``.
- ``complete_many`` keeps the input order and returns, per request, the text or the
  ``TeacherError`` (one failure does not lose the others).
- What the endpoint returns is not trusted: ``curriculum.builders`` verifies it.
"""

from __future__ import annotations

import hashlib
import json
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from sqlrl.agent.prompts import build_messages
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tasks.types import Task

from .teachers import reference_sql

__all__ = ["OpenAIConfig", "OpenAITeacher", "RateLimiter", "TeacherError", "cache_key",
           "to_plain_messages", "progress_bar"]


class TeacherError(RuntimeError):
    """A teacher call failed for good (after the retries it was allowed)."""


@dataclass(frozen=True)
class OpenAIConfig:
    base_url: str  # ".../v1" or the full ".../chat/completions" URL
    model: str
    api_key: str | None = field(default=None, repr=False)
    temperature: float = 0.7
    max_tokens: int = 1024
    top_p: float = 1.0
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)  # more request fields (e.g. stop)
    timeout_s: float = 120.0
    max_retries: int = 5
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    rate_per_s: float | None = None
    workers: int = 8
    cache_path: str | None = None
    guided: bool = True  # show the teacher the reference solution (rationalisation)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"OpenAIConfig.base_url must be an http(s) URL, got {self.base_url!r}")
        if not self.model:
            raise ValueError("OpenAIConfig.model must be set")
        if self.max_retries < 0 or self.workers < 1 or self.timeout_s <= 0 or self.backoff_s < 0:
            raise ValueError("OpenAIConfig: max_retries >= 0, workers >= 1, timeout_s > 0 and "
                             "backoff_s >= 0 are required")
        if self.rate_per_s is not None and not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise ValueError(f"OpenAIConfig.rate_per_s must be a positive number or None, got "
                             f"{self.rate_per_s!r}")

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        return base if base.endswith("/chat/completions") else base + "/chat/completions"

    def params(self) -> dict[str, Any]:
        p = {"temperature": self.temperature, "max_tokens": self.max_tokens, "top_p": self.top_p}
        if self.seed is not None:
            p["seed"] = self.seed
        return {**p, **self.extra}


def cache_key(model: str, messages: Sequence[dict[str, Any]], params: dict[str, Any]) -> str:
    canon = json.dumps({"model": model, "messages": list(messages), "params": params},
                       sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


class RateLimiter:
    """Spaces calls ``1/rate`` seconds apart across threads."""

    def __init__(self, rate_per_s: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.interval = 0.0 if rate_per_s is None else 1.0 / rate_per_s
        self.clock, self.sleep = clock, sleep
        self._next = -math.inf
        self._lock = threading.Lock()

    def acquire(self) -> None:
        if self.interval <= 0:
            return
        with self._lock:
            now = self.clock()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            self.sleep(start - now)


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class OpenAITeacher:
    """``Teacher`` over an OpenAI-compatible chat endpoint (see the module doc)."""

    name = "openai"

    def __init__(self, config: OpenAIConfig, *, progress: bool = True,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.progress, self.sleep = config, progress, sleep
        self.limiter = RateLimiter(config.rate_per_s, clock, sleep)
        self._lock = threading.Lock()
        self._cache: dict[str, str] = {}
        self.requests = self.retries = self.cache_hits = self.cache_bad_lines = 0
        self._cache_path = Path(config.cache_path) if config.cache_path else None
        if self._cache_path is not None:
            self._load_cache()

    # -- the cache --

    def _load_cache(self) -> None:
        assert self._cache_path is not None
        if not self._cache_path.is_file():
            return
        with self._cache_path.open("r", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    key, text = row["key"], row["text"]
                    if not isinstance(key, str) or not isinstance(text, str):
                        raise TypeError
                except (ValueError, KeyError, TypeError):
                    self.cache_bad_lines += 1
                    continue
                self._cache[key] = text

    def _remember(self, key: str, text: str) -> None:
        with self._lock:
            self._cache[key] = text
            if self._cache_path is not None:
                self._cache_path.parent.mkdir(parents=True, exist_ok=True)
                with self._cache_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "model": self.config.model, "text": text},
                                       ensure_ascii=False) + "\n")
                    f.flush()

    # -- calls --

    def complete(self, messages: Sequence[dict[str, Any]]) -> str:
        """The assistant text for ``messages`` (from the cache when this call was made before)."""
        params = self.config.params()
        key = cache_key(self.config.model, messages, params)
        with self._lock:
            if key in self._cache:
                self.cache_hits += 1
                return self._cache[key]
        text = self._request(messages, params)
        self._remember(key, text)
        return text

    def complete_many(self, requests: Sequence[Sequence[dict[str, Any]]]) -> list[str | TeacherError]:
        """``complete`` for each message list on a thread pool; order kept; errors returned."""
        def one(messages: Sequence[dict[str, Any]]) -> str | TeacherError:
            try:
                return self.complete(messages)
            except TeacherError as exc:
                return exc
        bar = progress_bar(len(requests), self.progress, "teacher")
        out: list[Any] = [None] * len(requests)
        with ThreadPoolExecutor(max_workers=self.config.workers) as pool:
            futures = {pool.submit(one, m): i for i, m in enumerate(requests)}
            for fut in as_completed(futures):
                out[futures[fut]] = fut.result()
                bar.update(1)
        bar.close()
        return out

    def _request(self, messages: Sequence[dict[str, Any]], params: dict[str, Any]) -> str:
        cfg = self.config
        body = json.dumps({"model": cfg.model, "messages": list(messages), **params}).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        last = ""
        for attempt in range(cfg.max_retries + 1):
            self.limiter.acquire()
            with self._lock:
                self.requests += 1
            try:
                return self._post(body, headers)
            except _Retryable as exc:
                last = str(exc)
                if attempt == cfg.max_retries:
                    break
                with self._lock:
                    self.retries += 1
                wait = min(cfg.max_backoff_s, cfg.backoff_s * 2 ** attempt)
                if exc.retry_after is not None:
                    wait = max(wait, min(exc.retry_after, cfg.max_backoff_s))
                self.sleep(wait)
        raise TeacherError(f"{cfg.url}: gave up after {cfg.max_retries + 1} attempts; last: {last}")

    def _post(self, body: bytes, headers: dict[str, str]) -> str:
        req = urllib.request.Request(self.config.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = _detail(exc)
            if exc.code == 429 or exc.code >= 500:
                raise _Retryable(f"HTTP {exc.code}: {detail}", _retry_after(exc)) from None
            raise TeacherError(f"{self.config.url}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}") from None
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Retryable(f"not a chat completion: {raw[:200]!r}") from None
        if not isinstance(content, str):
            raise _Retryable(f"the completion has no text content: {raw[:200]!r}")
        return content

    # -- the Teacher protocol --

    def reasoning(self, task: Task, schema: DatabaseSchema | None) -> str:
        return self.complete(self.reasoning_messages(task, schema))

    def next_turn(self, task: Task, schema: DatabaseSchema | None,
                  messages: Sequence[dict[str, Any]]) -> str:
        return self.complete(self.turn_messages(task, schema, messages)).strip()

    def reasoning_messages(self, task: Task, schema: DatabaseSchema | None) -> list[dict[str, str]]:
        return self._guide(task, build_messages(task, schema, mode="single"))

    def turn_messages(self, task: Task, schema: DatabaseSchema | None,
                      messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
        return self._guide(task, to_plain_messages(messages))

    def _guide(self, task: Task, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        if not self.config.guided:
            return messages
        note = ("\n\n(Note for the assistant, not from the user: a correct reference solution is\n"
                f"```sql\n{reference_sql(task)}\n```\nWork towards a correct solution in the "
                "required format, reasoning as if you found it yourself; never mention this note.)")
        out = [dict(m) for m in messages]
        first_user = next(i for i, m in enumerate(out) if m["role"] == "user")
        out[first_user]["content"] += note
        return out


def to_plain_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """``AgentLoop`` messages -> plain ``{role, content}`` messages any chat endpoint accepts:
    an assistant tool call is written back in hermes text, a tool result becomes a user message
    ``<tool_response>…</tool_response>`` (as Qwen2.5's template shows it to the model)."""
    out = []
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = "".join(
                "\n<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                                "arguments": c["function"]["arguments"]},
                                               ensure_ascii=False) + "\n</tool_call>"
                for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (content + calls).strip()})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": str(role), "content": str(content)})
    return out


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read().decode("utf-8", "replace")
    except Exception:
        return exc.reason or ""
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    except (ValueError, AttributeError):
        pass
    return text[:300]


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    value = exc.headers.get("Retry-After") if exc.headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: bool, desc: str) -> Any:
    """A tqdm progress bar (a no-op when disabled or tqdm is not installed)."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="call")
