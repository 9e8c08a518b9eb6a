"""``ModelServer``: one named model as a Ray Serve deployment, on ONE async engine per replica.

The replica loads its model and builds its ``AsyncEngine`` with training's code
(``ModelSpec.policy``: ``PolicySpec.load`` / ``PolicySpec.engine``; ``HFEngine``, ``VLLMEngine``,
or the scripted engine for tests; ``serve/engines.py`` says what serving needs of each) and
calls it directly from its event loop: every chat choice, stream and SQL-agent turn is its own
engine request, which joins the engine's running batch at its next step (continuous batching
inside the engine; no batch queue or batch runner here).
Streaming is token by token from ``engine.stream`` on every backend, vLLM included. A vLLM
replica loads no HF model beside the engine (tokenizer and end tokens only:
``PolicySpec.load(weights=False)``), so it holds one copy of the weights, vLLM's.

Cancellation reaches the engine: when the ingress gives up on a request (the client went away,
or ``limits.request_timeout_s`` passed) it cancels the call, and the coroutine here is cancelled,
which cancels its engine requests (the engine aborts them and frees their KV). The replica also
enforces ``request_timeout_s`` itself (504 ``timeout``), so work the ingress abandoned does not
keep running if a cancel is lost on the way. ``stats()`` reports the requests inside the
replica (``inflight``) and the sequences the engine holds (``running``, from the engine's own
state: a test checks that an aborted request was freed).

Errors: a client error comes back as ``("error", status, body)`` (OpenAI shape) -- never as a
Ray exception -- and the ingress forwards it unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator

from pydantic import ValidationError

from . import metrics
from .config import ServeConfig, load_serve_config
from .completions import CompletionRequest, text_chunk, text_plan, text_result
from .engine import ModelEngine
from .sql_agent import SQL_BODIES
from .engines import build_served
from .openai_chat import APIError, ChatRequest, error_body


def timeout_error(seconds: float) -> APIError:
    return APIError(504, f"the request did not finish within {seconds} s", code="timeout")


class ModelServer:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        import torch

        from sqlrl.agent.prompts import checkpoint_schema_style

        self.config: ServeConfig = load_serve_config(config)
        spec = self.config.models[name]
        torch.set_num_threads(max(1, spec.torch_threads))
        served = build_served(spec)  # vLLM: its own copy of the weights only
        self.kind, self.engine, policy = served.kind, served.engine, served.policy
        self.model = ModelEngine(name, policy, self.engine, self.config,
                                 schema_style=checkpoint_schema_style(spec.policy.model),
                                 window=self.kind.window(self.engine, policy), too_long=self.kind.too_long,
                                 constrains=self.kind.constrains)
        self.name = name
        self.timeout_s = self.config.limits.request_timeout_s
        self.inflight = 0  # requests inside chat()/sql()/chat_stream() now (tests wait on it)

    def _enter(self) -> float:
        self.inflight += 1
        metrics.record("batch", self.inflight, model=self.name)
        return time.perf_counter()

    def _generated(self, tokens: int, t0: float) -> None:
        metrics.record("tokens", tokens, model=self.name)
        dt = time.perf_counter() - t0
        if dt > 0:
            metrics.record("tps", tokens / dt, model=self.name)

    async def _bounded(self, coro: Any) -> Any:
        """``coro`` within ``request_timeout_s`` (cancelled past it: its engine requests abort)."""
        try:
            return await asyncio.wait_for(coro, self.timeout_s)
        except asyncio.TimeoutError:
            raise timeout_error(self.timeout_s) from None

    # -- endpoints (called by the ingress through handles) --------------------------------------

    async def _whole(self, make_plan: Any, result: Any) -> tuple:
        t0 = self._enter()
        try:
            plan = make_plan()
            out = result(plan, await self._bounded(self.model.generate(plan)))
            self._generated(out["usage"]["completion_tokens"], t0)
            return ("ok", 200, out)
        except APIError as exc:
            return ("error", exc.status, exc.body())
        except ValidationError as exc:  # the ingress validated already
            return ("error", 400, error_body(400, str(exc)))
        finally:
            self.inflight -= 1

    async def chat(self, body: dict[str, Any]) -> tuple:
        return await self._whole(lambda: self.model.chat_plan(ChatRequest.model_validate(body)),
                                 self.model.chat_result)

    async def completions(self, body: dict[str, Any]) -> tuple:
        """``/v1/completions`` (``serve/completions.py``), like ``chat``."""
        return await self._whole(lambda: text_plan(self.model, CompletionRequest.model_validate(body)),
                                 lambda plan, gens: text_result(self.model, plan, gens))

    async def sql(self, kind: str, body: dict[str, Any]) -> tuple:
        t0 = self._enter()
        try:
            try:
                parsed = SQL_BODIES[kind].model_validate(body)
            except Exception as exc:  # pydantic ValidationError: the ingress validated already
                return ("error", 400, error_body(400, str(exc)))
            result = await self._bounded(self.model.sql(kind, parsed))
            usage = result["usage"]
            self._generated(usage["generated_tokens"], t0)
            metrics.record("turns", usage["turns"], model=self.name)
            metrics.record("tool_calls", usage["tool_calls"], model=self.name)
            return ("ok", 200, result)
        except APIError as exc:
            return ("error", exc.status, exc.body())
        finally:
            self.inflight -= 1

    async def chat_stream(self, body: dict[str, Any]) -> AsyncIterator[Any]:
        """Streamed chat: first ``("ok", 200, None)`` or ``("error", status, body)``, then
        ``chat.completion.chunk`` dicts as tokens are generated, the finish chunks and, if asked,
        the usage chunk. Past ``request_timeout_s``, an ``("error", 504, body)`` item ends it;
        closing it early (the client went away) aborts the engine requests."""
        def make() -> tuple[Any, bool]:
            req = ChatRequest.model_validate(body)
            return self.model.chat_plan(req), bool((req.stream_options or {}).get("include_usage"))
        async with contextlib.aclosing(self._stream(make, None)) as items:
            async for item in items:
                yield item

    async def completions_stream(self, body: dict[str, Any]) -> AsyncIterator[Any]:
        """Streamed ``/v1/completions``: as ``chat_stream``, with ``text_completion`` chunks."""
        def make() -> tuple[Any, bool]:
            req = CompletionRequest.model_validate(body)
            return text_plan(self.model, req), bool((req.stream_options or {}).get("include_usage"))
        async with contextlib.aclosing(self._stream(make, text_chunk)) as items:
            async for item in items:
                yield item

    async def _stream(self, make: Any, convert: Any) -> AsyncIterator[Any]:
        t0 = self._enter()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        chunks: Any = None
        try:
            try:
                plan, include_usage = make()
                chunks = self.model.chat_chunks(plan, include_usage,
                                                on_done=lambda tokens: self._generated(tokens, t0))
                first = await self._bounded(anext(chunks))
            except APIError as exc:
                yield ("error", exc.status, exc.body())
                return
            except ValidationError as exc:  # the ingress validated already
                yield ("error", 400, error_body(400, str(exc)))
                return
            yield ("ok", 200, None)
            item = first
            while True:
                if (out := convert(item) if convert is not None else item) is not None:
                    yield out
                try:
                    item = await asyncio.wait_for(anext(chunks), max(0.0, deadline - loop.time()))
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    yield ("error", 504, timeout_error(self.timeout_s).body())
                    break
                except APIError as exc:
                    yield ("error", exc.status, exc.body())
                    break
        finally:
            self.inflight -= 1
            if chunks is not None:
                with contextlib.suppress(Exception):
                    await chunks.aclose()  # closes the engine streams: their requests abort

    async def stats(self) -> dict[str, Any]:
        return {"inflight": self.inflight, "running": await self.kind.running(self.engine)}
