"""Reward actors: a group that scores batches of responses in parallel (thin; the rewards
themselves are ``sqlrl.rewards``).

- **Gold affinity**: every item of a task goes to the same actor (``crc32(task id) % n``), so the
  actor's ``Judge`` executes that task's gold once per batch of rollouts — and once per task for
  the life of the actor (LRU) — instead of once per rollout.
- **Parallel**: within an actor, items are scored by ``threads`` threads (database work releases
  the GIL; BIRD-CRITIC test-case code runs in killable child processes).
- **Sessions** come from the DB pool's reward partition when a ``DBPoolClient`` is given (leased
  per query or test case, released at once), else from a local ``open_session``.
- **Timeouts never hang the group**: SQL is stopped by the database (``Limits.timeout_s``) and
  test-case code by killing its child, and the group waits at most ``batch_timeout_s`` for an
  actor's share (counted from when the share is sent to a live actor). Items of an actor that did
  not answer in time, or died, come back as ``excluded=True`` breakdowns with reason
  ``reward-timeout`` / ``reward-unavailable`` — a reward infrastructure failure is neither
  rewarded nor penalised — and a hung actor is killed and restarted.
- **A hung actor never scores again**: every actor process has an incarnation id (made in
  ``__init__``, so a restart gets a new one). Before a share goes to an actor that was killed,
  died or has not answered yet, the group waits (at most ``start_timeout_s``) until the actor
  answers with an incarnation id that was never killed — ``ray.kill`` is asynchronous, and a
  call made right after it can still reach the old process. So a batch after a timeout is never
  sent to (or answered by) the hung process, and actor start-up or restart time is never charged
  to a batch's ``batch_timeout_s``.
- ``RewardGroupConfig(n_actors=0)`` scores in-process with the same code (no Ray).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

from sqlrl.db import Limits
from sqlrl.rewards import Judge, RewardBreakdown, RewardConfig, compute, get_reward, local_opener


@dataclass(frozen=True)
class RewardRequest:
    """One response to score: ``response`` is the text (single-turn rewards) or the tool calls
    (agentic rewards: ``ToolCall`` objects or ``{"name", "arguments"}`` dicts)."""

    reward: str
    task: Any  # Text2SQLTask | CriticTask
    response: Any


@dataclass(frozen=True)
class RewardGroupConfig:
    n_actors: int = 2  # 0: in-process
    threads: int = 4  # items scored concurrently per actor
    num_cpus_per_actor: float = 0.25
    resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources per actor
    limits: Limits = field(default_factory=lambda: Limits(timeout_s=10.0, max_rows=10_000))
    critic_test_timeout_s: float = 30.0
    batch_timeout_s: float = 300.0  # the longest the group waits for one actor's share
    start_timeout_s: float = 300.0  # the longest the group waits for an actor to (re)start
    gold_cache_size: int = 4096
    reward: RewardConfig = field(default_factory=RewardConfig)


class RewardScorer:
    """What one reward actor runs (also the in-process scorer)."""

    def __init__(self, catalog: Mapping[str, Mapping[str, str]], config: RewardGroupConfig,
                 pool_client: Any = None) -> None:
        self.config = config
        opener = local_opener if pool_client is None else _pool_opener(pool_client)
        self.judge = Judge(catalog, limits=config.limits, opener=opener,
                           gold_cache_size=config.gold_cache_size,
                           critic_test_timeout_s=config.critic_test_timeout_s)
        self._threads = concurrent.futures.ThreadPoolExecutor(max(1, config.threads))
        # new for every process: a restarted actor answers with a different id
        self.incarnation = f"{os.getpid()}-{uuid.uuid4().hex}"

    def incarnation_id(self) -> str:
        return self.incarnation

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardBreakdown]:
        return list(self._threads.map(self._one, requests))

    def stats(self) -> dict[str, int]:
        return self.judge.stats()

    def _one(self, request: RewardRequest) -> RewardBreakdown:
        try:
            return compute(request.reward, request.task, request.response, self.judge,
                           self.config.reward)
        except (KeyError, ValueError):
            raise  # a configuration error (unknown reward, wrong task type, db not in catalog)
        except Exception as exc:  # a bug or infrastructure failure: excluded, never rewarded
            return failed(request.reward, f"reward-error: {type(exc).__name__}: {exc}")


def failed(reward: str, reason: str) -> RewardBreakdown:
    keys = get_reward(reward).keys
    return RewardBreakdown(0.0, {k: 0.0 for k in keys}, True, reason)


def _pool_opener(client: Any):
    @contextlib.contextmanager
    def opener(url: str, preprocess_sql: Sequence[str], limits: Limits) -> Iterator[Any]:
        with client.session(url, preprocess_sql=tuple(preprocess_sql), limits=limits) as s:
            yield s
    return opener


class RewardGroup:
    """``n_actors`` reward actors (or one in-process scorer) behind ``score(batch)``.

    Guarantee: a share is sent only to an actor process that has answered from an incarnation
    that was never killed, so after a timeout the hung process never scores (or answers) another
    batch; ``incarnations()`` says which process each actor is now, ``wait_ready()`` waits for
    all of them."""

    def __init__(self, catalog: Mapping[str, Mapping[str, str]],
                 config: RewardGroupConfig = RewardGroupConfig(), pool_client: Any = None) -> None:
        self.config = config
        self._catalog = {k: dict(v) for k, v in catalog.items()}
        self._pool_client = pool_client
        if config.n_actors == 0:
            self._local = RewardScorer(self._catalog, config, pool_client)
            self.actors: list[Any] = []
        else:
            import ray

            remote = ray.remote(RewardScorer).options(
                num_cpus=config.num_cpus_per_actor, resources=dict(config.resources) or None,
                max_restarts=-1, max_task_retries=0,
                max_concurrency=2)  # stats() / incarnation_id() get through while score() runs
            self.actors = [remote.remote(self._catalog, config, pool_client)
                           for _ in range(config.n_actors)]
        self._incarnation: list[str | None] = [None] * len(self.actors)  # last answered with
        self._killed: list[set[str]] = [set() for _ in self.actors]  # hung, killed: never again

    def score(self, requests: Sequence[RewardRequest],
              timeout_s: float | None = None) -> list[RewardBreakdown]:
        """Breakdowns in request order. Raises only for configuration errors (unknown reward,
        a task whose database is not in the catalog, a reward for another task type).

        ``timeout_s`` (default ``batch_timeout_s``) bounds each actor's share from when it is
        sent to a live actor. A share not answered in time comes back excluded
        (``reward-timeout``) and its actor is killed and restarted; the next share for that
        actor waits for the restarted incarnation (never the hung one). A share whose actor died
        is resubmitted once, after the actor is back (scoring is idempotent)."""
        for r in requests:
            get_reward(r.reward)
        if not self.actors:
            return self._local.score(requests)
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        timeout = self.config.batch_timeout_s if timeout_s is None else timeout_s
        shares: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            shares.setdefault(self.actor_for(r.task), []).append(i)
        out: list[RewardBreakdown | None] = [None] * len(requests)

        def fail(idx: list[int], reason: str) -> None:
            for i in idx:
                out[i] = failed(requests[i].reward, reason)

        # ObjectRef -> (actor, item indices, attempt, deadline)
        pending: dict[Any, tuple[int, list[int], int, float]] = {}

        def send(a: int, idx: list[int], attempt: int) -> None:
            ref = self.actors[a].score.remote([requests[i] for i in idx])
            pending[ref] = (a, idx, attempt, time.monotonic() + timeout)

        not_back = self._await_live(list(shares))
        for a, idx in shares.items():
            if a in not_back:
                fail(idx, not_back[a])
            else:
                send(a, idx, 0)
        while pending:
            wait_s = min(d for _, _, _, d in pending.values()) - time.monotonic()
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, wait_s))
            if not ready:
                now = time.monotonic()
                late = [ref for ref, (_, _, _, d) in pending.items() if d <= now]
                self._restart_hung([pending[ref][0] for ref in late])
                for ref in late:  # no answer in time: the actor is restarted, its items excluded
                    fail(pending.pop(ref)[1], f"reward-timeout: no answer within {timeout} s")
                continue
            a, idx, attempt, _ = pending.pop(ready[0])
            try:
                values = ray.get(ready[0])
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, (KeyError, ValueError)):
                    raise cause from None
                values = [failed(requests[i].reward, f"reward-unavailable: {exc}") for i in idx]
            except RayActorError as exc:
                self._incarnation[a] = None  # died, restarting or unreachable: wait for an answer
                if attempt > 0:
                    fail(idx, f"reward-unavailable: the reward actor died ({type(exc).__name__})")
                elif a in (not_back := self._await_live([a])):
                    fail(idx, not_back[a])
                else:  # scoring is idempotent: resubmit once, to the actor that is back
                    send(a, idx, 1)
                continue
            for i, v in zip(idx, values):
                out[i] = v
        return out  # type: ignore[return-value]

    def incarnations(self) -> list[str | None]:
        """The incarnation id each actor last answered with; ``None`` for an actor that has not
        answered yet or was killed / died and whose replacement has not answered yet."""
        if not self.actors:
            return [self._local.incarnation]
        return list(self._incarnation)

    def wait_ready(self) -> list[str | None]:
        """Wait (at most ``start_timeout_s``) until every actor answers from a live incarnation
        (one that was never killed); return ``incarnations()`` (``None``: not back in time)."""
        if self.actors:
            self._await_live(range(len(self.actors)))
        return self.incarnations()

    def _await_live(self, actors: Iterable[int]) -> dict[int, str]:
        """Wait, bounded by ``start_timeout_s``, until each of ``actors`` whose incarnation is
        not known answers ``incarnation_id()`` with an id that was never killed. Waits on the
        answers (a call to a restarting actor is queued until it is back); an answer from a
        killed incarnation (the kill has not landed yet) or an actor error is asked again after
        a short pause. Returns the actors that are not back, with the ``reward-unavailable``
        reason (an actor whose constructor failed is not waited for: Ray does not restart it)."""
        import ray
        from ray.exceptions import RayActorError, RayError

        deadline = time.monotonic() + self.config.start_timeout_s
        ask = lambda a: self.actors[a].incarnation_id.remote()  # noqa: E731
        asks = {ask(a): a for a in set(actors) if self._incarnation[a] is None}
        failed_init: dict[int, str] = {}
        pause = 0.02
        while asks:
            ready, _ = ray.wait(list(asks), num_returns=1,
                                timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            a = asks.pop(ready[0])
            try:
                incarnation = ray.get(ready[0])
            except RayActorError as exc:  # dying, restarting or unreachable
                if exc.actor_init_failed:
                    cause = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
                    failed_init[a] = f"reward-unavailable: the reward actor cannot start: {cause}"
                    continue
                incarnation = None
            except RayError:
                incarnation = None
            if incarnation is not None and incarnation not in self._killed[a]:
                self._incarnation[a] = incarnation
                continue
            if time.monotonic() >= deadline:
                asks[ready[0]] = a  # keep it counted as not back
                break
            time.sleep(pause)  # the old process still answers, or the actor is in between
            pause = min(0.5, pause * 2)
            asks[ask(a)] = a
        late = (f"reward-unavailable: the reward actor did not (re)start within "
                f"{self.config.start_timeout_s} s")
        return {**{a: late for a in asks.values()}, **failed_init}

    def _restart_hung(self, actors: Sequence[int]) -> None:
        """Kill (Ray restarts them) actors that did not answer in time, after noting which
        incarnation hung so that it is never used again. The hung process still answers
        ``incarnation_id()`` (a second concurrency slot); if it cannot within a few seconds, the
        last id it answered with is used."""
        import ray

        if not actors:
            return
        asks = {self.actors[a].incarnation_id.remote(): a for a in actors}
        ready, _ = ray.wait(list(asks), num_returns=len(asks),
                            timeout=min(10.0, self.config.start_timeout_s))
        for ref in ready:
            with contextlib.suppress(Exception):
                self._incarnation[asks[ref]] = ray.get(ref)
        for a in actors:
            if self._incarnation[a] is not None:
                self._killed[a].add(self._incarnation[a])
            self._incarnation[a] = None
            ray.kill(self.actors[a], no_restart=False)

    def actor_for(self, task: Any) -> int:
        return zlib.crc32(str(task.task_id).encode()) % max(1, len(self.actors))

    def stats(self, timeout_s: float = 10.0) -> list[dict[str, int] | None]:
        """Each actor's judge counters; ``None`` for an actor that did not answer within
        ``timeout_s`` (all actors are asked at once)."""
        if not self.actors:
            return [self._local.stats()]
        import ray

        refs = [actor.stats.remote() for actor in self.actors]
        deadline = time.monotonic() + timeout_s
        out: list[dict[str, int] | None] = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
            except Exception:
                out.append(None)
        return out

    def shutdown(self) -> None:
        if self.actors:
            import ray

            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            self.actors = []
            self._incarnation, self._killed = [], []
