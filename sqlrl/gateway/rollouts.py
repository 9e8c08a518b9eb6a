"""The gateway's rollouts (Ray-free): claim -> calls -> complete | expire | fail.

``Rollouts`` is the whole state of one job's gateway; the HTTP app (``serve/gateway.py``) and the
Ray actor (``actors/gateway.py``) only translate to and from it.

- **Work**: the job ``offer(group_id, task, n)``s a task of any registered kind (``sqlrl.tasks.kinds``;
  ``GatewayConfig.refusal``: one of ``task_kinds`` when set, and one its reward scores) to ``n``
  rollouts (a GRPO group); the claim shows it as ``contract.task_payload``; a client
  ``claim(key)``s the next one. Nothing waiting: ``NoWorkNow`` (HTTP 204 + ``Retry-After``); after
  ``finish()`` and with nothing waiting: ``WorkFinished`` (410).
- **Ids and keys**: a rollout id is ``secrets.token_urlsafe`` (144 random bits): unguessable. A
  rollout belongs to the API key that claimed it; any other key gets ``RolloutNotFound`` (404,
  the same answer as an id that does not exist, so ids do not leak).
- **Sessions**: claiming leases ONE trajectory-scoped session for the rollout from a
  ``SessionSource`` (``sqlrl.db.source``: ``LocalSessions``, or ``PoolSessions`` over the DB pool),
  keyed by the rollout id, with the task's ``preprocess_sql`` run in it first (as the built-in
  loop's: a debugging task's scene); ``execute_sql`` runs on it through the built-in tool
  (``sqlrl.tools.run_raw``: the same executor, validation and observation text as the agent's
  ``execute_sql``), one statement at a time per rollout. It is released exactly once, when the
  rollout completes, expires or fails.
- **Deadlines**: a rollout must complete within ``deadline_s`` of its claim, measured by the
  injected ``clock`` (tests advance a fake one). ``expire_due()`` ends every rollout past its
  deadline (status ``expired``, session released, calls in flight cancelled and counted in
  ``n_incomplete``); the app calls it on every request that ``due()`` says needs it (a look at
  the earliest live deadline, kept in a heap: O(1) per request however many rollouts are live)
  and the actor on a ticker.
- **Calls**: ``begin_call`` returns a ``CallTicket`` (``sqlrl.gateway.live``); ``commit(prompt_ids, generation, tag)``
  records the call whole (``capture.CapturedCall``), ``abandon()`` counts it in ``n_incomplete``
  (an engine failure, a cancelled stream, a client gone). A ticket is settled once; a commit after
  its rollout ended raises ``RolloutClosed`` (the call was counted incomplete when it ended).
- **Completion**: ``complete(key, id, sql=...)`` scores the final SQL with the server's ``Scorer``
  (``JudgeScorer``: the reward registry's ``compute`` with the job's ``Judge``, which runs the SQL
  and the gold on fresh sessions of its own -- never the rollout's session); ``reward=`` is taken
  from the client only when ``GatewayConfig.client_rewards`` is on (else ``NotAllowed``, 403). A
  scorer that raises ends the rollout ``failed``. Calls, completes and SQL after the end:
  ``RolloutClosed`` (409).
- **Weight updates**: between ``begin_update()`` and ``end_update()`` a new call either proceeds
  (``during_update="wait"``: the engine's update policy makes it wait) or is refused with ``Busy``
  (429 + ``Retry-After``, ``"reject"``).
- ``drain()`` hands each finished ``RolloutTrace`` out once; ``wait_until(predicate, timeout)``
  waits for a state change (every change notifies), for tests; ``wait_idle(timeout)`` waits until
  every offered rollout has ended (the job's step wait; ``close()`` releases it).

The values, errors and ``GatewayConfig`` are ``sqlrl.gateway.contract``'s (re-exported here).

- **Journal** (optional, ``sqlrl.gateway.journal``): every offer, claim, end (the whole trace),
  drain and finish is appended and ``fsync``'d before it is answered; a ``Rollouts`` built on a
  journal that already holds records resumes from it: ended traces not yet drained are kept for the
  job, offers not claimed wait again, rollouts live at the crash end ``expired`` with
  ``journal.RESTART_CAUSE`` and ``lost=LostReason.GATEWAY_RESTART``. When the session source is
  ``DurableSessions`` (``PoolSessions``: pool leases outlive the dead process), each claim's record
  names its session and the restarted gateway releases the lost rollouts' sessions before it
  serves (``restored_released`` counts those it ended; the journal's end record says per rollout). A
  lease granted and not yet journalled when the process died is left to the pool's lease TTL. The
  call and token counters count this process's calls only.
- **Repeatable driver calls**: ``offer(..., token=)`` with a token already seen (journalled) is a
  no-op, ``drain(token=)`` with the last drain's token returns that drain's traces again: a driver
  whose call was in flight when the process died repeats it safely on the next incarnation.
- **Weights after a restart** (``self.weights``: ``sqlrl.gateway.weights.PolicyWeights``):
  ``update_weights(..., version=)`` makes the engine's versions read as the job's (recorded calls'
  ``versions`` and the returned version) and journals it. Restored from a journal naming a version
  > 0 (the engine has the start weights), ``awaiting_weights`` holds until an update: new calls get
  ``Busy`` (``when_weights`` lets the app hold them instead) and ``wait_idle`` returns.

Thread-safe: one lock; SQL, session opening/closing and scoring run outside it (the app calls the
blocking methods -- ``claim``, ``execute_sql``, ``complete``, ``expire_due`` -- in worker threads).
"""

