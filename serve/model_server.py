"""``ModelServer``: one named model as a Ray Serve deployment, with dynamic batching.

Every generation -- a chat completion (streamed or not), or one round of an SQL agent's loop --
goes through one ``@serve.batch`` method, and from there to a single runner that generates one
call at a time: each call takes **every** batch that is pending (up to ``max_batch_size``
prompts). Ray 2.60's ``@serve.batch`` alone forms a batch from what arrived within
``batch_wait_timeout_s`` and then holds it until the previous batch is done (its
``max_concurrent_batches`` semaphore), so under load the requests that arrive during a
generation end up in several small batches queued one behind another; merging them at the
runner makes them share the next call (continuous batching at request granularity; measured in
bench/serve.py). The wait window can therefore stay at 0: a lone request is not delayed, and
requests that arrive while the model works are merged anyway. Prompts with equal sampling
parameters share one ``backend.generate`` call; a request with an explicit ``seed`` is generated
alone so that its result does not depend on what it was batched with. Generation runs in a
worker thread, so the replica keeps accepting requests while the model works.

The SQL agent runs in a thread per request; its backend hands each round's prompts to the batch
queue on the replica's event loop, so rounds of different requests are batched together too.

Errors: a client error comes back as ``("error", status, body)`` (OpenAI shape) -- never as a
Ray exception -- and the ingress forwards it unchanged.

Backends: ``hf`` (CPU default), ``vllm`` (GPU, by configuration; **unverified here**),
``scripted`` (tests). Streaming (``chat_stream``) is token by token: the batch's generation
call reports every sampled token (``generate_streaming``) to the request it belongs to, whose
deltas (``serve/streaming.py``) go out as the tokens arrive -- a streamed request is batched like
any other.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator

from ray import serve

from sqlrl.policy.backends import generate_streaming

from . import metrics
from .config import ServeConfig, load_serve_config
from .engine import SQL_BODIES, ModelEngine, context_error
from .openai_chat import APIError, ChatRequest, chunk, error_body
from .streaming import ChoiceStream


async def token_events(queue: asyncio.Queue, task: asyncio.Future) -> AsyncIterator[Any]:
    """The items put on ``queue`` until ``task`` is done and the queue is drained. Tokens are put
    with ``call_soon_threadsafe`` before the generation thread returns, so none is lost."""
    while True:
        if task.done():
            while not queue.empty():
                yield queue.get_nowait()
            return
        getter = asyncio.ensure_future(queue.get())
        await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
        elif not getter.cancelled():
            yield getter.result()


class ModelServer:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        import torch

        from sqlrl.agent.prompts import checkpoint_schema_style
        from sqlrl.policy.backends import make_backend, place_policy
        from sqlrl.policy.load import load_policy

        self.config: ServeConfig = load_serve_config(config)
        spec = self.config.models[name]
        torch.set_num_threads(max(1, spec.torch_threads))
        policy = place_policy(load_policy(spec.path, dtype=spec.dtype), spec.device, spec.backend)
        self.backend = make_backend(spec.backend, policy, **dict(spec.backend_options))
        self.engine = ModelEngine(name, policy, self.backend, self.config,
                                  schema_style=checkpoint_schema_style(spec.path))
        self.name = name
        self._generate_batch.set_max_batch_size(spec.max_batch_size)
        self._generate_batch.set_batch_wait_timeout_s(spec.batch_wait_timeout_s)
        self.max_batch_size = spec.max_batch_size
        self._pending: list[tuple[list[Any], asyncio.Future]] = []  # Serve's batches, not yet generated
        self._runner: asyncio.Future | None = None
        # prompts per generation call, the most recent 10,000 (a replica runs for weeks: bounded)
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=10_000)
        self.generation = {"calls": 0, "seconds": 0.0, "tokens": 0}  # time inside backend.generate
        # Two pools, never one: request threads block on the batch queue, and the batch must still
        # find a thread to generate in (a shared default pool deadlocks once it is full).
        self._gen_pool = ThreadPoolExecutor(1, thread_name_prefix="generate")
        self._req_pool = ThreadPoolExecutor(spec.max_ongoing_requests + 1, thread_name_prefix="request")
        self.inflight = 0  # requests inside chat()/sql() now (tests wait on it, not on time)

    # -- the batch queue -------------------------------------------------------------------------

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.0, max_concurrent_batches=4096)
    async def _generate_batch(self, items: list[tuple[list[int], Any, Any]]) -> list[Any]:
        """Serve's batch of (prompt, params, on_token or None); on_token(sample, token_id) streams.
        Handed to the runner, which merges it with every batch formed while the model was busy."""
        done = asyncio.get_running_loop().create_future()
        self._pending.append((items, done))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run_pending())
        return await done

    async def _run_pending(self) -> None:
        """One generation at a time: each call takes all pending batches (up to max_batch_size
        prompts; a batch is never split), so requests that arrive while the model works share
        the next call instead of queueing behind one another in small batches."""
        while self._pending:
            take, size = [], 0
            while self._pending and (not take or size + len(self._pending[0][0]) <= self.max_batch_size):
                entry = self._pending.pop(0)
                take.append(entry)
                size += len(entry[0])
            items = [item for batch, _ in take for item in batch]
            try:
                out = await self._generate_items(items)
            except Exception as exc:  # never leave a caller waiting
                out = [exc] * len(items)
            k = 0
            for batch, done in take:
                if not done.done():
                    done.set_result(out[k:k + len(batch)])
                k += len(batch)

    async def _generate_items(self, items: list[tuple[list[int], Any, Any]]) -> list[Any]:
        """One merged call: prompts with equal sampling parameters share a ``backend.generate``
        (a request with a seed is generated alone); a failing group fails only its requests."""
        groups: dict[Any, list[int]] = {}
        for i, (_, params, _sink) in enumerate(items):
            key = (params, i) if params.seed is not None else (params, -1)
            groups.setdefault(key, []).append(i)
        out: list[Any] = [[] for _ in items]
        self.batch_sizes.append(len(items))
        metrics.record("batch", len(items), model=self.name)
        for (params, _), idx in groups.items():
            t0 = time.perf_counter()
            sinks = [items[i][2] for i in idx]
            prompts = [items[i][0] for i in idx]
            if any(sinks):
                def on_token(row: int, tok: int, sinks: list = sinks, n: int = params.n) -> None:
                    if (sink := sinks[row // n]) is not None:
                        sink(row % n, tok)
                call = functools.partial(generate_streaming, self.backend, prompts, params, on_token)
            else:
                call = functools.partial(self.backend.generate, prompts, params)
            try:
                gens = await asyncio.get_running_loop().run_in_executor(self._gen_pool, call)
            except Exception as exc:  # e.g. a prompt too long: only this group fails
                for i in idx:
                    out[i] = exc
                continue
            dt = time.perf_counter() - t0
            n_tok = sum(len(g.token_ids) for g in gens)
            self.generation["calls"] += 1
            self.generation["seconds"] += dt
            self.generation["tokens"] += n_tok
            metrics.record("tokens", n_tok, model=self.name)
            if dt > 0:
                metrics.record("tps", n_tok / dt, model=self.name)
            for j, i in enumerate(idx):
                out[i] = gens[j * params.n:(j + 1) * params.n]
        return out

    async def _generate_one(self, prompt: list[int], params: Any, sink: Any = None) -> list[Any]:
        got = await self._generate_batch((list(prompt), params, sink))
        if isinstance(got, Exception):
            raise got
        return got

    def _threadsafe_generate(self, loop: asyncio.AbstractEventLoop):
        def generate(prompts: Any, params: Any) -> list[Any]:
            futures = [asyncio.run_coroutine_threadsafe(self._generate_one(list(p), params), loop)
                       for p in prompts]
            return [g for f in futures for g in f.result()]
        return generate

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._req_pool, fn, *args)

    # -- endpoints (called by the ingress through handles) --------------------------------------

    async def chat(self, body: dict[str, Any]) -> tuple:
        self.inflight += 1
        try:
            plan = self.engine.chat_plan(ChatRequest.model_validate(body))  # on the loop: no thread hop
            try:
                gens = await self._generate_one(plan.ids, plan.params)
            except ValueError as exc:  # prompt too long for the model, bad ids
                raise context_error(exc) from None
            return ("ok", 200, self.engine.chat_result(plan, gens))
        except APIError as exc:
            return ("error", exc.status, exc.body())
        finally:
            self.inflight -= 1

    async def sql(self, kind: str, body: dict[str, Any]) -> tuple:
        self.inflight += 1
        try:
            parsed = SQL_BODIES[kind].model_validate(body)
            gen = self._threadsafe_generate(asyncio.get_running_loop())
            result = await self._in_thread(self.engine.sql, kind, parsed, gen)
            usage = result["usage"]
            metrics.record("turns", usage["turns"], model=self.name)
            metrics.record("tool_calls", usage["tool_calls"], model=self.name)
            return ("ok", 200, result)
        except APIError as exc:
            return ("error", exc.status, exc.body())
        except Exception as exc:  # pydantic ValidationError: the ingress validated already
            return ("error", 400, error_body(400, str(exc)))
        finally:
            self.inflight -= 1

    async def chat_stream(self, body: dict[str, Any]) -> AsyncIterator[Any]:
        """Streamed chat: first ``("ok", 200, None)`` or ``("error", status, body)``, then
        ``chat.completion.chunk`` dicts as tokens are generated (the request still shares its
        generation call with the batch), the finish chunks and, if asked, the usage chunk."""
        self.inflight += 1
        try:
            try:
                req = ChatRequest.model_validate(body)
                plan = self.engine.chat_plan(req)
            except APIError as exc:
                yield ("error", exc.status, exc.body())
                return
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()
            task = asyncio.ensure_future(self._generate_one(plan.ids, plan.params, lambda sample, tok:
                                         loop.call_soon_threadsafe(queue.put_nowait, (sample, tok))))
            events = token_events(queue, task)
            first = await anext(events, None)
            if first is None and task.exception() is not None:
                exc = task.exception()
                api = context_error(exc) if isinstance(exc, ValueError) else APIError(500, str(exc))
                yield ("error", api.status, api.body())
                return
            yield ("ok", 200, None)
            n, cid, created = plan.params.n, f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
            streams = [ChoiceStream(plan.prefix, plan.stops, plan.tool_names) for _ in range(n)]
            ids: list[list[int]] = [[] for _ in range(n)]
            tokenizer = self.engine.policy.tokenizer
            for i in range(n):
                yield chunk(cid, created, self.name, i, {"role": "assistant", "content": ""})
            batch = [first] if first is not None else []
            async for event in events:
                batch.append(event)
                if not queue.empty():
                    continue  # more tokens are waiting: decode once for all of them
                for sample in sorted({s for s, _ in batch}):
                    ids[sample].extend(tok for s, tok in batch if s == sample)
                    text = tokenizer.decode(ids[sample], skip_special_tokens=True)
                    for delta in streams[sample].update(text):
                        yield chunk(cid, created, self.name, sample, delta)
                batch = []
            gens = task.result()
            for i, g in enumerate(gens):
                deltas, reason = streams[i].finish(g.text, g.finish_reason)
                for delta in deltas:
                    yield chunk(cid, created, self.name, i, delta)
                yield chunk(cid, created, self.name, i, {}, reason)
            if (req.stream_options or {}).get("include_usage"):
                done = sum(len(g.token_ids) for g in gens)
                yield chunk(cid, created, self.name, None, None, usage={
                    "prompt_tokens": len(plan.ids), "completion_tokens": done,
                    "total_tokens": len(plan.ids) + done})
        finally:
            self.inflight -= 1

    async def stats(self) -> dict[str, Any]:
        return {"batch_sizes": list(self.batch_sizes), "inflight": self.inflight,
                "generation": dict(self.generation),
                "pending": sum(len(batch) for batch, _ in self._pending),
                "backend_calls": list(getattr(self.backend, "calls", []))}
