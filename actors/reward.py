"""Reward actors: a group that scores batches of responses in parallel (thin; the rewards
themselves are ``sqlrl.rewards``).

- **Gold affinity**: every item of a task goes to the same actor (``crc32(task id) % n``), so the
  actor's ``Judge`` executes that task's gold once per batch of rollouts — and once per task for
  the life of the actor (LRU) — instead of once per rollout.
- **Parallel**: within an actor, items are scored by ``threads`` threads (database work releases
  the GIL; BIRD-CRITIC test-case code runs in killable child processes).
- **Sessions** come from the DB pool's reward partition when a ``PoolClient`` is given (leased
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
- ``RewardGroupConfig(in_process=True)`` scores in this process with the same code (no Ray);
  the actors, deadlines, restarts and incarnations are ``actors.group.ActorGroup``'s.
"""

from __future__ import annotations

import concurrent.futures
import os
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from actors.group import DIED, NOT_STARTED, RAISED, TIMEOUT, ActorGroup, Failed
from sqlrl.db import Limits
from sqlrl.db.source import PoolSessions
from sqlrl.suites.test_suite import TestSuites
from sqlrl.rewards import Judge, RewardBreakdown, RewardConfig, compute, get_reward
from sqlrl.rewards.registry import excluded


@dataclass(frozen=True)
class RewardRequest:
    """One response to score: ``response`` is the text (single-turn rewards) or the tool calls
    (agentic rewards: ``ToolCall`` objects or ``{"name", "arguments"}`` dicts)."""

    reward: str
    task: Any  # Text2SQLTask | CriticTask
    response: Any


@dataclass(frozen=True)
class RewardGroupConfig:
    in_process: bool = False  # one scorer in this process, no Ray
    n_actors: int = 2  # Ray actors (when not in_process)
    threads: int = 4  # items scored concurrently per actor
    num_cpus_per_actor: float = 0.25
    resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources per actor
    limits: Limits = field(default_factory=lambda: Limits(timeout_s=10.0, max_rows=10_000))
    critic_test_timeout_s: float = 30.0
    batch_timeout_s: float = 300.0  # the longest the group waits for one actor's share
    start_timeout_s: float = 300.0  # the longest the group waits for an actor to (re)start
    gold_cache_size: int = 4096
    reward: RewardConfig = field(default_factory=RewardConfig)

    def __post_init__(self) -> None:
        if not self.in_process and (isinstance(self.n_actors, bool) or self.n_actors < 1):
            raise ValueError(f"n_actors must be >= 1, got {self.n_actors!r} "
                             "(in_process=True scores in this process)")


class RewardScorer:
    """What one reward actor runs (also the in-process scorer)."""

    def __init__(self, catalog: Mapping[str, Mapping[str, str]], config: RewardGroupConfig,
                 pool_client: Any = None) -> None:
        self.config = config
        sessions = None if pool_client is None else PoolSessions(pool_client)  # None: local
        suites = TestSuites(config.reward.test_suite_dir) if config.reward.test_suite else None
        self.judge = Judge(catalog, limits=config.limits, sessions=sessions,
                           gold_cache_size=config.gold_cache_size,
                           critic_test_timeout_s=config.critic_test_timeout_s, suites=suites)
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
    """``sqlrl.rewards.registry.excluded``: a row the scorers could not score."""
    return excluded(reward, reason)


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
        # two concurrency slots: stats() / incarnation_id() get through while score() runs
        self.actors = ActorGroup(RewardScorer, in_process=config.in_process,
                                 num_cpus=config.num_cpus_per_actor, resources=config.resources,
                                 max_concurrency=2, incarnations=True,
                                 start_timeout_s=config.start_timeout_s)
        n = 1 if config.in_process else config.n_actors
        self.actors.add({a: (self._catalog, config, pool_client) for a in range(n)})

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
        timeout = self.config.batch_timeout_s if timeout_s is None else timeout_s
        shares: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            shares.setdefault(self.actor_for(r.task), []).append(i)

        def send(actors: Iterable[int]) -> dict[Any, Any]:
            return self.actors.fan_out(RewardScorer.score,
                                       {a: ([requests[i] for i in shares[a]],) for a in actors},
                                       timeout_s=timeout, restart_late=True, live_only=True)

        answers = send(shares)
        died = [a for a, v in answers.items() if isinstance(v, Failed) and v.kind == DIED]
        answers.update(send(died) if died else {})  # once more, to the actor that is back
        out: list[RewardBreakdown | None] = [None] * len(requests)
        for a, values in answers.items():
            if isinstance(values, Failed):
                if values.kind == RAISED and isinstance(values.error, (KeyError, ValueError)):
                    raise values.error
                reason = _REASONS[values.kind].format(timeout=timeout, why=values.message)
                values = [failed(requests[i].reward, reason) for i in shares[a]]
            for i, v in zip(shares[a], values):
                out[i] = v
        return out  # type: ignore[return-value]

    def incarnations(self) -> list[str | None]:
        """The incarnation id each actor last answered with; ``None`` for an actor that has not
        answered yet or was killed / died and whose replacement has not answered yet."""
        if self.actors.in_process:
            return [m.incarnation for m in self.actors.values()]
        return self.actors.known_incarnations()

    def wait_ready(self) -> list[str | None]:
        """Wait (at most ``start_timeout_s``) until every actor answers from a live incarnation
        (one that was never killed); return ``incarnations()`` (``None``: not back in time)."""
        self.actors.await_live(self.actors.keys())
        return self.incarnations()

    def actor_for(self, task: Any) -> int:
        return zlib.crc32(str(task.task_id).encode()) % max(1, len(self.actors))

    def stats(self, timeout_s: float = 10.0) -> list[dict[str, int] | None]:
        """Each actor's judge counters; ``None`` for an actor that did not answer within
        ``timeout_s`` (all actors are asked at once)."""
        answers = self.actors.call_all(RewardScorer.stats, timeout_s=timeout_s)
        return [None if isinstance(v, Failed) else v for v in answers.values()]

    def shutdown(self) -> None:
        self.actors.stop()


_REASONS = {  # a Failed share's kind -> the excluded breakdowns' reason
    TIMEOUT: "reward-timeout: no answer within {timeout} s",
    DIED: "reward-unavailable: the reward actor died ({why})",
    NOT_STARTED: "reward-unavailable: the reward actor {why}",
    RAISED: "reward-unavailable: {why}",
}
