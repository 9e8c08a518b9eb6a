"""The sharded DB-session pool on Ray: shard actors around ``sqlrl.db.leases.shard.ShardCore``, the group
that creates them from a ``PartitionPlan``, and the Ray transport of the pool client.

Thin by design: the lease protocol, TTL, renew-on-use, reclaim and partitioning rules live in the
Ray-free core (``sqlrl/db/leases/{protocol,shard,partition}.py``), and so do the client's routing, retry
with back-off, batch calls and lost-shard results (``sqlrl/db/leases/client.py``: ``PoolClient``
behind a ``Transport``; docs/pool.md). This module adds only:

- **Placement and fault tolerance**: a shard is a threaded actor (``max_concurrency`` threads) with
  ``num_cpus``/custom ``resources`` from the config, restarted by Ray (``max_restarts=-1``;
  ``actors.group.ActorGroup``). Calls are not retried: a restarted shard has a new incarnation and
  no leases, so a caller's next call on an old lease returns a typed ``session-lost`` result; a
  call in flight when the shard died returns one too — never a hang: every blocking call waits
  at most ``call_timeout_s``. Sessions die with the process (SQLite memory; a server session's
  clone and role are orphans, dropped by the next sweep of any process using that server).
- **The Ray transport** (``RayTransport``): a client call is an actor method call; the
  ``*_async`` variants of the client return ``ray.ObjectRef`` (completed Futures in-process).
- **In-process mode** (``DBPoolConfig(in_process=True)``, the switch every group has): the same
  shards as plain objects in the caller's process (each with its TTL reaper thread, stopped by
  ``shutdown``), the same client over ``LocalTransport``, no cluster, no Ray import.
- **Metrics** (``ray.util.metrics``, tagged by shard): ``sqlrl_db_<counter>`` counters,
  ``sqlrl_db_active_sessions`` gauge, ``sqlrl_db_execute_ms`` histogram; on the client side (in a
  Ray process, tagged by role) ``sqlrl_db_lease_wait_ms``, the time a ``lease``/``lease_many`` call
  took until granted, retries on a full or restarting shard included. Prometheus shows them with
  Ray's ``ray_`` prefix (docs/monitoring.md).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

from actors.group import ActorGroup, Failed
from sqlrl.db.leases.protocol import LeaseError
from sqlrl.db.leases.partition import PartitionPlan, Rebalance, ShardSpec
from sqlrl.db.leases.client import (LeasedSession, LocalTransport, PendingBatch, PoolClient,
                                  ShardUnreachable)
from sqlrl.db.leases.shard import COUNTERS, ShardConfig, ShardCore, ShardStats

LATENCY_BOUNDARIES_MS = [0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000, 5000]


@dataclass(frozen=True)
class DBPoolConfig:
    """How a job lays out its pool. YAML mirrors it (``db_pool:`` section)."""

    rollout_workers: int = 1
    per_worker: Mapping[str, int] = field(default_factory=lambda: {"sqlite": 1})
    reward: Mapping[str, int] | None = None  # None: one reward shard per dialect group
    shard: ShardConfig = field(default_factory=ShardConfig)
    in_process: bool = False  # shards in this process, no Ray
    num_cpus_per_shard: float = 0.25
    resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources per shard
    max_concurrency: int = 32  # threads per shard actor (concurrent calls)
    reaper_interval_s: float = 5.0
    call_timeout_s: float = 60.0  # a blocking call never waits longer for a shard
    lease_wait_s: float = 30.0  # how long lease() retries a full shard before giving up

    def plan(self) -> PartitionPlan:
        return PartitionPlan.build(self.rollout_workers, self.per_worker, self.reward)


class PoolShard(ShardCore):
    """A ShardCore that runs its TTL reaper; in a Ray actor it also exports metrics."""

    def __init__(self, shard_id: str, config: ShardConfig, reaper_interval_s: float,
                 ray_metrics: bool = True) -> None:
        super().__init__(shard_id, config)
        if ray_metrics:
            self.on_metric(_RayMetrics(shard_id).record)
        self.start_reaper(reaper_interval_s)

    def ready(self) -> str:
        return self.incarnation

    def __repr__(self) -> str:  # the name the dashboard and logs show for this actor
        return f"DBShard({self.shard_id})"


class _RayMetrics:
    def __init__(self, shard_id: str) -> None:
        from ray.util import metrics

        tags = {"shard": shard_id}
        self._counters = {}
        for name in COUNTERS:
            c = metrics.Counter(f"sqlrl_db_{name}", f"DB-session pool: {name}", tag_keys=("shard",))
            c.set_default_tags(tags)
            self._counters[name] = c
        self._latency = metrics.Histogram(
            "sqlrl_db_execute_ms", "execute latency inside a DB-session shard (ms)",
            boundaries=LATENCY_BOUNDARIES_MS, tag_keys=("shard",))
        self._latency.set_default_tags(tags)
        self._active = metrics.Gauge("sqlrl_db_active_sessions", "live leased sessions on a shard",
                                     tag_keys=("shard",))
        self._active.set_default_tags(tags)
        self._active.set(0)

    def record(self, name: str, value: float) -> None:
        if name == "execute_ms":
            self._latency.observe(value)
        elif name == "active_sessions":
            self._active.set(value)
        elif name in self._counters:
            self._counters[name].inc(value)


_LEASE_WAIT: dict[str, Any] = {}  # this process's lease-wait histogram, made on first use
_LEASE_WAIT_LOCK = threading.Lock()


def record_lease_wait(role: str, ms: float) -> None:
    """The Ray client's ``on_lease_wait``: ``sqlrl_db_lease_wait_ms`` in a Ray process."""
    import ray

    if not ray.is_initialized():
        return
    with _LEASE_WAIT_LOCK:
        hist = _LEASE_WAIT.get("histogram")
        if hist is None:
            from ray.util import metrics

            hist = _LEASE_WAIT["histogram"] = metrics.Histogram(
                "sqlrl_db_lease_wait_ms", "time a DB-pool lease call waited until granted (ms)",
                boundaries=LATENCY_BOUNDARIES_MS, tag_keys=("role",))
    hist.observe(ms, tags={"role": role})


