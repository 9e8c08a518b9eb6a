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
  actor. Items of an actor that did not answer in time, or died, come back as
  ``excluded=True`` breakdowns with reason ``reward-timeout`` / ``reward-unavailable`` — a reward
  infrastructure failure is neither rewarded nor penalised — and a hung actor is restarted.
- ``RewardGroupConfig(n_actors=0)`` scores in-process with the same code (no Ray).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

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
    limits: Limits = field(default_factory=lambda: Limits(timeout_s=10.0, max_rows=10_000))
    critic_test_timeout_s: float = 30.0
    batch_timeout_s: float = 300.0  # the longest the group waits for one actor's share
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
    """``n_actors`` reward actors (or one in-process scorer) behind ``score(batch)``."""

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
                num_cpus=config.num_cpus_per_actor, max_restarts=-1, max_task_retries=0,
                max_concurrency=2)  # a stats() call must get through while score() runs
            self.actors = [remote.remote(self._catalog, config, pool_client)
                           for _ in range(config.n_actors)]

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardBreakdown]:
        """Breakdowns in request order. Raises only for configuration errors (unknown reward,
        a task whose database is not in the catalog, a reward for another task type)."""
        for r in requests:
            get_reward(r.reward)
        if not self.actors:
            return self._local.score(requests)
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        shares: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            shares.setdefault(self.actor_for(r.task), []).append(i)
        deadline = time.monotonic() + self.config.batch_timeout_s
        submit = lambda a, idx: self.actors[a].score.remote([requests[i] for i in idx])  # noqa: E731
        refs = {submit(a, idx): (a, idx, 0) for a, idx in shares.items()}
        out: list[RewardBreakdown | None] = [None] * len(requests)
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1,
                                timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            a, idx, attempt = refs.pop(ready[0])
            try:
                values = ray.get(ready[0])
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, (KeyError, ValueError)):
                    raise cause from None
                values = [failed(requests[i].reward, f"reward-unavailable: {exc}") for i in idx]
            except RayActorError as exc:
                if attempt == 0:  # died or restarting: scoring is idempotent, resubmit once
                    refs[submit(a, idx)] = (a, idx, 1)
                    continue
                values = [failed(requests[i].reward, f"reward-unavailable: the reward actor died "
                                                     f"({type(exc).__name__})") for i in idx]
            for i, v in zip(idx, values):
                out[i] = v
        for a, idx, _ in refs.values():  # no answer in time: restart the actor, exclude its items
            ray.kill(self.actors[a], no_restart=False)
            for i in idx:
                out[i] = failed(requests[i].reward, f"reward-timeout: no answer within "
                                                    f"{self.config.batch_timeout_s} s")
        return out  # type: ignore[return-value]

    def actor_for(self, task: Any) -> int:
        return zlib.crc32(str(task.task_id).encode()) % max(1, len(self.actors))

    def stats(self) -> list[dict[str, int] | None]:
        if not self.actors:
            return [self._local.stats()]
        import ray

        out = []
        for actor in self.actors:
            try:
                out.append(ray.get(actor.stats.remote(), timeout=10))
            except Exception:
                out.append(None)
        return out

    def shutdown(self) -> None:
        if self.actors:
            import ray

            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            self.actors = []
