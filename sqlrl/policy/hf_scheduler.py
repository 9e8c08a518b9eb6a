"""The continuous-batching scheduler behind ``HFEngine``: one decode loop on its own thread.

``Scheduler`` owns a running batch (one row per request: its KV in a growing cache, its attention
mask, its next position and the logits its next token is drawn from) and runs iterations of:

1. **Control** (in submission order): aborts (the row leaves the batch and its KV is freed; a
   waiting request is dropped), barriers/snapshots, weight updates (``UpdatePolicy``).
2. **Admission**: every waiting request (up to ``max_batch`` rows) is prefilled through the
   ``HFBackend``'s prefix cache and joins the batch -- left-padded to the batch's width
   (``hf_kv.stack_rows``), positions counted per row, so its tokens are what it would get alone.
   A prefill that raises is retried request by request: only the culprit fails (``EngineError``).
3. **Sample** one token per row (``hf_backend.sample_tokens``: the processed log-probs, each row
   from its own seeded generator; a row with a grammar, ``SamplingParams.structured``, has its
   logits masked by its ``constraints.Matcher`` first, so it draws from -- and reports the log-probs
   of -- the masked distribution, and the matcher then accepts the token), deliver it, end rows on eos/stop/length (storing their KV in
   the prefix cache when all of it came from the current weights) and drop them from the batch.
4. A ``CONTINUE`` weight update loads here, between sampling and the next forward.
5. **Decode**: one forward for the rows left. An exception there ends the rows of that batch
   with ``EngineError``; the scheduler goes on with new requests.

So a request submitted while others decode joins at the next iteration (no round to wait for),
and a finished row leaves at once. Every token records ``version``, the weights whose logits it
was drawn from (loads happen only when no logits are pending, or after sampling). ``step_hook(step)``
(optional) is called on the scheduler thread after every sampling step: tests block it on an event
to submit work at a known step, never by timing.

Weight updates: ``DRAIN`` stops admission, lets the batch finish on the old weights, then loads
(updates queued behind it wait for it); ``ABORT`` removes every running row, loads, and puts the
requests back at the head of the queue from their prompts, reseeded (a streamed request that has
already delivered tokens ends with ``"abort"`` instead: delivered tokens cannot be taken back);
``CONTINUE`` loads between two steps. Every load clears the prefix cache and bumps ``version``.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .engine import EngineError, UpdatePolicy
from .hf_backend import HFBackend, sample_tokens, stop_strings
from .hf_kv import stack_rows, trim_left
from .types import Generation, SamplingParams


@dataclass(eq=False)
class Request:
    """One engine request (mutable, owned by the scheduler thread once submitted)."""

    id: str
    prompt: list[int]
    sampling: SamplingParams
    seed: int
    deliver: Callable[[tuple], None]  # thread-safe: puts an event on the caller's loop
    streamed: bool = False
    gen: Any = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    kv_version: int = -1  # the weights its earliest KV came from
    admitted_step: int = -1
    restarts: int = 0
    grammar: Any = None  # a compiled grammar (``constraints.GrammarMasks.compile``) or None
    make_matcher: Callable[[Any], Any] | None = None
    matcher: Any = None

    def reset(self) -> None:
        import torch

        self.gen = torch.Generator().manual_seed(self.seed)
        self.ids, self.logprobs, self.versions = [], [], []
        if self.grammar is not None and self.make_matcher is not None:
            self.matcher = self.make_matcher(self.grammar)  # from the start of the grammar


@dataclass(frozen=True)
class EngineStats:
    """A snapshot taken on the scheduler thread between iterations."""

    running: int
    waiting: int
    kv_positions: int  # cache positions held (rows x width, padding included); 0 when nothing runs
    steps: int
    version: int
    cached_prefix_tokens: int


@dataclass(eq=False)
class Op:
    kind: str  # "abort" | "update" | "snapshot"
    done: Future | None = None
    request_id: str | None = None
    weights: Sequence[tuple[Any, Any]] = ()
    policy: UpdatePolicy = UpdatePolicy.DRAIN


class Scheduler:
    def __init__(self, backend: HFBackend, *, max_batch: int = 64,
                 step_hook: Callable[[int], None] | None = None) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
        self.backend, self.max_batch, self.step_hook = backend, max_batch, step_hook
        self.cv = threading.Condition()
        self.waiting: deque[Request] = deque()
        self.ops: deque[Op] = deque()
        self.closed = False
        self.version = 0
        self.steps = 0
        self.rows: list[Request] = []
        self.cache = self.mask = self.next_pos = self.logits = self.tokens = None
        self._draining: Op | None = None
        self._held: list[Op] = []  # updates queued behind a drain
        self._continue: list[Op] = []
        self._thread = threading.Thread(target=self._run, name="sqlrl-hf-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ called from any thread
    def submit(self, req: Request) -> None:
        self._enqueue(self.waiting, req)

    def control(self, op: Op) -> None:
        self._enqueue(self.ops, op)

    def _enqueue(self, queue: deque, item: Any) -> None:
        with self.cv:
            if self.closed:
                raise EngineError("the engine is closed")
            queue.append(item)
            self.cv.notify()

    def request_close(self) -> None:
        """Stop after the current iteration; everything still held ends with ``EngineError``."""
        with self.cv:
            self.closed = True
            self.cv.notify()

    def join(self) -> None:
        self._thread.join()

    # ------------------------------------------------------------------ the scheduler thread
    def _run(self) -> None:
        import torch

        while True:
            with self.cv:
                while not (self.closed or self.ops or self.rows or (self.waiting and self._draining is None)
                           or (self._draining is not None and not self.rows)):
                    self.cv.wait()
                if self.closed:
                    break
                ops = list(self.ops)
                self.ops.clear()
            try:
                with torch.inference_mode(), self.backend._attention_kernels():
                    self._iterate(ops)
            except Exception:  # a bug in the loop itself: end the batch it was running, keep serving
                rows = list(self.rows)
                self._drop(list(range(len(rows))))
                self._fail(rows, _error())
        self._shutdown()

    def _iterate(self, ops: list[Op]) -> None:
        for op in ops:
            self._apply(op)
        while self._draining is not None and not self.rows:
            self._finish_drain()
        self._admit()
        if self.rows:
            self._sample()
            for op in self._continue:
                self._load(op)
            self._continue.clear()
            self._decode()

    def _apply(self, op: Op) -> None:
        if op.kind == "abort":
            self._abort(op.request_id)
        elif op.kind == "update":
            if self._draining is not None:
                self._held.append(op)
            else:
                self._start_update(op)
            return
        _resolve(op.done, self.snapshot() if op.kind == "snapshot" else None)

    def _abort(self, request_id: str | None) -> None:
        for b, req in enumerate(self.rows):
            if req.id == request_id:
                self._drop([b])
                self._finish(req, "abort")
                return
        with self.cv:
            found = [r for r in self.waiting if r.id == request_id]
            for r in found:
                self.waiting.remove(r)
        for r in found:
            self._finish(r, "abort")

    def _start_update(self, op: Op) -> None:
        if op.policy is UpdatePolicy.DRAIN:
            self._draining = op
        elif op.policy is UpdatePolicy.CONTINUE:
            if self.rows:
                self._continue.append(op)
            else:
                self._load(op)
        else:  # ABORT
            rows = list(self.rows)
            self._drop(list(range(len(rows))))
            again = []
            for req in rows:
                if req.streamed and req.ids:
                    self._finish(req, "abort")
                else:
                    req.restarts += 1
                    again.append(req)
            with self.cv:
                self.waiting.extendleft(reversed(again))
            self._load(op)

    def _finish_drain(self) -> None:
        op, self._draining = self._draining, None
        self._load(op)
        held, self._held = self._held, []
        for other in held:
            if self._draining is not None:
                self._held.append(other)
            else:
                self._start_update(other)

    def _load(self, op: Op) -> None:
        try:
            for target, value in op.weights:
                target.copy_(value)
        except Exception as exc:  # checked before queueing; a failure here is a bug, reported to the caller
            _resolve(op.done, error=EngineError(f"loading weights failed: {type(exc).__name__}: {exc}"))
            return
        finally:
            self.backend.clear_cache()
        self.version += 1
        _resolve(op.done, self.version)

    def _admit(self) -> None:
        if self._draining is not None:
            return
        with self.cv:
            room = self.max_batch - len(self.rows)
            new = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
        if not new:
            return
        for req in new:
            req.reset()
        try:
            self._join(new, *self._prefill(new))
        except Exception:
            if len(new) == 1:
                self._fail(new, _error())
                return
            for req in new:  # one at a time: only a request that fails alone fails
                try:
                    self._join([req], *self._prefill([req]))
                except Exception:
                    self._fail([req], _error())

    def _prefill(self, new: list[Request]) -> tuple[Any, Any, Any, Any]:
        longest = max(r.sampling.max_new_tokens for r in new)
        return self.backend.prefill([r.prompt for r in new], 1, longest)

    def _join(self, new: list[Request], logits: Any, mask: Any, next_pos: Any, cache: Any) -> None:
        import torch

        for req in new:
            req.kv_version, req.admitted_step = self.version, self.steps
        if not self.rows:
            self.rows, self.cache, self.mask, self.next_pos, self.logits = list(new), cache, mask, next_pos, logits
            return
        room = max(r.sampling.max_new_tokens - len(r.ids) for r in self.rows + new)
        width = max(self.mask.shape[1], mask.shape[1])
        self.cache, self.mask = stack_rows([(self.cache, self.mask), (cache, mask)], width + room)
        self.next_pos = torch.cat([self.next_pos, next_pos])
        self.logits = torch.cat([self.logits, logits])
        self.rows += new

    def _sample(self) -> None:
        import torch

        self.steps += 1
        for b, req in enumerate(self.rows):
            if req.matcher is not None:
                req.matcher.mask(self.logits[b])
        groups: dict[tuple[float, float], list[int]] = {}
        for b, req in enumerate(self.rows):
            groups.setdefault((req.sampling.temperature, req.sampling.top_p), []).append(b)
        tokens = torch.empty(len(self.rows), dtype=torch.long, device=self.logits.device)
        chosen = [0.0] * len(self.rows)
        for (temperature, top_p), rows in groups.items():
            index = torch.tensor(rows, dtype=torch.long, device=self.logits.device)
            toks, lps = sample_tokens(self.logits[index], temperature, top_p, [self.rows[b].gen for b in rows])
            tokens[index] = toks
            for b, lp in zip(rows, lps):
                chosen[b] = lp
        done, store = [], []
        for b, (req, tok) in enumerate(zip(self.rows, tokens.tolist())):
            if req.matcher is not None and not req.matcher.accept(tok):  # cannot happen: masked
                raise RuntimeError(f"request {req.id}: token {tok} is outside its grammar")
            req.ids.append(tok)
            req.logprobs.append(chosen[b])
            req.versions.append(self.version)
            if req.streamed:
                req.deliver(("token", tok, chosen[b], self.version))
            reason = self.backend.finish_reason(req.ids, req.sampling.max_new_tokens, stop_strings(req.sampling))
            if reason is not None:
                done.append((b, reason))
                if req.kv_version == self.version:
                    store.append((b, req.prompt + req.ids[:-1]))
        self.backend.store_rows(self.cache, self.mask, store)
        finished = [(self.rows[b], reason) for b, reason in done]
        self.tokens = tokens
        self._drop([b for b, _ in done])
        for req, reason in finished:
            self._finish(req, reason)
        if self.step_hook is not None:
            self.step_hook(self.steps)

    def _decode(self) -> None:
        if not self.rows:
            return
        try:
            self.logits, self.mask, self.next_pos = self.backend.decode(self.tokens, self.mask, self.next_pos,
                                                                        self.cache)
            self.tokens = None
        except Exception:
            rows = list(self.rows)
            self._drop(list(range(len(rows))))
            self._fail(rows, _error())

    def _drop(self, batch_rows: list[int]) -> None:
        """Remove batch rows (their KV with them); an empty batch holds no cache at all."""
        import torch

        if not batch_rows:
            return
        gone = set(batch_rows)
        keep = [b for b in range(len(self.rows)) if b not in gone]
        if not keep:
            self.rows, self.cache = [], None
            self.mask = self.next_pos = self.logits = self.tokens = None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos, self.logits = self.mask[index], self.next_pos[index], self.logits[index]
        if self.tokens is not None:  # sampled, not yet fed
            self.tokens = self.tokens[index]
        self.rows = [self.rows[b] for b in keep]
        self.mask = trim_left(self.cache, self.mask)

    def _finish(self, req: Request, reason: str) -> None:
        gen = Generation(token_ids=tuple(req.ids), logprobs=tuple(req.logprobs),
                         text=self.backend.tokenizer.decode(req.ids, skip_special_tokens=True),
                         finish_reason=reason, versions=tuple(req.versions),
                         meta={"request_id": req.id, "seed": req.seed, "admitted_step": req.admitted_step,
                               "finished_step": self.steps, "restarts": req.restarts})
        req.deliver(("done", gen))

    def _fail(self, reqs: list[Request], error: EngineError) -> None:
        for req in reqs:
            req.deliver(("error", error))

    def snapshot(self) -> EngineStats:
        pc = self.backend.prefix_cache
        return EngineStats(running=len(self.rows), waiting=len(self.waiting),
                           kv_positions=0 if self.mask is None else int(self.mask.numel()),
                           steps=self.steps, version=self.version,
                           cached_prefix_tokens=0 if pc is None else pc.tokens)

    def _shutdown(self) -> None:
        error = EngineError("the engine was closed")
        rows, self.rows = self.rows, []
        self.cache = self.mask = self.next_pos = self.logits = None
        with self.cv:
            waiting = list(self.waiting)
            self.waiting.clear()
            ops = list(self.ops) + self._held + self._continue + ([self._draining] if self._draining else [])
            self.ops.clear()
        self._fail(rows + waiting, error)
        for op in ops:
            _resolve(op.done, error=error)


def _error() -> EngineError:
    import sys

    exc = sys.exc_info()[1]
    return EngineError(f"{type(exc).__name__}: {exc}")


def _resolve(done: Future | None, value: Any = None, error: BaseException | None = None) -> None:
    if done is None or done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(value)
