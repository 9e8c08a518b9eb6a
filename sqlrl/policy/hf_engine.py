"""``HFEngine``: the ``AsyncEngine`` for a local transformers model (continuous batching on CPU or GPU).

Requests from any event loop go to one ``hf_scheduler.Scheduler`` thread that decodes a running
batch and admits waiting requests at every step (that module's docstring says how); each event
of a request (a token, its end, its failure) is handed to the loop that submitted it with
``call_soon_threadsafe``, so callers on several loops at once (a Ray actor, a FastAPI app,
``asyncio.run``) are fine. The decode machinery is ``HFBackend``'s (prefill through the prefix
cache, ``sample_tokens``, ``finish_reason``): one copy of that code for both.

Why not transformers' own continuous batching (``transformers.generation.continuous_batching``,
``model.init_continuous_batching`` / ``ContinuousBatchingManager``, tried in 5.19 on the tiny
model): its log-probs (``ContinuousBatchingConfig(return_logprobs=True)``) are the processed
ones, but sampling is ``torch.multinomial`` over the whole batch from the process-global RNG seeded
once per engine (``ContinuousBatchingConfig.seed`` calls ``torch.manual_seed``), so a request's
samples change with whoever else is in flight; it has no stop strings (only EOS and
``max_new_tokens``), no weight-update API, rejects our GQA attention, and one request with a bad
token id stops its generation loop for every request. docs/agent.md ("HF engine") has the details.

Guarantees (on top of ``sqlrl.policy.engine`` and ``HFBackend``'s):
- A request's tokens and log-probs are those ``HFBackend.generate([prompt], sampling)`` gives it
  alone: greedy tokens equal, log-probs to float error (both are the processed distribution's,
  equal to ``score``; a token whose cumulative mass is within float error of ``top_p`` may fall
  on either side of the nucleus in two computations, docs/agent.md); a seeded sampled request draws from its own generator, seeded
  ``row_seed(seed, 0, 0)`` as ``HFBackend`` seeds a one-prompt call, so its tokens do not depend
  on the other requests in flight (``seed=None``: a fresh seed, reported in ``meta["seed"]``).
- Bad input raises ``ValueError`` from ``generate``/``stream`` before it reaches the engine: ``n != 1``,
  an empty prompt, non-integer or out-of-vocabulary ids, prompt + ``max_new_tokens`` over the
  model's positions (the message says "exceeds the model's N positions", which serving answers with
  400 ``context_length_exceeded``); a duplicate in-flight ``request_id``.
- ``abort``/cancelling ``generate``/closing ``stream`` early remove the row at the next step and free
  its KV (``stats()``: ``running``, ``kv_positions``); ``await abort(id)`` returns once it is removed.
- ``update_weights`` checks every name and shape against the model (each parameter, or one of its
  tied aliases, must be given; unknown names and shape mismatches are refused) and raises
  ``ValueError`` before anything loads; each load clears the prefix cache and returns the new version.
- ``sampling.structured`` (a grammar, ``sqlrl.policy.constraints``): the request's logits are masked
  to the grammar every step before temperature/top-p (xgrammar, one matcher per request, compiled
  off the event loop and cached by grammar text); its tokens follow the grammar and its log-probs
  are the masked distribution's. A grammar that does not compile is a ``ValueError`` from
  ``generate``/``stream``.
- ``meta`` of a result: ``request_id``, ``seed``, ``admitted_step``/``finished_step`` (the
  scheduler's sampling-step counter), ``restarts`` (regenerations after an ``ABORT`` update).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from concurrent.futures import Future
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

from .engine import EngineError, TokenDelta, UpdatePolicy, check_engine_class, check_single
from .hf_backend import DEFAULT_MAX_CACHED_TOKENS, HFBackend
from .hf_scheduler import EngineStats, Op, Request, Scheduler
from .types import Generation, SamplingParams, row_seed

_ids = itertools.count()


class HFEngine:
    """Continuous batching over ``HFBackend``'s decode steps for a ``sqlrl.policy.load.Policy``."""

    def __init__(self, policy: Any, *, prefix_cache: bool = True, max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS,
                 max_batch: int = 64, step_hook: Callable[[int], None] | None = None,
                 backend: HFBackend | None = None) -> None:
        # ``backend``: decode through this HFBackend (its prefix cache included) instead of a new one
        # (``HFBackend.async_engine``); the cache options are then the backend's own.
        self.backend = backend if backend is not None else HFBackend(
            policy, prefix_cache=prefix_cache, max_cached_tokens=max_cached_tokens)
        self.policy = policy
        self._scheduler = Scheduler(self.backend, max_batch=max_batch, step_hook=step_hook)
        self._in_flight: set[str] = set()
        self._grammars: Any = None  # constraints.GrammarMasks, built at the first constrained request

    async def _compiled(self, sampling: SamplingParams) -> Any:
        """The compiled grammar of ``sampling.structured`` (None: free), compiled off the loop;
        ``ValueError`` when it does not compile -- before the engine sees the request."""
        if sampling.structured is None:
            return None
        if self._grammars is None:
            from .constraints import GrammarMasks

            self._grammars = await asyncio.to_thread(GrammarMasks, self.backend.tokenizer, self.backend.vocab_size,
                                                     sorted(self.backend.eos_ids))
        return await asyncio.to_thread(self._grammars.compile, sampling.structured)

    @property
    def policy_version(self) -> int:
        return self._scheduler.version

    # ------------------------------------------------------------------ requests
    def _submit(self, prompt_ids: Sequence[int], sampling: SamplingParams, request_id: str | None,
                streamed: bool, grammar: Any = None) -> tuple[Request, asyncio.Queue]:
        check_single(sampling)
        prompt = self.backend._check([prompt_ids], "prompt")[0]
        self.backend.check_length(len(prompt), sampling.max_new_tokens)
        rid = request_id if request_id is not None else f"hf-{next(_ids)}"
        if rid in self._in_flight:
            raise ValueError(f"request id {rid!r} is already in flight")
        seed = sampling.seed if sampling.seed is not None else random.SystemRandom().getrandbits(62)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def deliver(event: tuple) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the caller's loop is gone: nobody wants the rest
                if event[0] == "token":
                    self._abort_soon(rid)

        req = Request(id=rid, prompt=prompt, sampling=sampling, seed=row_seed(seed, 0, 0), deliver=deliver,
                      streamed=streamed, grammar=grammar,
                      make_matcher=None if grammar is None else self._grammars.matcher)
        self._scheduler.submit(req)
        self._in_flight.add(rid)
        return req, events

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        check_single(sampling)
        grammar = await self._compiled(sampling)
        req, events = self._submit(prompt_ids, sampling, request_id, streamed=False, grammar=grammar)
        try:
            kind, payload = await events.get()
        except asyncio.CancelledError:
            self._abort_soon(req.id)
            raise
        finally:
            self._in_flight.discard(req.id)
        if kind == "error":
            raise payload
        return payload

    async def stream(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                     request_id: str | None = None) -> AsyncIterator[TokenDelta]:
        check_single(sampling)
        grammar = await self._compiled(sampling)
        req, events = self._submit(prompt_ids, sampling, request_id, streamed=True, grammar=grammar)
        ended = False
        try:
            while True:
                event = await events.get()
                if event[0] == "token":
                    yield TokenDelta(*event[1:])
                    continue
                ended = True
                if event[0] == "error":
                    raise event[1]
                yield TokenDelta(None, None, None, final=event[1])
                return
        finally:
            self._in_flight.discard(req.id)
            if not ended:  # closed early (aclose, a dropped client) or cancelled
                self._abort_soon(req.id)

    def _abort_soon(self, request_id: str) -> None:
        try:
            self._scheduler.control(Op("abort", request_id=request_id))
        except EngineError:
            pass  # closed: nothing runs any more

    async def _control(self, op: Op) -> Any:
        op.done = Future()
        self._scheduler.control(op)
        return await asyncio.wrap_future(op.done)

    async def abort(self, request_id: str) -> None:
        await self._control(Op("abort", request_id=request_id))

    async def stats(self) -> EngineStats:
        """A snapshot after every control call submitted before this one was applied."""
        return await self._control(Op("snapshot"))

    # ------------------------------------------------------------------ weights
    async def update_weights(self, weights: Mapping[str, Any], *,
                             policy: UpdatePolicy = UpdatePolicy.DRAIN) -> int:
        policy = UpdatePolicy(policy)
        pairs = matched_weights(self.backend.model, weights)
        return await self._control(Op("update", weights=pairs, policy=policy))

    async def close(self) -> None:
        self._scheduler.request_close()
        await asyncio.to_thread(self._scheduler.join)


