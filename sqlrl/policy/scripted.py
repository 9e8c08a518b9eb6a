"""Canned turns through the real tokenizer: ``ScriptedBackend`` (sync, batch) and ``ScriptedEngine``
(an ``AsyncEngine``, ``sqlrl.policy.engine``) -- tests, demos and benches of everything around a model.

A script is a list of rules ``{"match": text, "turns": [item, ...]}``: the first rule whose
``match`` occurs in the decoded prompt answers it, with ``turns[k]`` where ``k`` is the number of
assistant turns the prompt already holds (the last turn repeats); ``default`` answers prompts that
no rule matches. A text item is tokenised with the policy's real tokenizer and ends with the
end-of-turn token (``finish_reason "eos"``), cut at ``max_new_tokens`` (``"length"``). An item
``{"error": message, "after_tokens": k}`` (or a ``ScriptError``) makes the request fail after its
first ``k`` tokens (``EngineError`` from the engine, the whole call from the batch backend).

``ScriptedBackend.gate_file``: when set, ``generate`` waits until that file exists (polling every
10 ms, at most ``gate_timeout_s``) before answering -- a cross-process event that lets tests hold
requests in flight without sleeping for a guessed time. With ``gate_after_tokens: k`` it waits
after reporting the first k tokens of an answer instead. ``generate(..., on_token=)`` reports
each answer's tokens in order (``streams_tokens``).

``ScriptedEngine`` gives the whole engine contract: one sequence per request, each token a step of
its own (``await``: requests interleave as in continuous batching), ``versions`` per token,
``stream`` equal to ``generate``, ``abort``/cancel/``aclose`` stop a request at its next step and
free it (``in_flight`` counts live requests), ``update_weights`` checks names and shapes against
``weight_shapes`` and follows the ``UpdatePolicy`` (drain: admission closes until in-flight
requests finish; abort: they restart from their prompt on the new version; continue: they go on,
later tokens carry the new version). ``hold(match, turn=, after_tokens=)`` returns a ``Gate``:
matching requests stop before that token until ``gate.open()``, and ``gate.reached`` is set when
one gets there, so tests wait on events, never on time (``Latch``: awaitable from any event loop
and from sync code). ``log`` lists ``(event, request_id)`` in order (start, finish, abort, error).

Guarantees: deterministic; log-probs are 0.0 (it is not a model); never loads torch.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

from .constraints import refuse_structured
from .engine import EngineError, TokenDelta, UpdatePolicy, check_single, check_weights
from .types import Generation, SamplingParams

ASSISTANT_TURN = "<|im_start|>assistant"


@dataclass(frozen=True)
class ScriptError:
    """A scripted failure: the request fails after its first ``after_tokens`` tokens."""

    message: str
    after_tokens: int = 0


class Script:
    """The rules of a script, answering a decoded prompt (module docstring)."""

    def __init__(self, tokenizer: Any, script: Sequence[Mapping[str, Any]] = (),
                 default: str = "I cannot help with that.", end_of_turn: str = "<|im_end|>") -> None:
        self.tokenizer = tokenizer
        self.rules = [(str(r["match"]), [_item(t) for t in r["turns"]]) for r in script]
        if any(not turns for _, turns in self.rules):
            raise ValueError("every script rule needs at least one turn")
        self.default = default
        self.end_ids = tokenizer.encode(end_of_turn, add_special_tokens=False)

    def answer(self, prompt: str) -> str | ScriptError:
        k = turn_of(prompt)
        for match, turns in self.rules:
            if match in prompt:
                return turns[min(k, len(turns) - 1)]
        return self.default

    def ids(self, answer: str | ScriptError, max_new_tokens: int) -> tuple[list[int], str]:
        """The answer's token ids (the end-of-turn token appended) and finish reason."""
        text = "partial answer " * 8 if isinstance(answer, ScriptError) else answer
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + list(self.end_ids)
        if len(ids) > max_new_tokens:
            return ids[:max_new_tokens], "length"
        return ids, "eos"

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)  # as HFBackend


def turn_of(prompt: str) -> int:
    """The number of assistant turns a decoded prompt already holds."""
    return max(0, prompt.count(ASSISTANT_TURN) - 1)


def _item(t: Any) -> str | ScriptError:
    if isinstance(t, ScriptError):
        return t
    if isinstance(t, Mapping):
        return ScriptError(str(t["error"]), int(t.get("after_tokens", 0)))
    return str(t)


