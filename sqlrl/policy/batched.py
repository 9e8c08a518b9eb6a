"""``BatchedEngine``: any sync batch ``GenerationBackend`` as an ``AsyncEngine`` -- transitional.

The native engines (``sqlrl.policy.hf_engine``, ``sqlrl.policy.vllm_engine``) admit a request at
the next decode step; until every backend has one, this adapter lets each existing batch backend
(``HFBackend``, ``VLLMBackend``, a test's or a bench's backend) run under the per-trajectory
agent loop. ``as_engine(backend)`` returns an ``AsyncEngine`` unchanged and wraps anything else.

How it batches: requests wait in a queue; when no call is running, the queue's first request and
every queued request with the same ``SamplingParams`` go into ONE ``backend.generate`` call on the
adapter's worker thread (one call at a time, so a backend is never called concurrently by it);
requests that arrive while a call runs wait for the next call. Requests that arrive in the same
event-loop step go into the same call (the call starts one step after the first of them).

Guarantees (``sqlrl.policy.engine``'s contract, with the limits of a batch call):
- seeds stay per request: requests with different seeds are never merged into one call (a batch
  backend derives each row's seed from the call's seed and the row's index, so merging them would
  make a request's sample depend on its neighbours) -- except with ``merge_seeds=True``, for a
  backend that ignores the seed anyway (vLLM's CPU build samples from its engine-wide generator:
  ``VLLMBackend.per_request_seeds`` False; ``as_engine`` reads that declaration, default True).
  So a seeded workload gets one call per seed on a seeded backend (HF; vLLM on GPU): exact, not
  batched -- the native engines batch it.
- ``versions``: every token of a call carries the version loaded when the call started.
- a backend that declares ``thread_bound`` (``VLLMBackend`` with its engine in this process, on
  CPU: vLLM's CPU attention checks the OpenMP thread count of the thread that calls it) is called
  on the requests' event-loop thread (``inline``), the thread that runs ``AgentLoop.run``, instead
  of the worker thread; the loop is blocked for the call (a lock-step call anyway).
- an exception from a call (or a call returning the wrong number of generations) fails every
  request of that call with ``EngineError`` (the message names the cause); other calls go on.
- ``abort``/cancel of a queued request removes it at once (``generate`` returns ``"abort"`` with no
  tokens; a cancelled caller gets ``CancelledError``); of a request in a running call, when that
  call returns (a batch call cannot stop one row): ``"abort"`` with the tokens it produced.
  ``in_flight`` counts queued and running requests.
- ``stream`` yields every token when the call returns (a batch call has no steps to report), then
  the final ``Generation``, equal to ``generate``'s.
- ``close`` refuses new requests, aborts the queued ones, waits for the running call and then runs
  ``close_backend`` (the registry's engines own their backend: vLLM's engine goes with them).
- ``update_weights`` needs ``load_weights`` and ``weight_shapes`` (the registry gives them); the
  weights are checked (``check_weights``) before anything loads; admission closes, the running
  call finishes (``drain``) or is redone from its prompts on the new weights once it returns
  (``abort``); ``continue`` is ``drain`` here (a batch call cannot switch weights mid-call; the
  versions say so truthfully).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

from .engine import AsyncEngine, EngineError, ProvidesEngine, TokenDelta, UpdatePolicy, check_engine_class, check_single, check_weights
from .constraints import refuse_structured
from .types import Generation, GenerationBackend, SamplingParams


@dataclass(eq=False)
class _Request:
    rid: str
    prompt: list[int]
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    queue: asyncio.Queue | None = None  # a stream's deltas
    aborted: bool = False
    redo: bool = False  # an ABORT-policy update: generate again on the new weights
    deltas: list[TokenDelta] = field(default_factory=list)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class BatchedEngine:
    """A batch backend as an ``AsyncEngine`` (module docstring)."""

    def __init__(self, backend: GenerationBackend, *, merge_seeds: bool = False,
                 load_weights: Callable[[Mapping[str, Any]], None] | None = None,
                 weight_shapes: Callable[[], Mapping[str, Sequence[int]]] | None = None,
                 close_backend: Callable[[], None] | None = None, version: int = 0,
                 inline: bool = False) -> None:
        self.backend = backend
        # inline: batch calls run on the caller's event-loop thread (blocking it for the call), for a
        # backend bound to the thread that made it (``thread_bound``: an in-process vLLM engine on
        # CPU, whose attention kernels check the OpenMP thread count of the calling thread)
        self.inline = inline
        self._close_backend = close_backend  # the registry's engines own their backend
        self.merge_seeds = merge_seeds
        self._load, self._shapes = load_weights, weight_shapes
        self._version = version
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlrl-batched")
        self._lock = threading.Lock()
        self._queue: list[_Request] = []
        self._running: list[_Request] = []
        self._requests: dict[str, _Request] = {}
        self._busy = self._paused = self._updating = self._closed = False
        self._ids = 0
        self.batch_sizes: list[int] = []  # prompts per backend.generate call, in order

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    # -- requests ----------------------------------------------------------------------------

    def _submit(self, prompt_ids: Sequence[int], sampling: SamplingParams, request_id: str | None,
                stream: bool) -> _Request:
        check_single(sampling)
        refuse_structured(sampling, "the lock-step adapter (BatchedEngine)")
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise EngineError("the engine is closed")
            if request_id is None:
                self._ids += 1
                request_id = f"batched-{self._ids}"
            if request_id in self._requests:
                raise ValueError(f"request id {request_id!r} is already in flight")
            r = _Request(request_id, [int(t) for t in prompt_ids], sampling, loop, loop.create_future(),
                         asyncio.Queue() if stream else None)
            self._requests[request_id] = r
            self._queue.append(r)
        loop.call_soon(self._kick)  # one step later: requests of the same step share the call
        return r

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        r = self._submit(prompt_ids, sampling, request_id, stream=False)
        try:
            return await r.future
        except asyncio.CancelledError:
            self._abort(r.rid)
            raise

    async def stream(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                     request_id: str | None = None) -> AsyncIterator[TokenDelta]:
        r = self._submit(prompt_ids, sampling, request_id, stream=True)
        assert r.queue is not None
        done = False
        try:
            while True:
                item = await r.queue.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                yield item
                if item.final is not None:
                    done = True
                    return
        finally:
            if not done:
                self._abort(r.rid)

    async def abort(self, request_id: str) -> None:
        self._abort(request_id)

    def _abort(self, rid: str) -> None:
        with self._lock:
            r = self._requests.get(rid)
            if r is None:
                return
            r.aborted = True
            if r not in self._queue:
                return  # in a running call: "abort" when it returns
            self._queue.remove(r)
            del self._requests[rid]
        self._send(r.loop, [(r, Generation((), (), "", "abort", meta={"request_id": rid}))])

    # -- the worker ----------------------------------------------------------------------------

    def _key(self, sampling: SamplingParams) -> SamplingParams:
        return replace(sampling, seed=None) if self.merge_seeds else sampling

    def _kick(self) -> None:
        with self._lock:
            if self._busy or self._paused or not self._queue:
                return
            key = self._key(self._queue[0].sampling)
            group = [r for r in self._queue if self._key(r.sampling) == key]
            self._queue = [r for r in self._queue if self._key(r.sampling) != key]
            self._running, self._busy = group, True
            version = self._version
            self.batch_sizes.append(len(group))
        if self.inline:  # on the requests' loop, as its own step (no recursion through _call's _kick)
            group[0].loop.call_soon_threadsafe(self._call, group, version)
        else:
            self._worker.submit(self._call, group, version)

    def _call(self, group: list[_Request], version: int) -> None:
        results: list[Generation | BaseException]
        try:
            gens = list(self.backend.generate([r.prompt for r in group], group[0].sampling))
            if len(gens) != len(group):
                raise RuntimeError(f"the backend returned {len(gens)} generations for {len(group)} prompts (n=1)")
            results = [replace(g, versions=(version,) * len(g.token_ids),
                               finish_reason="abort" if r.aborted else g.finish_reason,
                               meta={**g.meta, "request_id": r.rid}) for r, g in zip(group, gens)]
        except Exception as exc:
            err = EngineError(_describe(exc))
            err.__cause__ = exc
            results = [err] * len(group)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Request, Any]]] = {}
        with self._lock:
            redo = [r for r in group if r.redo and not r.aborted]
            for r in redo:
                r.redo = False
            self._queue[:0] = redo
            for r, res in zip(group, results):
                if r not in redo:
                    self._requests.pop(r.rid, None)
                    by_loop.setdefault(r.loop, []).append((r, res))
            self._running, self._busy = [], False
        for loop, items in by_loop.items():
            self._send(loop, items)
        self._kick()  # the requests that queued during this call

    def _send(self, loop: asyncio.AbstractEventLoop, items: list[tuple[_Request, Any]]) -> None:
        """Deliver results on their caller's loop, all of one loop in one step."""
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # that loop is gone: nobody waits for these any more
            pass

    # -- weights and shutdown ------------------------------------------------------------------

    async def update_weights(self, weights: Mapping[str, Any], *,
                             policy: UpdatePolicy = UpdatePolicy.DRAIN) -> int:
        policy = UpdatePolicy(policy)
        if self._load is None or self._shapes is None:
            raise NotImplementedError(f"{type(self.backend).__name__} was wrapped without a weight "
                                      "loader (sqlrl.policy.backends.make_engine gives one)")
        check_weights(weights, self._shapes())
        with self._lock:
            if self._updating:
                raise RuntimeError("a weight update is already in progress")
            self._updating = self._paused = True
            if policy is UpdatePolicy.ABORT:
                for r in self._running:
                    r.redo = True
        try:
            await asyncio.wrap_future(self._worker.submit(self._apply, weights))
            return self._version
        finally:
            with self._lock:
                self._updating = self._paused = False
            self._kick()

    def _apply(self, weights: Mapping[str, Any]) -> None:
        assert self._load is not None
        self._load(weights)
        self._version += 1

    async def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            queued = list(self._queue)
        for r in queued:
            self._abort(r.rid)
        await asyncio.wrap_future(self._worker.submit(self._close_backend or (lambda: None)))  # after the running call
        self._worker.shutdown(wait=False)