class DBPoolGroup:
    """Every shard of a pool, as actors (or in-process shards), by shard id."""

    def __init__(self, config: DBPoolConfig = DBPoolConfig()) -> None:
        self.config = config
        self.plan = config.plan()
        self.shards = ActorGroup(PoolShard, in_process=config.in_process,
                                 num_cpus=config.num_cpus_per_shard, num_gpus=0.0,
                                 resources=config.resources, max_concurrency=config.max_concurrency)
        self._retiring: set[str] = set()  # drained shards, stopped once idle
        self._start(self.plan.shards())

    def client(self, worker: int | None = None, role: str = "rollout") -> PoolClient:
        """The client for rollout worker ``worker`` (or for reward actors: ``role="reward"``)."""
        ids = [s.id for s in self.plan.shards_for(role, worker)]
        handles = {sid: self.shards[sid] for sid in ids}
        transport = LocalTransport(handles) if self.config.in_process else RayTransport(handles)
        return PoolClient(self.plan, ids, role, worker, transport,
                          call_timeout_s=self.config.call_timeout_s,
                          lease_wait_s=self.config.lease_wait_s,
                          on_lease_wait=None if self.config.in_process else record_lease_wait)

    def stats(self) -> dict[str, ShardStats | None]:
        """Every shard's stats (``None`` for a shard that did not answer)."""
        answers = self.shards.call_all(ShardCore.stats, timeout_s=self.config.call_timeout_s)
        return {sid: _value(v) for sid, v in answers.items()}

    def release_worker(self, worker_id: str) -> int:
        """End every lease a (dead) worker holds, without waiting for the TTL."""
        live = [sid for sid in self.shards.keys() if sid not in self._retiring]
        return sum(_value(v) or 0 for v in self.shards.call_all(
            ShardCore.release_worker, worker_id, timeout_s=self.config.call_timeout_s, keys=live).values())

    def rebalance(self, rollout_workers: int | list[int]) -> Rebalance:
        """Start shards for new workers; drain the shards of departed ones (retired once idle)."""
        change = self.plan.rebalance(rollout_workers)
        self._start(change.added)
        self.shards.call_all(ShardCore.drain, timeout_s=self.config.call_timeout_s,
                             keys=[s.id for s in change.removed])
        self._retiring.update(s.id for s in change.removed)
        self.plan = change.plan
        self.retire_idle()
        return change

    def retire_idle(self) -> list[str]:
        """Close and stop drained shards that hold no lease (the TTL empties them eventually)."""
        stats = self.shards.call_all(ShardCore.stats, timeout_s=self.config.call_timeout_s,
                                     keys=list(self._retiring))
        done = [sid for sid, st in stats.items() if _value(st) is None or st.active_leases == 0]
        self._stop(done)
        self._retiring.difference_update(done)
        return done

    def shutdown(self) -> None:
        self._stop(self.shards.keys())
        self._retiring.clear()

    def _start(self, specs: tuple[ShardSpec, ...]) -> None:
        cfg = self.config
        self.shards.add({s.id: (s.id, cfg.shard, cfg.reaper_interval_s, not cfg.in_process)
                         for s in specs})
        started = self.shards.call_all(PoolShard.ready, timeout_s=cfg.call_timeout_s * 2,
                                       keys=[s.id for s in specs])
        failed = {sid: v.message for sid, v in started.items() if isinstance(v, Failed)}
        if failed:
            raise RuntimeError(f"DB shards did not start: {failed}")

    def _stop(self, ids: list[str]) -> None:
        self.shards.call_all(ShardCore.close, timeout_s=self.config.call_timeout_s, keys=ids)
        self.shards.stop(ids)


class RayTransport:
    """The pool client's ``Transport`` over shard actors: a call is an actor method call, its
    handle an ObjectRef (for ``ray.wait``). Picklable: actor handles only."""

    def __init__(self, actors: Mapping[str, Any]) -> None:
        self.actors = dict(actors)

    def send(self, shard_id: str, op: Any, *args: Any) -> Any:
        return getattr(self.actors[shard_id], op.__name__).remote(*args)

    def result(self, handle: Any, timeout_s: float) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        try:
            return ray.get(handle, timeout=timeout_s)
        except RayTaskError as exc:  # raised inside the shard: a refused lease, or a bug
            cause = getattr(exc, "cause", None)
            if isinstance(cause, LeaseError):
                raise LeaseError(cause.kind, cause.message) from None
            raise ShardUnreachable(f"the shard call raised {type(cause or exc).__name__}: "
                                   f"{cause or exc}") from None
        except (RayActorError, GetTimeoutError) as exc:  # incl. ActorDied/ActorUnavailable
            raise ShardUnreachable(f"the DB shard did not answer ({type(exc).__name__}); it died "
                                   "or is overloaded, and its sessions are gone") from None


def _value(v: Any) -> Any:
    return None if isinstance(v, Failed) else v


__all__ = ["DBPoolConfig", "DBPoolGroup", "LeasedSession", "PendingBatch", "PoolShard",
           "RayTransport"]
