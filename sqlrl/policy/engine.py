"""The async generation engine contract: ONE sequence per call, continuous batching underneath.

Every generation in sqlrl -- rollouts, held-out evaluation, serving and the gateway -- goes through an
``AsyncEngine``: a trajectory (a coroutine) awaits ``generate`` for its own next turn, and the engine
admits it into its running batch at the next decode step; nobody waits for a round of others. This
module is the contract only (Ray-free, torch-free, vLLM-free); the engines live beside it and are
registered in ``sqlrl.policy.backends`` (``check_engine_class`` runs at registration).

The contract every engine gives (on top of ``sqlrl.policy.types``: exact sampled ids, sampling
log-probs, stop strings kept, ``"stop"``/``"length"``/``"eos"``):
- ``generate(prompt_ids, sampling, request_id=None)`` generates ONE sequence (``sampling.n`` must be
  1; a caller wanting k samples makes k calls, each with its own seed, e.g. ``row_seed``). The
  result's ``versions[i]`` is the policy version that produced ``token_ids[i]``
  (``len(versions) == len(token_ids)``).
- ``stream(...)`` is the same request as an async iterator of ``TokenDelta`` (each new token with
  its log-prob and version, in order), ending with a ``TokenDelta`` whose ``final`` holds the whole
  ``Generation`` (equal to what ``generate`` would have returned). Closing the iterator early
  (``aclose``, a dropped client) aborts the request in the engine.
- ``abort(request_id)``: the request stops at the engine's next step and frees its KV; its pending
  ``generate`` returns the tokens so far with ``finish_reason == "abort"``. Cancelling the task
  that awaits ``generate`` aborts the request too. Unknown or finished ids are a no-op.
- ``update_weights(weights, policy=...)`` loads new weights into the RUNNING engine under a declared
  ``UpdatePolicy`` and returns the new ``policy_version``; weights that do not match the model
  (missing/unknown names, wrong shapes) raise ``ValueError`` before the engine sees any of them
  (``check_weights(weights, shapes)`` does the check and names what does not fit).
- Failures are per request: an engine error while generating one sequence raises from that
  request's ``generate`` (``EngineError``) and never from anyone else's.
- An engine may be awaited from any event loop, and from several at once (a Ray actor's loop, a
  FastAPI app's, ``asyncio.run`` in a sync wrapper): implementations bound to one loop run it on a
  thread of their own (``EngineLoop``).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Coroutine, Mapping, Protocol, Sequence, TypeVar, runtime_checkable

from .types import Generation, SamplingParams

T = TypeVar("T")


class UpdatePolicy(str, enum.Enum):
    """What a weight update does to the sequences in flight.

    - ``DRAIN`` (default, exactly on-policy): stop admitting, let in-flight sequences finish on the
      old weights, load, resume; requests that arrived meanwhile start on the new weights.
    - ``ABORT``: abort in-flight sequences, load, resume; the engine regenerates each aborted
      request from its prompt on the new weights, so the caller still gets one whole ``Generation``
      (every token's version is the new one).
    - ``CONTINUE`` (async RL): in-flight sequences keep decoding on the new weights; each token's
      ``versions`` entry says which weights produced it, so the learner can mask or reweight.
    """

    DRAIN = "drain"
    ABORT = "abort"
    CONTINUE = "continue"


class EngineError(RuntimeError):
    """A request failed inside the engine (the message names the cause); other requests go on."""


@dataclass(frozen=True)
class TokenDelta:
    """One step of a streamed request: a new token, or the end (``final`` set, ``token_id`` None)."""

    token_id: int | None
    logprob: float | None
    version: int | None
    final: Generation | None = None


@runtime_checkable
class AsyncEngine(Protocol):
    """One model's generation service (module docstring: the contract)."""

    @property
    def policy_version(self) -> int: ...

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation: ...

    def stream(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
               request_id: str | None = None) -> AsyncIterator[TokenDelta]: ...

    async def abort(self, request_id: str) -> None: ...

    async def update_weights(self, weights: Mapping[str, Any], *,
                             policy: UpdatePolicy = UpdatePolicy.DRAIN) -> int: ...

    async def close(self) -> None: ...


@runtime_checkable
class ProvidesEngine(Protocol):
    """An optional capability of a batch ``GenerationBackend``: the native ``AsyncEngine`` over the
    same model and state (``HFBackend`` -> ``HFEngine`` sharing its prefix cache). Callers that are
    handed a batch backend (``AgentLoop``) use it instead of the transitional batching adapter."""

    def async_engine(self) -> AsyncEngine: ...


_ASYNC_METHODS = ("generate", "abort", "update_weights", "close")
_STREAM_METHODS = ("stream",)


def check_engine_class(cls: type) -> type:
    """``cls`` when it implements ``AsyncEngine``; else ``TypeError`` naming every missing or wrongly
    shaped member (called when an engine registers, so a gap is an error at import, never an
    ``AttributeError`` mid-rollout)."""
    problems = []
    if not isinstance(getattr(cls, "policy_version", None), property):
        problems.append("policy_version (a read-only property)")
    for name in _ASYNC_METHODS:
        member = getattr(cls, name, None)
        if member is None:
            problems.append(f"{name} (missing)")
        elif not inspect.iscoroutinefunction(member):
            problems.append(f"{name} (must be 'async def')")
    for name in _STREAM_METHODS:
        member = getattr(cls, name, None)
        if member is None:
            problems.append(f"{name} (missing)")
        elif not (inspect.isasyncgenfunction(member) or callable(member)) or inspect.iscoroutinefunction(member):
            problems.append(f"{name} (must return an async iterator, not be a coroutine)")
    if problems:
        raise TypeError(f"{cls.__module__}.{cls.__qualname__} does not implement AsyncEngine: "
                        + "; ".join(problems))
    return cls


def check_single(sampling: SamplingParams) -> None:
    """``ValueError`` unless ``sampling`` asks for one sequence (the engine contract)."""
    if sampling.n != 1:
        raise ValueError(f"an engine request generates one sequence (sampling.n == 1), got n={sampling.n}: "
                         "make n requests, each with its own seed")


def check_weights(weights: Mapping[str, Any], shapes: Mapping[str, Sequence[int]]) -> None:
    """``ValueError`` unless ``weights`` has exactly the names of ``shapes``, each value with that
    ``.shape`` (a full state dict): the message names what is missing, unknown or misshapen. Engines
    call it before any weight reaches the model."""
    missing = sorted(set(shapes) - set(weights))
    unknown = sorted(set(weights) - set(shapes))
    wrong = []
    for name in sorted(set(shapes) & set(weights)):
        shape = getattr(weights[name], "shape", None)
        if shape is None or tuple(shape) != tuple(shapes[name]):
            wrong.append(f"{name}: {None if shape is None else tuple(shape)} != {tuple(shapes[name])}")
    if missing or unknown or wrong:
        parts = [f"{label} {items[:5]}{' ...' if len(items) > 5 else ''}"
                 for label, items in (("missing", missing), ("unknown", unknown), ("wrong shape", wrong)) if items]
        raise ValueError("the weights do not fit this model: " + "; ".join(parts))


class EngineLoop:
    """A private event loop on a daemon thread, for engines bound to one loop (vLLM's ``AsyncLLM``, a
    scheduler's futures): ``await engine_loop.run(coro)`` runs ``coro`` there from any caller's loop,
    and cancelling the caller cancels it there. ``call(coro)`` does the same from sync code."""

    def __init__(self, name: str = "sqlrl-engine") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)


def run_sync(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to completion from sync code that is not inside an event loop (the sync
    wrappers: ``AgentLoop.run``); inside a running loop it raises ``RuntimeError`` (await instead)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        async def _wrap() -> T:
            return await awaitable
        return asyncio.run(_wrap())
    if inspect.iscoroutine(awaitable):
        awaitable.close()  # never started: no "was never awaited" warning
    raise RuntimeError("run_sync was called inside a running event loop: await the coroutine instead")