def _deliver(items: list[tuple[_Request, Any]]) -> None:
    for r, res in items:
        if r.queue is not None:
            if isinstance(res, BaseException):
                r.queue.put_nowait(res)
            else:
                for tok, lp, v in zip(res.token_ids, res.logprobs, res.versions or (None,) * len(res.token_ids)):
                    r.queue.put_nowait(TokenDelta(tok, lp, v))
                r.queue.put_nowait(TokenDelta(None, None, None, final=res))
        if not r.future.done():
            if isinstance(res, BaseException):
                r.future.set_exception(res)
                r.future.exception()  # retrieved: a stream's or a cancelled caller's future is never awaited
            else:
                r.future.set_result(res)


check_engine_class(BatchedEngine)


def as_engine(backend: Any, **options: Any) -> tuple[AsyncEngine, bool]:
    """``(engine, owned)``: ``backend`` itself when it is an ``AsyncEngine`` (``owned`` False); else the
    backend's native engine when it provides one (``ProvidesEngine``: ``HFBackend`` -> ``HFEngine``),
    else a new ``BatchedEngine`` over it (``owned`` True either way: the caller closes it)."""
    if isinstance(backend, AsyncEngine):
        return backend, False
    if isinstance(backend, ProvidesEngine):  # a native engine over the same model (HFBackend -> HFEngine)
        return backend.async_engine(), True
    if not callable(getattr(backend, "generate", None)):
        raise TypeError(f"{type(backend).__name__} is neither an AsyncEngine nor a GenerationBackend "
                        "(it has no generate method)")
    # a backend that declares it ignores per-call seeds (VLLMBackend on vLLM's CPU build, the
    # scripted one) loses nothing by merging requests of different seeds into one call
    options.setdefault("merge_seeds", not getattr(backend, "per_request_seeds", True))
    # a backend bound to the thread that made it (an in-process vLLM engine on CPU) is called there
    options.setdefault("inline", bool(getattr(backend, "thread_bound", False)))
    return BatchedEngine(backend, **options), True
