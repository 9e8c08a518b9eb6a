"""``ModelServer``: one named model as a Ray Serve deployment, with dynamic batching.

Every generation -- a chat completion, or one round of an SQL agent's loop -- goes through one
``@serve.batch`` queue: concurrent requests' prompts are merged into one ``backend.generate`` call
(prompts with equal sampling parameters share a call; a request with an explicit ``seed`` is
generated alone so that its result does not depend on what it was batched with). The batch runs
in a worker thread, so the replica keeps accepting requests (and forming the next batch) while
the model works; ``max_concurrent_batches=1`` keeps one generation at a time per replica.

The SQL agent runs in a thread per request; its backend hands each round's prompts to the batch
queue on the replica's event loop, so rounds of different requests are batched together too.

Errors: a client error comes back as ``("error", status, body)`` (OpenAI shape) -- never as a
Ray exception -- and the ingress forwards it unchanged.

Backends: ``hf`` (CPU default), ``vllm`` (GPU, by configuration; **unverified here**),
``scripted`` (tests). Streaming is done by the ingress from the finished completion (the HF
backend does not stream tokens, so the first chunk arrives when generation has finished).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ray import serve

from . import metrics
from .config import ServeConfig, load_serve_config
from .engine import SQL_BODIES, ModelEngine
from .openai_chat import APIError, ChatRequest, error_body


class ModelServer:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        import torch

        from sqlrl.policy.backends import make_backend
        from sqlrl.policy.load import load_policy

        self.config: ServeConfig = load_serve_config(config)
        spec = self.config.models[name]
        torch.set_num_threads(max(1, spec.torch_threads))
        policy = load_policy(spec.path, dtype=spec.dtype)
        self.backend = make_backend(spec.backend, policy, **dict(spec.backend_options))
        self.engine = ModelEngine(name, policy, self.backend, self.config)
        self.name = name
        self._generate_batch.set_max_batch_size(spec.max_batch_size)
        self._generate_batch.set_batch_wait_timeout_s(spec.batch_wait_timeout_s)
        self.batch_sizes: list[int] = []
        # Two pools, never one: request threads block on the batch queue, and the batch must still
        # find a thread to generate in (a shared default pool deadlocks once it is full).
        self._gen_pool = ThreadPoolExecutor(1, thread_name_prefix="generate")
        self._req_pool = ThreadPoolExecutor(spec.max_ongoing_requests + 1, thread_name_prefix="request")
        self.inflight = 0  # requests inside chat()/sql() now (tests wait on it, not on time)

    # -- the batch queue -------------------------------------------------------------------------

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def _generate_batch(self, items: list[tuple[list[int], Any]]) -> list[list[Any]]:
        groups: dict[Any, list[int]] = {}
        for i, (_, params) in enumerate(items):
            key = (params, i) if params.seed is not None else (params, -1)
            groups.setdefault(key, []).append(i)
        out: list[list[Any]] = [[] for _ in items]
        self.batch_sizes.append(len(items))
        metrics.record("batch", len(items), model=self.name)
        for (params, _), idx in groups.items():
            t0 = time.perf_counter()
            try:
                gens = await asyncio.get_running_loop().run_in_executor(
                    self._gen_pool, self.backend.generate, [items[i][0] for i in idx], params)
            except Exception as exc:  # e.g. a prompt too long: only this group fails
                for i in idx:
                    out[i] = exc  # type: ignore[assignment]
                continue
            dt = time.perf_counter() - t0
            n_tok = sum(len(g.token_ids) for g in gens)
            metrics.record("tokens", n_tok, model=self.name)
            if dt > 0:
                metrics.record("tps", n_tok / dt, model=self.name)
            for j, i in enumerate(idx):
                out[i] = gens[j * params.n:(j + 1) * params.n]
        return out

    async def _generate_one(self, prompt: list[int], params: Any) -> list[Any]:
        got = await self._generate_batch((list(prompt), params))
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
            req = ChatRequest.model_validate(body)
            gen = self._threadsafe_generate(asyncio.get_running_loop())
            return ("ok", 200, await self._in_thread(self.engine.chat, req, gen))
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

    async def stats(self) -> dict[str, Any]:
        return {"batch_sizes": list(self.batch_sizes), "inflight": self.inflight,
                "backend_calls": list(getattr(self.backend, "calls", []))}
