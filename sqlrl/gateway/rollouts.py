"""The gateway's rollouts (Ray-free): claim -> calls -> complete | expire | fail.

``Rollouts`` is the whole state of one job's gateway; the HTTP app (``serve/gateway.py``) and the
Ray actor (``actors/gateway.py``) only translate to and from it. Its parts, each a module stating
its own guarantees: the claim queue (``waiting``), the deadlines (``deadlines``), a rollout's
session and setup SQL (``scene``), a live rollout and its calls (``live``), the values, errors and
config (``contract``, re-exported here), the journal (``journal``), the policy version (``weights``).

- **Work**: the job ``offer(group_id, task, n)``s a task of any kind it hands out
  (``GatewayConfig.check_offer``) to ``n`` rollouts (a GRPO group; ``token``: a repeat is a
  no-op) and ``finish()``es. A client ``claim(key, kinds)``s the earliest-offered waiting rollout
  of the kinds it declared (``GatewayConfig.accepted``: None, any kind; a malformed or unknown kind
  is ``BadInput``, 400; none the job hands out, ``KindsNotOffered``, 409); nothing of those kinds
  waiting: ``NoWorkNow`` (204 + ``Retry-After``), or ``WorkFinished`` (410) after ``finish()``; a
  key that holds ``max_live_per_key`` live rollouts gets ``TooManyLive`` (429) and takes none.
- **Ids and keys**: a rollout id is ``secrets.token_urlsafe`` (144 random bits): unguessable. A
  rollout belongs to the API key that claimed it; any other key gets ``RolloutNotFound`` (404,
  the same answer as an id that does not exist, so ids do not leak).
- **Sessions**: the claim leases ONE trajectory-scoped session, keyed by the rollout id, with the
  task's setup SQL run in it (``scene.open_scene``); ``execute_sql`` runs on it through the
  built-in tool (``sqlrl.tools.run_raw``: the agent's executor, validation and observation text),
  one statement at a time per rollout. It is released exactly once: when the rollout completes,
  expires or fails. A session that cannot be opened is ``Unavailable`` (503): the task waits again.
- **A task whose setup SQL fails** (``scene.SetupFailed``: an SQL error, the same on every
  session) is never handed out and not retried: the rollout being claimed and every rollout of
  that task still waiting (any group) end ``failed`` with ``failure=FailReason.SETUP`` and the
  reason -- counted in ``failed`` and ``setup_failed``, not in ``claimed``, journalled, drained like
  any other -- and the claim goes on to the next waiting rollout of the client's kinds: the client
  gets the next task, or 204 / 410 as if that task had not been there.
- **Deadlines**: a rollout must complete within ``deadline_s`` of its claim (the injected
  ``clock``); ``expire_due()`` ends every one past it (``expired``, session released, calls in
  flight cancelled and counted in ``n_incomplete``); the app calls it on every request ``due()``
  says needs it (O(1)), the actor on a ticker.
- **Calls**: ``begin_call`` returns a ``live.CallTicket``: ``commit`` records the call whole,
  ``abandon`` counts it in ``n_incomplete``; settled once; a commit after the rollout ended raises
  ``RolloutClosed``.
- **Completion**: ``complete(key, id, sql=...)`` scores the final SQL with the ``Scorer``
  (``JudgeScorer``: the job's ``Judge`` on fresh sessions of its own -- never the rollout's);
  ``reward=`` only with ``GatewayConfig.client_rewards`` (else ``NotAllowed``, 403). A scorer that
  raises fails the rollout (``FailReason.SCORING``); ``close()`` fails the live ones
  (``FailReason.STOPPED``). Anything after the end: ``RolloutClosed`` (409).
- **Weight updates**: between ``begin_update()`` and ``end_update()`` a new call proceeds
  (``during_update="wait"``: the engine makes it wait) or gets ``Busy`` (429, ``"reject"``);
  ``update_weights(..., version=)`` reads the engine's versions as the job's and journals it; a
  gateway restored at a version > 0 refuses (or, through ``when_weights``, holds) calls until then.
- ``drain()`` hands each ended ``RolloutTrace`` out once (``token``: a repeat gets the same
  traces); ``wait_until(predicate, timeout)`` waits for a state change (every change notifies);
  ``wait_idle(timeout)`` until every offered rollout has ended (the job's step wait; ``close()``
  releases it).
- **Journal** (optional): every offer, claim, end (a setup failure's marked ``unclaimed``), drain,
  weights and finish is appended and ``fsync``'d before it is answered; a ``Rollouts`` built on a
  journal that holds records resumes from it (``journal``'s guarantees; the lost rollouts'
  ``DurableSessions`` released: ``restored_released``). Call and token counters are this process's.

Thread-safe: one lock; SQL, session opening/closing and scoring run outside it (the app calls the
blocking methods -- ``claim``, ``execute_sql``, ``complete``, ``expire_due`` -- in worker threads).
"""