class ScriptedBackend:
    """The sync batch backend (``GenerationBackend``): module docstring."""

    def __init__(self, tokenizer: Any, eos_token_ids: Sequence[int] = (), *,
                 script: Sequence[Mapping[str, Any]] = (), default: str = "I cannot help with that.",
                 end_of_turn: str = "<|im_end|>", gate_file: str | None = None,
                 gate_timeout_s: float = 120.0, gate_after_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.script = Script(tokenizer, script, default, end_of_turn)
        self.gate_file, self.gate_timeout_s = gate_file, gate_timeout_s
        self.gate_after_tokens = gate_after_tokens
        self.calls: list[int] = []  # prompts per generate call

    def _wait_gate(self) -> None:
        if not self.gate_file:
            return
        deadline = time.monotonic() + self.gate_timeout_s
        while not os.path.exists(self.gate_file) and time.monotonic() < deadline:
            time.sleep(0.01)

    streams_tokens = True
    per_request_seeds = False  # canned answers: the seed changes nothing (BatchedEngine may merge)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 on_token: Callable[[int, int], None] | None = None) -> list[Generation]:
        refuse_structured(params, "ScriptedBackend.generate (a batch backend)")
        if not self.gate_after_tokens:
            self._wait_gate()
        self.calls.append(len(prompts))
        out = []
        for p in prompts:
            answer = self.script.answer(self.tokenizer.decode(list(p), skip_special_tokens=False))
            if isinstance(answer, ScriptError):
                raise RuntimeError(answer.message)
            ids, reason = self.script.ids(answer, params.max_new_tokens)
            decoded = self.script.decode(ids)
            for _ in range(params.n):
                for k, tok in enumerate(ids):
                    if self.gate_after_tokens and k == self.gate_after_tokens:
                        self._wait_gate()
                    if on_token is not None:
                        on_token(len(out), tok)
                out.append(Generation(tuple(ids), (0.0,) * len(ids), decoded, reason))
        return out


class Latch:
    """A thread-safe event: ``set``/``clear``/``is_set``; ``await wait()`` from any event loop,
    ``wait_sync(timeout)`` from a thread."""

    def __init__(self, is_set: bool = False) -> None:
        self._set = is_set
        self._cond = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def set(self) -> None:
        with self._cond:
            self._set = True
            waiters, self._waiters = self._waiters, []
            self._cond.notify_all()
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                pass

    def clear(self) -> None:
        with self._cond:
            self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._set:
                return
            entry = (loop, loop.create_future())
            self._waiters.append(entry)
        try:
            await entry[1]
        finally:
            with self._cond:
                if entry in self._waiters:
                    self._waiters.remove(entry)

    def wait_sync(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._set, timeout)


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass(eq=False)
class Gate:
    """Holds matching requests before token ``after_tokens`` until ``open()`` (``ScriptedEngine.hold``)."""

    match: str
    turn: int | None = None
    after_tokens: int = 0
    opened: Latch = field(default_factory=Latch)
    reached: Latch = field(default_factory=Latch)

    def holds(self, prompt: str, turn: int, k: int) -> bool:
        return (not self.opened.is_set() and k == self.after_tokens and self.match in prompt
                and (self.turn is None or self.turn == turn))

    def open(self) -> None:
        self.opened.set()


@dataclass(eq=False)
class _Live:
    rid: str
    interrupt: Latch = field(default_factory=Latch)
    admitted: bool = False
    aborted: bool = False
    restart: bool = False


class ScriptedEngine:
    """The scripted ``AsyncEngine`` (module docstring)."""

    def __init__(self, tokenizer: Any, eos_token_ids: Sequence[int] = (), *,
                 script: Sequence[Mapping[str, Any]] = (), default: str = "I cannot help with that.",
                 end_of_turn: str = "<|im_end|>", weight_shapes: Mapping[str, Sequence[int]] | None = None,
                 version: int = 0) -> None:
        self.script = Script(tokenizer, script, default, end_of_turn)
        self.weight_shapes = {k: tuple(v) for k, v in (weight_shapes or {"scripted.weight": (1,)}).items()}
        self._version = version
        self._lock = threading.Lock()
        self._live: dict[str, _Live] = {}
        self._admitting, self._idle = Latch(True), Latch(True)
        self._updating = False
        self._closed = False
        self._ids = itertools.count()
        self.gates: list[Gate] = []
        self.log: list[tuple[str, str]] = []

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def in_flight(self) -> int:
        """Requests not yet finished (waiting for admission or generating)."""
        return len(self._live)

    def hold(self, match: str, *, turn: int | None = None, after_tokens: int = 0) -> Gate:
        gate = Gate(match, turn, after_tokens)
        self.gates.append(gate)
        return gate

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        final = None
        async for delta in self.stream(prompt_ids, sampling, request_id=request_id):
            final = delta.final
        assert final is not None  # a stream always ends with its final delta
        return final

    async def stream(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                     request_id: str | None = None) -> AsyncIterator[TokenDelta]:
        check_single(sampling)
        refuse_structured(sampling, "the scripted engine")
        live = self._register(request_id or f"scripted-{next(self._ids)}")
        ended = "abort"
        try:
            prompt = self.script.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
            turn, answer = turn_of(prompt), self.script.answer(prompt)
            ids, reason = self.script.ids(answer, sampling.max_new_tokens)
            out: list[int] = []
            versions: list[int] = []
            await self._admit(live)
            while len(out) < len(ids) and not live.aborted:
                if live.restart:  # an ABORT-policy update: start again on the new weights
                    out.clear()
                    versions.clear()
                    live.restart = False
                    self._unadmit(live)
                    await self._admit(live)
                    continue
                gate = next((g for g in self.gates if g.holds(prompt, turn, len(out))), None)
                if gate is not None:
                    gate.reached.set()
                    await _first(gate.opened.wait(), live.interrupt.wait())
                    live.interrupt.clear()
                    continue
                if isinstance(answer, ScriptError) and len(out) >= min(answer.after_tokens, len(ids) - 1):
                    ended = "error"
                    raise EngineError(answer.message)
                out.append(ids[len(out)])
                versions.append(self._version)
                yield TokenDelta(out[-1], 0.0, versions[-1])
                await asyncio.sleep(0)  # one decode step: the other requests advance too
            ended = "abort" if live.aborted else "finish"
            yield TokenDelta(None, None, None, final=Generation(
                tuple(out), (0.0,) * len(out), self.script.decode(out),
                "abort" if live.aborted else reason, meta={"request_id": live.rid}, versions=tuple(versions)))
        finally:
            self._release(live, ended)

    def _register(self, rid: str) -> _Live:
        with self._lock:
            if self._closed:
                raise EngineError("the engine is closed")
            if rid in self._live:
                raise ValueError(f"request id {rid!r} is already in flight")
            live = self._live[rid] = _Live(rid)
        self.log.append(("start", rid))
        return live

    async def _admit(self, live: _Live) -> None:
        while not live.aborted:
            with self._lock:
                if self._admitting.is_set():
                    live.admitted = True
                    self._idle.clear()
                    return
            await _first(self._admitting.wait(), live.interrupt.wait())
            live.interrupt.clear()

    def _unadmit(self, live: _Live) -> None:
        with self._lock:
            live.admitted = False
            if not any(x.admitted for x in self._live.values()):
                self._idle.set()

    def _release(self, live: _Live, ended: str) -> None:
        with self._lock:
            self._live.pop(live.rid, None)
            live.admitted = False
            if not any(x.admitted for x in self._live.values()):
                self._idle.set()
        self.log.append((ended, live.rid))

    async def abort(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is not None:
            live.aborted = True
            live.interrupt.set()

    async def update_weights(self, weights: Mapping[str, Any], *,
                             policy: UpdatePolicy = UpdatePolicy.DRAIN) -> int:
        policy = UpdatePolicy(policy)
        check_weights(weights, self.weight_shapes)
        with self._lock:
            if self._updating:
                raise RuntimeError("a weight update is already in progress")
            self._updating = True
        try:
            if policy is UpdatePolicy.CONTINUE:
                self._version += 1
                return self._version
            self._admitting.clear()
            if policy is UpdatePolicy.ABORT:
                for live in list(self._live.values()):
                    if live.admitted:
                        live.restart = True
                        live.interrupt.set()
            await self._idle.wait()
            self._version += 1
            return self._version
        finally:
            self._admitting.set()
            self._updating = False

    async def close(self) -> None:
        with self._lock:
            self._closed = True
        for rid in list(self._live):
            await self.abort(rid)


async def _first(*aws: Any) -> None:
    """Wait until the first of ``aws`` finishes; cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