from __future__ import annotations

import heapq
import math
import secrets
import threading
import time
from collections import deque
from typing import Any, Callable, Mapping

from sqlrl.db.source import DurableSessions, SessionRequest, SessionSource
from sqlrl.db.types import Limits
from sqlrl.policy.engine import AsyncEngine, UpdatePolicy
from sqlrl.tasks.kinds import kind_of, task_from_dict
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tools import run_raw

from .capture import CapturedCall
from .contract import (BadInput, Busy, Claim, GatewayConfig, GatewayError, GatewayStats, JudgeScorer,
                       NotAllowed, NoWorkNow, RolloutClosed, RolloutNotFound, Scorer, Unavailable,
                       WorkFinished)
from .journal import RESTART_CAUSE, Journal, Replayed, key_digest, replay
from .live import CallTicket, LiveRollout
from .trace import LostReason, RolloutTrace
from .weights import PolicyWeights


class Rollouts:
    def __init__(self, config: GatewayConfig, sessions: SessionSource, scorer: Scorer, *,
                 schemas: Mapping[str, DatabaseSchema] | None = None,
                 clock: Callable[[], float] = time.monotonic, journal: Journal | None = None) -> None:
        """``schemas``: by database id, what claims show clients (``Claim.schema``); ``journal``:
        record every change there, after restoring what it already holds (module docstring)."""
        self.config, self.sessions, self.scorer, self.clock = config, sessions, scorer, clock
        self.schemas = dict(schemas or {})
        self.limits = Limits(timeout_s=config.sql_timeout_s, max_rows=config.sql_max_rows)
        self._cond = threading.Condition()
        self._waiting: deque[tuple[str, Any]] = deque()
        self._live: dict[str, LiveRollout] = {}
        self._deadlines: list[tuple[float, str]] = []  # heap of (deadline, rollout id) of claimed rollouts (due())
        self._claiming = 0  # taken off _waiting, session being leased: neither waiting nor live yet
        self._done: dict[str, str] = {}  # ended rollout id -> its key's digest (409 for its owner)
        self._traces: list[RolloutTrace] = []
        self._finished = False
        self._updating = False
        self._closed = False
        self._counts = dict.fromkeys(("claimed", "completed", "expired", "failed", "calls", "incomplete",
                                      "prompt_tokens", "generated_tokens", "prefix_mismatches", "lost"), 0)
        self._offer_tokens: set[str] = set()
        self._last_drain: tuple[str | None, list[RolloutTrace]] = (None, [])
        self.weights = PolicyWeights()  # the engine's versions read as the job's (sqlrl.gateway.weights)
        self.journal = journal
        # sessions another process can release: named in the journal (the declared protocol, checked once here)
        self._durable = sessions if isinstance(sessions, DurableSessions) else None
        self.restored = Replayed()  # what the journal held at start (empty without one)
        self.restored_released = 0  # sessions of rollouts lost at the restart that this gateway released
        if journal is not None:
            self._restore(replay(journal.path))

    def _restore(self, state: Replayed) -> None:
        """A restarted gateway's state (``sqlrl.gateway.journal``): ended traces not yet drained
        kept, waiting offers waiting again, rollouts live at the crash ended ``expired``."""
        self.restored = state
        self._waiting.extend((g, task_from_dict(dict(rec))) for g, rec in state.waiting)  # of its own kind
        self._traces, self._done, self._finished = list(state.ended), dict(state.done), state.finished
        self._counts.update(state.counts)
        self._offer_tokens, self._last_drain = set(state.offer_tokens), state.last_drain
        self.weights = PolicyWeights(state.version)
        held = [rec for rec in state.lost if rec.get("session") is not None]
        ended = self._durable.release_records([r["session"] for r in held]) if held and self._durable else []
        released = {r["rollout_id"]: bool(e) for r, e in zip(held, ended)}
        self.restored_released = sum(released.values())
        for rec in state.lost:
            trace = RolloutTrace(rollout_id=rec["rollout_id"], task_id=rec["task_id"], group_id=rec["group_id"],
                                 calls=(), status="expired", error=RESTART_CAUSE, lost=LostReason.GATEWAY_RESTART)
            self._log("end", trace=trace.to_dict(), key=rec["key"], session_released=released.get(rec["rollout_id"]))
            self._traces.append(trace)
            self._done[trace.rollout_id] = rec["key"]
            self._counts["expired"] += 1
            self._counts["lost"] += 1

    def _log(self, kind: str, **fields: Any) -> None:
        if self.journal is not None:
            self.journal.append(kind, **fields)

    # -- work -------------------------------------------------------------------------------------

    def offer(self, group_id: str, task: Any, n: int = 1, token: str | None = None) -> None:
        """``n`` rollouts of ``task`` (any registered kind; ``config.task_kinds`` when set) wait for
        claims; ``token``: an idempotency key (a repeat is a no-op)."""
        kind = kind_of(task)  # TypeError for anything that is not a task of a registered kind
        why = self.config.refusal(kind)  # a kind not handed out, or one the reward cannot score
        if why:
            raise ValueError(f"offer of {task.task_id}: {why}")
        if n < 1:
            raise ValueError(f"offer: n must be >= 1, got {n}")
        with self._cond:
            if token is not None and token in self._offer_tokens:
                return  # offered already: the driver repeats a call whose answer it did not get
            if self._finished:
                raise RuntimeError("offer after finish(): the job has finished handing out work")
            self._log("offer", group_id=group_id, task=task.to_dict(), n=n, token=token)
            if token is not None:
                self._offer_tokens.add(token)
            self._waiting.extend([(group_id, task)] * n)
            self._cond.notify_all()

    def finish(self) -> None:
        """No more offers: once the waiting rollouts are claimed, claims get ``WorkFinished``."""
        with self._cond:
            if not self._finished:
                self._log("finish")
            self._finished = True
            self._cond.notify_all()

    def claim(self, key: str) -> Claim:
        """The next waiting rollout for ``key``, with its session leased (blocking)."""
        with self._cond:
            if not self._waiting:
                if self._finished:
                    raise WorkFinished("the job has finished handing out rollouts")
                raise NoWorkNow("no task is waiting now", self.config.retry_after_s)
            group_id, task = self._waiting.popleft()
            self._claiming += 1  # not idle while its session is leased (outside the lock)
        rollout_id = secrets.token_urlsafe(18)
        try:
            (session,) = self.sessions.open_many([SessionRequest(  # the kind's scene set, as the built-in loop's
                task.db_id, task.dialect, kind_of(task).scene_sql(task), limits=self.limits, key=rollout_id)])
        except Exception as exc:
            with self._cond:
                self._claiming -= 1
                self._waiting.appendleft((group_id, task))  # not handed out: it waits for the next claim
                self._cond.notify_all()
            raise Unavailable(f"could not open a session on {task.db_id!r}: {exc}",
                              self.config.retry_after_s) from None
        with self._cond:
            self._claiming -= 1
            self._log("claim", rollout_id=rollout_id, group_id=group_id, task_id=task.task_id, key=key_digest(key),
                      session=self._durable.record_of(session) if self._durable is not None else None)
            deadline = self.clock() + self.config.deadline_s
            self._live[rollout_id] = LiveRollout(rollout_id, key, group_id, task, deadline, session)
            heapq.heappush(self._deadlines, (deadline, rollout_id))
            self._counts["claimed"] += 1
            self._cond.notify_all()
        schema = self.schemas.get(task.db_id)
        return Claim(rollout_id, group_id, task, self.config.deadline_s,
                     schema.to_create_sql(task.dialect) if schema is not None else None)

    # -- calls and SQL ----------------------------------------------------------------------------

    def _get(self, key: str, rollout_id: str) -> LiveRollout:
        """The caller's active rollout (lock held): 404 unknown or foreign, 409 ended."""
        r = self._live.get(rollout_id)
        if r is None or r.key != key:
            if self._done.get(rollout_id) == key_digest(key):
                raise RolloutClosed(f"rollout {rollout_id} has ended")
            raise RolloutNotFound(f"no rollout {rollout_id!r} for this API key")
        if r.status != "active":
            raise RolloutClosed(f"rollout {rollout_id} has ended ({r.status})")
        return r

    def check(self, key: str, rollout_id: str) -> Any:
        with self._cond:
            return self._get(key, rollout_id).task

    def begin_call(self, key: str, rollout_id: str, cancel: Callable[[], None] | None = None) -> CallTicket:
        """A call starts; ``cancel`` (thread-safe) stops it if the rollout expires meanwhile."""
        with self._cond:
            r = self._get(key, rollout_id)
            if self.weights.awaiting:
                raise Busy("the gateway restarted and waits for the job to restore the policy's weights; "
                           "retry shortly", self.config.retry_after_s)
            if self._updating and self.config.during_update == "reject":
                raise Busy("the policy's weights are being updated; retry shortly",
                           self.config.retry_after_s)
            seq, r.seq = r.seq, r.seq + 1
            r.open_calls[seq] = cancel
            self._cond.notify_all()
            return CallTicket(self._settle, self.weights, r, seq)

    def _settle(self, r: LiveRollout, seq: int, call: CapturedCall | None) -> None:
        with self._cond:
            if seq not in r.open_calls:
                if r.status != "active" and call is not None:
                    raise RolloutClosed(f"rollout {r.id} ended while this call ran")
                return  # settled already (abandon is idempotent)
            del r.open_calls[seq]
            if call is None:
                r.n_incomplete += 1
                self._counts["incomplete"] += 1
            else:
                r.captured.append(call)
                self._counts["calls"] += 1
                self._counts["prompt_tokens"] += len(call.prompt_ids)
                self._counts["generated_tokens"] += len(call.generation.token_ids)
            self._cond.notify_all()

    def execute_sql(self, key: str, rollout_id: str, sql: Any) -> tuple[str, bool]:
        """``(observation, is_error)`` of the built-in ``execute_sql`` tool on the rollout's own
        session (blocking; one statement at a time per rollout)."""
        with self._cond:
            r = self._get(key, rollout_id)
        with r.sql_lock:
            with self._cond:
                self._get(key, rollout_id)  # it may have ended while we waited for the lock
            outcome = run_raw("execute_sql", {"sql": sql}, r.session)
        return outcome.observation, outcome.is_error

    # -- ending -----------------------------------------------------------------------------------

    def complete(self, key: str, rollout_id: str, *, sql: str | None = None,
                 reward: float | None = None) -> RolloutTrace:
        if (sql is None) == (reward is None):
            raise BadInput("complete takes exactly one of 'sql' (the final SQL) or 'reward'")
        if reward is not None:
            if not self.config.client_rewards:
                raise NotAllowed("this job does not accept client rewards: send the final 'sql'")
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise BadInput(f"reward must be a finite number, got {reward!r}")
        elif not isinstance(sql, str):
            raise BadInput(f"sql must be a string, got {type(sql).__name__}")
        with self._cond:
            r = self._get(key, rollout_id)
            r.status = "closing"
        if reward is not None:
            trace = self._end(r, "completed", reward=float(reward), reward_source="client")
        else:
            try:
                b = self.scorer.score(r.task, sql)
            except Exception as exc:  # the server's fault, not the client's: the rollout fails
                self._end(r, "failed", final_sql=sql, error=f"scoring failed: {type(exc).__name__}: {exc}")
                raise
            trace = self._end(r, "completed", reward=float(b.score), reward_source="judge",
                              reward_parts=dict(b.parts), final_sql=sql)
        return trace

    def due(self) -> bool:
        """Whether some active rollout is past its deadline (cheap: no I/O; the earliest deadline of
        the heap, whose entries of rollouts no longer active are dropped as they surface)."""
        now = self.clock()
        with self._cond:
            heap = self._deadlines
            while heap:
                deadline, rollout_id = heap[0]
                r = self._live.get(rollout_id)
                if r is not None and r.status == "active":
                    return deadline <= now
                heapq.heappop(heap)  # ended or closing: it never needs expiring again
            return False

    def expire_due(self) -> int:
        """End every active rollout past its deadline (blocking: sessions are released)."""
        now = self.clock()
        with self._cond:
            due = [r for r in self._live.values() if r.status == "active" and r.deadline <= now]
            for r in due:
                r.status = "closing"
        for r in due:
            self._end(r, "expired", error=f"no completion within {self.config.deadline_s:g} s")
        return len(due)

    def _end(self, r: LiveRollout, status: str, **fields: Any) -> RolloutTrace:
        with self._cond:
            cancels = [c for c in r.open_calls.values() if c is not None]
            r.n_incomplete += len(r.open_calls)
            self._counts["incomplete"] += len(r.open_calls)
            r.open_calls.clear()
        for cancel in cancels:
            try:
                cancel()
            except Exception:
                pass  # the call is counted incomplete whatever its cancel does
        with r.sql_lock:  # a statement running on the session finishes first (bounded by its timeout)
            self.sessions.close_many([r.session])
        trace, mismatches = r.trace(status, **fields)
        with self._cond:
            self._log("end", trace=trace.to_dict(), key=key_digest(r.key))  # before anyone is told
            r.status = status
            del self._live[r.id]
            self._done[r.id] = key_digest(r.key)
            self._traces.append(trace)
            self._counts[status] += 1
            self._counts["prefix_mismatches"] += mismatches
            self._cond.notify_all()
        return trace

    # -- the job's side ---------------------------------------------------------------------------

    def drain(self, token: str | None = None) -> list[RolloutTrace]:
        """The rollouts that ended since the last drain, each handed out once; ``token``: the same
        token as the last drain's gets that drain's traces again (a repeated call)."""
        with self._cond:
            if token is not None and self._last_drain[0] == token:
                return list(self._last_drain[1])
            out, self._traces = self._traces, []
            if out:
                self._log("drain", ids=[t.rollout_id for t in out], token=token)
            self._last_drain = (token, out)
            return list(out)

    async def update_weights(self, engine: AsyncEngine, weights: Mapping[str, Any],
                             policy: UpdatePolicy | str = UpdatePolicy.DRAIN, version: int | None = None) -> int:
        """``engine.update_weights`` with calls arriving meanwhile waiting for the engine or
        refused with ``Busy`` (``during_update``); returns the new policy version: ``version`` when
        given (the job's numbering: the engine's versions are offset to read so), else the engine's
        plus the offset. Journalled; ends ``awaiting_weights``."""
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
            raise ValueError(f"version must be an int >= 1, got {version!r}")
        self.begin_update()
        try:
            new = self.weights.loaded(await engine.update_weights(weights, policy=UpdatePolicy(policy)), version)
            with self._cond:
                self._log("weights", version=new)
            return new
        finally:
            self.end_update()

    @property
    def awaiting_weights(self) -> bool:
        return self.weights.awaiting

    def when_weights(self, wake: Callable[[], None]) -> bool:
        """``PolicyWeights.when_ready``: True, or ``wake`` is called once the weights are restored
        or the gateway stops (the app holds a restarted gateway's calls on it)."""
        return self.weights.when_ready(wake)

    def begin_update(self) -> None:
        with self._cond:
            self._updating = True

    def end_update(self) -> None:
        with self._cond:
            self._updating = False
            self._cond.notify_all()

    def wait_until(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait until ``predicate()`` (checked on every state change) or ``timeout``."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def idle(self) -> bool:
        """Nothing waits to be claimed, is being claimed (its session leased) or is live: every
        offered rollout has ended."""
        with self._cond:
            return not self._waiting and not self._claiming and not self._live

    def wait_idle(self, timeout: float | None = None) -> bool:
        """``wait_until(idle)``, also released by ``close()`` and while ``awaiting_weights`` (the
        job must restore them first); returns whether idle then: the job's wait for a step's
        rollouts, in-process or through the Ray actor."""
        with self._cond:
            self._cond.wait_for(lambda: self.idle() or self._closed or self.weights.awaiting, timeout)
            return self.idle()

    def rollout_status(self, rollout_id: str) -> str | None:
        """``active``/``closing`` while live, the final status once ended, None if unknown."""
        with self._cond:
            r = self._live.get(rollout_id)
            if r is not None:
                return r.status
            return "ended" if rollout_id in self._done else None

    def stats(self) -> GatewayStats:
        with self._cond:
            return GatewayStats(active=len(self._live), waiting=len(self._waiting),
                                in_flight=sum(len(r.open_calls) for r in self._live.values()), **self._counts)

    def close(self) -> int:
        """Fail every live rollout (the gateway stops): their sessions are released; returns how many."""
        with self._cond:
            live = [r for r in self._live.values() if r.status == "active"]
            for r in live:
                r.status = "closing"
        for r in live:
            self._end(r, "failed", error="the gateway stopped")
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.weights.release()
        return len(live)


__all__ = ["BadInput", "Busy", "CallTicket", "Claim", "GatewayConfig", "GatewayError", "GatewayStats",
           "JudgeScorer", "NotAllowed", "NoWorkNow", "RolloutClosed", "RolloutNotFound", "Rollouts", "Scorer",
           "Unavailable", "WorkFinished"]