from __future__ import annotations

import secrets
from collections import Counter
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from sqlrl.db.source import DurableSessions, SessionSource
from sqlrl.db.types import Limits
from sqlrl.policy.engine import AsyncEngine, UpdatePolicy
from sqlrl.tasks.kinds import task_from_dict
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tools import run_raw

from .capture import CapturedCall
from .contract import (BadInput, Busy, Claim, GatewayConfig, GatewayError, GatewayStats, JudgeScorer,  # noqa: F401
                       KindsNotOffered, NotAllowed, NoWorkNow, RolloutClosed, RolloutNotFound, Scorer,
                       TooManyLive, Unavailable, WorkFinished)
from .deadlines import Deadlines
from .ended import Ended
from .journal import Journal, Replayed, key_digest, lost_ends, replay
from .live import CallTicket, LiveRollout
from .scene import SetupFailed, open_scene
from .trace import FailReason, RolloutTrace
from .waiting import Waiting
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
        self._waiting = Waiting()  # offered, not yet claimed: by kind, in offer order
        self._live: dict[str, LiveRollout] = {}
        self._deadlines = Deadlines()  # of claimed rollouts (due(), expire_due())
        self._claiming: Counter[str] = Counter()  # by key: off _waiting, session being leased (not live yet)
        self._ended = Ended()  # traces until drained, owners of ended rollouts, the counters
        self._closed = False
        self.weights = PolicyWeights()  # the engine's versions read as the job's (sqlrl.gateway.weights)
        self.journal = journal
        # sessions another process can release: named in the journal (the declared protocol, checked once here)
        self._durable = sessions if isinstance(sessions, DurableSessions) else None
        self.restored = Replayed()  # what the journal held at start (empty without one)
        self.restored_released = 0  # sessions of rollouts lost at the restart that this gateway released
        if journal is not None:
            self._restore(replay(journal.path))

    def _restore(self, state: Replayed) -> None:
        """A restarted gateway's state (``sqlrl.gateway.journal``)."""
        self.restored = state
        for g, rec in state.waiting:
            self._waiting.add(g, task_from_dict(dict(rec)))  # of its own kind
        self._waiting.finished, self._waiting.tokens = state.finished, set(state.offer_tokens)
        self._ended.restore(state)
        self.weights = PolicyWeights(state.version)
        for trace, key, released in lost_ends(state, self._durable):  # live at the crash: expired, sessions released
            self._log("end", trace=trace.to_dict(), key=key, session_released=released)
            self._ended.add(trace, key)
            self.restored_released += bool(released)

    def _log(self, kind: str, **fields: Any) -> None:
        if self.journal is not None:
            self.journal.append(kind, **fields)

    # -- work -------------------------------------------------------------------------------------

    def offer(self, group_id: str, task: Any, n: int = 1, token: str | None = None) -> None:
        """``n`` rollouts of ``task`` (any registered kind; ``config.task_kinds`` when set) wait for
        claims; ``token``: an idempotency key (a repeat is a no-op)."""
        self.config.check_offer(task, n)  # a kind not handed out, or one the reward cannot score
        with self._cond:
            if self._waiting.admit(token):
                self._log("offer", group_id=group_id, task=task.to_dict(), n=n, token=token)
                self._waiting.add(group_id, task, n)
                self._cond.notify_all()

    def finish(self) -> None:
        """No more offers: once the waiting rollouts are claimed, claims get ``WorkFinished``."""
        with self._cond:
            if not self._waiting.finished:
                self._log("finish")
            self._waiting.finished = True
            self._cond.notify_all()

    def claim(self, key: str, kinds: Sequence[str] | None = None) -> Claim:
        """The next waiting rollout of ``kinds`` (None: any; ``GatewayConfig.accepted``) for
        ``key``, its session leased and its setup SQL run (blocking). A task whose setup fails is
        dropped (module docstring) and the next one is tried."""
        accept = self.config.accepted(kinds)
        while True:
            with self._cond:
                if self.config.max_live_per_key:  # the key's live rollouts counted only under a cap
                    self.config.check_claim(self._claiming[key] + sum(r.key == key for r in self._live.values()))
                group_id, task = self._waiting.next(accept, self.config.retry_after_s)
                self._claiming[key] += 1  # not idle while its session is leased (outside the lock)
            rollout_id = secrets.token_urlsafe(18)
            try:
                session = open_scene(self.sessions, task, self.limits, rollout_id, self.config.retry_after_s)
            except SetupFailed as exc:
                self._setup_failed(key, rollout_id, group_id, task, exc)
                continue  # the task is nobody's: the client gets the next one
            except BaseException:
                with self._cond:
                    self._claiming[key] -= 1
                    self._waiting.put_back(group_id, task)  # not handed out: it waits for the next claim
                    self._cond.notify_all()
                raise
            try:
                return self._go_live(key, rollout_id, group_id, task, session)
            except BaseException:  # its claim record could not be written (a full disk): not handed out
                self.sessions.close_many([session])
                with self._cond:
                    self._waiting.put_back(group_id, task)
                    self._cond.notify_all()
                raise

    def _go_live(self, key: str, rollout_id: str, group_id: str, task: Any, session: Any) -> Claim:
        with self._cond:
            self._claiming[key] -= 1
            self._log("claim", rollout_id=rollout_id, group_id=group_id, task_id=task.task_id, key=key_digest(key),
                      session=self._durable.record_of(session) if self._durable is not None else None)
            deadline = self.clock() + self.config.deadline_s
            self._live[rollout_id] = LiveRollout(rollout_id, key, group_id, task, deadline, session)
            self._deadlines.add(deadline, rollout_id)
            self._ended.counts["claimed"] += 1
            self._cond.notify_all()
        schema = self.schemas.get(task.db_id)
        return Claim(rollout_id, group_id, task, self.config.deadline_s,
                     schema.to_create_sql(task.dialect) if schema is not None else None)

    def _setup_failed(self, key: str, rollout_id: str, group_id: str, task: Any, exc: SetupFailed) -> None:
        """``task``'s setup SQL failed on the rollout being claimed: it and every rollout of the
        task still waiting end ``failed`` (``FailReason.SETUP``), journalled as unclaimed."""
        with self._cond:
            self._claiming[key] -= 1
            dropped = [(rollout_id, group_id)] + [(secrets.token_urlsafe(18), g) for g in self._waiting.drop(task)]
            for rid, group in dropped:
                trace = RolloutTrace(rollout_id=rid, task_id=task.task_id, group_id=group, calls=(), status="failed",
                                     error=exc.reason, failure=FailReason.SETUP)
                self._log("end", trace=trace.to_dict(), key=None, unclaimed=True)  # before anyone is told
                self._ended.add(trace, None)
            self._cond.notify_all()

    # -- calls and SQL ----------------------------------------------------------------------------

    def _get(self, key: str, rollout_id: str) -> LiveRollout:
        """The caller's active rollout (lock held): 404 unknown or foreign, 409 ended."""
        r = self._live.get(rollout_id)
        if r is None or r.key != key:
            if self._ended.owned(rollout_id, key_digest(key)):
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
            self.weights.check_call(self.config.during_update == "reject", self.config.retry_after_s)
            seq = r.open_call(cancel)
            self._cond.notify_all()
            return CallTicket(self._settle, self.weights, r, seq)

    def _settle(self, r: LiveRollout, seq: int, call: CapturedCall | None) -> None:
        with self._cond:
            if r.settle(seq, call):
                self._ended.call(call)
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
        self.config.check_complete(sql, reward)  # BadInput / NotAllowed
        with self._cond:
            r = self._get(key, rollout_id)
            r.status = "closing"
        if reward is not None:
            trace = self._end(r, "completed", reward=float(reward), reward_source="client")
        else:
            try:
                b = self.scorer.score(r.task, sql)
            except Exception as exc:  # the server's fault, not the client's: the rollout fails
                self._end(r, "failed", final_sql=sql, error=f"scoring failed: {type(exc).__name__}: {exc}",
                          failure=FailReason.SCORING)
                raise
            trace = self._end(r, "completed", reward=float(b.score), reward_source="judge",
                              reward_parts=dict(b.parts), final_sql=sql)
        return trace

    def due(self) -> bool:
        """Whether some active rollout is past its deadline (cheap: no I/O; ``Deadlines.due``)."""
        now = self.clock()
        with self._cond:
            return self._deadlines.due(now, self._active)

    def expire_due(self) -> int:
        """End every active rollout past its deadline (blocking: sessions are released)."""
        now = self.clock()
        with self._cond:
            due = [self._live[i] for i in self._deadlines.pop_due(now, self._active)]
            for r in due:
                r.status = "closing"
        for r in due:
            self._end(r, "expired", error=f"no completion within {self.config.deadline_s:g} s")
        return len(due)

    def _active(self, rollout_id: str) -> bool:
        r = self._live.get(rollout_id)
        return r is not None and r.status == "active"

    def _end(self, r: LiveRollout, status: str, **fields: Any) -> RolloutTrace:
        with self._cond:
            n, cancels = r.cut_calls()
            self._ended.incomplete(n)
        for cancel in cancels:
            try:
                cancel()
            except Exception:
                pass  # the call is counted incomplete whatever its cancel does
        with r.sql_lock:  # a statement running on the session finishes first (bounded by its timeout)
            self.sessions.close_many([r.session])
        trace, mismatches = r.trace(status, **fields)
        with self._cond:
            try:
                self._log("end", trace=trace.to_dict(), key=key_digest(r.key))  # before anyone is told
            finally:  # a journal that cannot be written (a full disk): the error goes to the caller, but
                r.status = status  # the rollout still ends here -- never left ``closing`` with its group waiting
                del self._live[r.id]
                self._ended.add(trace, key_digest(r.key), mismatches)
                self._cond.notify_all()
        return trace

    # -- the job's side ---------------------------------------------------------------------------

    def drain(self, token: str | None = None) -> list[RolloutTrace]:
        """The rollouts that ended since the last drain, each handed out once; ``token``: the same
        token as the last drain's gets that drain's traces again (a repeated call)."""
        with self._cond:
            out, new = self._ended.drain(token)
            if new:
                self._log("drain", ids=[t.rollout_id for t in out], token=token)
            return out

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
            self.weights.updating = True

    def end_update(self) -> None:
        with self._cond:
            self.weights.updating = False
            self._cond.notify_all()

    def wait_until(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait until ``predicate()`` (checked on every state change) or ``timeout``."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def idle(self) -> bool:
        """Nothing waits to be claimed, is being claimed (its session leased) or is live: every
        offered rollout has ended."""
        with self._cond:
            return not len(self._waiting) and not self._claiming.total() and not self._live

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
            return "ended" if rollout_id in self._ended.owners else None

    def stats(self) -> GatewayStats:
        with self._cond:
            return GatewayStats(active=len(self._live), waiting=len(self._waiting),
                                in_flight=sum(len(r.open_calls) for r in self._live.values()), **self._ended.counts)

    def close(self) -> int:
        """Fail every live rollout (the gateway stops): their sessions are released; returns how many."""
        with self._cond:
            live = [r for r in self._live.values() if r.status == "active"]
            for r in live:
                r.status = "closing"
        for r in live:
            self._end(r, "failed", error="the gateway stopped", failure=FailReason.STOPPED)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.weights.release()
        return len(live)


__all__ = ["BadInput", "Busy", "CallTicket", "Claim", "GatewayConfig", "GatewayError", "GatewayStats",
           "JudgeScorer", "KindsNotOffered", "NotAllowed", "NoWorkNow", "RolloutClosed", "RolloutNotFound",
           "Rollouts", "Scorer", "SetupFailed", "TooManyLive", "Unavailable", "WorkFinished"]