def matched_weights(model: Any, weights: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    """``(target tensor, new value)`` for every entry of ``weights``, or ``ValueError`` naming the
    unknown names, the parameters given under no name (tied aliases count once) and the wrong shapes."""
    import torch

    if not isinstance(weights, Mapping):
        raise ValueError(f"weights must be a mapping of names to tensors, got {type(weights).__name__}")
    targets = model.state_dict(keep_vars=True)
    unknown = sorted(k for k in weights if k not in targets)
    not_tensors = sorted(k for k, v in weights.items() if k in targets and not isinstance(v, torch.Tensor))
    shapes = sorted(f"{k} {tuple(v.shape)} (model: {tuple(targets[k].shape)})" for k, v in weights.items()
                    if k in targets and isinstance(v, torch.Tensor) and tuple(v.shape) != tuple(targets[k].shape))
    names_of: dict[int, list[str]] = {}
    for name, t in targets.items():
        names_of.setdefault(id(t), []).append(name)
    missing = sorted(names[0] for names in names_of.values() if not any(n in weights for n in names))
    problems = [f"{what}: {', '.join(items[:5])}{' ...' if len(items) > 5 else ''}"
                for what, items in (("unknown names", unknown), ("missing", missing),
                                    ("not tensors", not_tensors), ("wrong shapes", shapes)) if items]
    if problems:
        raise ValueError("weights do not fit this model: " + "; ".join(problems))
    return [(targets[k].data, v) for k, v in weights.items()]


def make_hf_engine(policy: Any, seed: int | None = None, **options: Any) -> HFEngine:
    """The ``"hf"`` engine for ``policy`` (``seed`` is unused: every request is seeded from its own
    ``SamplingParams.seed``); options go to ``HFEngine`` (``prefix_cache``, ``max_cached_tokens``,
    ``max_batch``, ``step_hook``)."""
    return HFEngine(policy, **options)


check_engine_class(HFEngine)
