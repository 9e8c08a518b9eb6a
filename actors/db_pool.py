"""The sharded DB-session pool on Ray: shard actors around ``sqlrl.db.shard.ShardCore``, a group
that creates them from a ``PartitionPlan``, and the client rollout workers and reward actors hold.

Thin by design: the lease protocol, TTL, renew-on-use, reclaim and partitioning rules live in the
Ray-free core (``sqlrl/db/{lease,shard,partition}.py``; docs/pool.md). This module adds only:

- **Placement and fault tolerance**: a shard is a threaded actor (``max_concurrency`` threads) with
  ``num_cpus``/custom ``resources`` from the config, restarted by Ray (``max_restarts=-1``). Calls
  are not retried (``max_task_retries=0``): a restarted shard has a new incarnation and no leases,
  so a caller's next call on an old lease returns a typed ``session-lost`` result; a call in flight
  when the shard died returns one too (blocking variants) — never a hang: every blocking call waits
  at most ``call_timeout_s``. Sessions die with the process (SQLite memory; a server session's
  clone and role are orphans, dropped by the next sweep of any process using that server).
- **A client** that hides shard addressing: blocking methods, ``*_async`` variants that return
  ``ray.ObjectRef`` (a completed ``concurrent.futures.Future`` in-process), ``resolve`` for either,
  and ``session()`` as a context manager that always releases.
- **In-process mode** (``DBPoolConfig(in_process=True)``, the "n=0" of the other groups): the same
  shards as plain ``ShardCore`` objects in the caller's process (each with its TTL reaper thread,
  stopped by ``shutdown``), the same client, no cluster.
- **Metrics** (``ray.util.metrics``, tagged by shard): ``sqlrl_db_<counter>`` counters,
  ``sqlrl_db_active_sessions`` gauge, ``sqlrl_db_execute_ms`` histogram; on the client side (in a
  Ray process, tagged by role) ``sqlrl_db_lease_wait_ms``, the time a ``lease``/``lease_many`` call
  took until granted, retries on a full or restarting shard included. Prometheus shows them with
  Ray's ``ray_`` prefix (docs/monitoring.md).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from sqlrl.db.lease import ExecuteRequest, Lease, LeaseError, LeaseErrorKind, LeaseRequest
from sqlrl.db.partition import PartitionPlan, Rebalance, ShardSpec
from sqlrl.db.shard import COUNTERS, ShardConfig, ShardCore, ShardStats
from sqlrl.db.types import ErrorKind, Limits, QueryResult

LATENCY_BOUNDARIES_MS = [0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000, 5000]
# Lease refusals that pass: a full shard, or one that died and is being restarted by Ray (nothing
# was granted, so retrying cannot leak). lease() retries them until lease_wait_s.
_RETRIED = (LeaseErrorKind.CAPACITY, LeaseErrorKind.SHARD_UNAVAILABLE)
_RAY_FAILURES = (RayActorError, GetTimeoutError)  # incl. ActorDied/ActorUnavailable


@dataclass(frozen=True)
class DBPoolConfig:
    """How a job lays out its pool. YAML mirrors it (``db_pool:`` section)."""

    rollout_workers: int = 1
    per_worker: Mapping[str, int] = field(default_factory=lambda: {"sqlite": 1})
    reward: Mapping[str, int] | None = None  # None: one reward shard per dialect group
    shard: ShardConfig = field(default_factory=ShardConfig)
    in_process: bool = False  # "n=0": ShardCores in this process, no Ray
    num_cpus_per_shard: float = 0.25
    resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources per shard
    max_concurrency: int = 32  # threads per shard actor (concurrent calls)
    reaper_interval_s: float = 5.0
    call_timeout_s: float = 60.0  # a blocking call never waits longer for a shard
    lease_wait_s: float = 30.0  # how long lease() retries a full shard before giving up

    def plan(self) -> PartitionPlan:
        return PartitionPlan.build(self.rollout_workers, self.per_worker, self.reward)


class _ShardActor(ShardCore):
    """ShardCore inside a Ray actor: runs the TTL reaper and exports metrics."""

    def __init__(self, shard_id: str, config: ShardConfig, reaper_interval_s: float) -> None:
        super().__init__(shard_id, config)
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


def _record_lease_wait(role: str, since: float, in_process: bool) -> None:
    if in_process or not ray.is_initialized():
        return
    with _LEASE_WAIT_LOCK:
        hist = _LEASE_WAIT.get("histogram")
        if hist is None:
            from ray.util import metrics

            hist = _LEASE_WAIT["histogram"] = metrics.Histogram(
                "sqlrl_db_lease_wait_ms", "time a DB-pool lease call waited until granted (ms)",
                boundaries=LATENCY_BOUNDARIES_MS, tag_keys=("role",))
    hist.observe((time.monotonic() - since) * 1e3, tags={"role": role})


class DBPoolGroup:
    """Every shard of a pool, as actors (or in-process cores), by shard id."""

    def __init__(self, config: DBPoolConfig = DBPoolConfig()) -> None:
        self.config = config
        self.plan = config.plan()
        self.shards: dict[str, Any] = {}
        self._retiring: dict[str, Any] = {}
        self._start(self.plan.shards())

    def client(self, worker: int | None = None, role: str = "rollout") -> "DBPoolClient":
        """The client for rollout worker ``worker`` (or for reward actors: ``role="reward"``)."""
        specs = self.plan.shards_for(role, worker)
        return DBPoolClient(self.plan, {s.id: self.shards[s.id] for s in specs}, role, worker,
                            self.config)

    def stats(self) -> dict[str, ShardStats | None]:
        """Every shard's stats (``None`` for a shard that did not answer)."""
        return {sid: _call(shard, "stats", timeout=self.config.call_timeout_s,
                           in_process=self.config.in_process, default=None)
                for sid, shard in {**self.shards, **self._retiring}.items()}

    def release_worker(self, worker_id: str) -> int:
        """End every lease a (dead) worker holds, without waiting for the TTL."""
        return sum(_call(shard, "release_worker", worker_id, timeout=self.config.call_timeout_s,
                         in_process=self.config.in_process, default=0)
                   for shard in self.shards.values())

    def rebalance(self, rollout_workers: int | list[int]) -> Rebalance:
        """Start shards for new workers; drain the shards of departed ones (retired once idle)."""
        change = self.plan.rebalance(rollout_workers)
        self._start(change.added)
        for spec in change.removed:
            shard = self.shards.pop(spec.id)
            _call(shard, "drain", timeout=self.config.call_timeout_s,
                  in_process=self.config.in_process, default=None)
            self._retiring[spec.id] = shard
        self.plan = change.plan
        self.retire_idle()
        return change

    def retire_idle(self) -> list[str]:
        """Close and stop drained shards that hold no lease (the TTL empties them eventually)."""
        done = []
        for sid, shard in list(self._retiring.items()):
            stats = _call(shard, "stats", timeout=self.config.call_timeout_s,
                          in_process=self.config.in_process, default=None)
            if stats is None or stats.active_leases == 0:
                self._stop(shard)
                del self._retiring[sid]
                done.append(sid)
        return done

    def shutdown(self) -> None:
        for shard in [*self.shards.values(), *self._retiring.values()]:
            self._stop(shard)
        self.shards.clear()
        self._retiring.clear()

    def _start(self, specs: tuple[ShardSpec, ...]) -> None:
        cfg = self.config
        if cfg.in_process:  # the same reaper as a shard actor's, on a thread of this process
            for spec in specs:
                core = ShardCore(spec.id, cfg.shard)
                core.start_reaper(cfg.reaper_interval_s)
                self.shards[spec.id] = core
            return
        actor_cls = ray.remote(_ShardActor).options(
            num_cpus=cfg.num_cpus_per_shard, resources=dict(cfg.resources) or None,
            max_concurrency=cfg.max_concurrency, max_restarts=-1, max_task_retries=0)
        started = {s.id: actor_cls.remote(s.id, cfg.shard, cfg.reaper_interval_s) for s in specs}
        ray.get([a.ready.remote() for a in started.values()], timeout=cfg.call_timeout_s * 2)
        self.shards.update(started)

    def _stop(self, shard: Any) -> None:
        _call(shard, "close", timeout=self.config.call_timeout_s,
              in_process=self.config.in_process, default=None)
        if not self.config.in_process:
            ray.kill(shard, no_restart=True)


class DBPoolClient:
    """What one rollout worker (or the reward actors) holds: routes to its own shards only.

    Picklable (actor handles and a plan), so a job creates it and passes it to the worker actor.
    """

    def __init__(self, plan: PartitionPlan, shards: Mapping[str, Any], role: str,
                 worker: int | None, config: DBPoolConfig) -> None:
        self.plan = plan
        self.shards = dict(shards)
        self.role = role
        self.worker = worker
        self.worker_id = f"{role}-{worker}" if role == "rollout" else role
        self._in_process = config.in_process
        self._timeout = config.call_timeout_s
        self._lease_wait = config.lease_wait_s
        self._keys = 0

    # -- blocking ----------------------------------------------------------------------------------

    def lease(self, db: str, dialect: str | None = None, *, key: str | None = None,
              preprocess_sql: tuple[str, ...] | list[str] = (), limits: Limits | None = None,
              worker_id: str | None = None) -> Lease:
        """Lease a session on ``db`` (catalog id or URL). ``key`` (e.g. the trajectory id) picks
        among this caller's shards. Retries a full or restarting shard until ``lease_wait_s``;
        raises ``LeaseError`` otherwise."""
        since = time.monotonic()
        lease = self._lease_retrying(db, dialect, key, preprocess_sql, limits, worker_id)
        _record_lease_wait(self.role, since, self._in_process)
        return lease

    def _lease_retrying(self, db: str, dialect: str | None, key: str | None, preprocess_sql: Any,
                        limits: Limits | None, worker_id: str | None) -> Lease:
        request, shard = self._request(db, dialect, key, preprocess_sql, limits, worker_id)
        deadline = time.monotonic() + self._lease_wait
        delay = 0.01
        while True:
            try:
                return self._get(self._invoke(shard, "lease", request), lease_error=True)
            except LeaseError as exc:
                if exc.kind not in _RETRIED or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def execute(self, lease: Lease, sql: str) -> QueryResult:
        """Never raises: a dead shard or lease is a ``session-lost``/``lease-expired`` result."""
        return self._get(self.execute_async(lease, sql), lease_error=False)

    def renew(self, lease: Lease) -> Lease:
        return self._get(self.renew_async(lease), lease_error=True)

    def release(self, lease: Lease) -> bool:
        """Idempotent; never raises. False when the lease had already ended (or died with its
        shard)."""
        try:
            return bool(self._get(self.release_async(lease), lease_error=True))
        except LeaseError:
            return False

    @contextlib.contextmanager
    def session(self, db: str, dialect: str | None = None, **kwargs: Any) -> Iterator["LeasedSession"]:
        """``with client.session("concert_singer", "sqlite", key=traj_id) as s: s.execute(sql)``"""
        lease = self.lease(db, dialect, **kwargs)
        try:
            yield LeasedSession(self, lease)
        finally:
            self.release(lease)

    # -- ObjectRef-returning (a completed Future in-process) ----------------------------------------

    def lease_async(self, db: str, dialect: str | None = None, *, key: str | None = None,
                    preprocess_sql: tuple[str, ...] | list[str] = (), limits: Limits | None = None,
                    worker_id: str | None = None) -> Any:
        """One attempt (no capacity retry); a refusal is raised by ``resolve``."""
        request, shard = self._request(db, dialect, key, preprocess_sql, limits, worker_id)
        return self._invoke(shard, "lease", request)

    def execute_async(self, lease: Lease, sql: str) -> Any:
        return self._invoke(self._owner(lease), "submit", ExecuteRequest(lease, sql))

    def lease_many(self, dbs: Sequence[tuple[Any, ...]], *,
                   preprocess_sql: tuple[str, ...] | list[str] = (),
                   limits: Limits | None = None) -> list[Lease]:
        """Lease sessions for a batch of trajectories, ``(db, dialect, key)`` or ``(db, dialect,
        key, preprocess_sql)`` each (the default ``preprocess_sql`` otherwise), with one round
        trip per shard; requests a shard refused as full or restarting are retried one by one
        (``lease``). Raises ``LeaseError`` for any other refusal, after releasing what was
        granted — all or nothing."""
        since = time.monotonic()
        by_shard: dict[int, list[int]] = {}
        requests, shards = [], []
        for i, (db, dialect, key, *rest) in enumerate(dbs):
            request, shard = self._request(db, dialect, key, rest[0] if rest else preprocess_sql,
                                           limits, None)
            requests.append(request)
            shards.append(shard)
            by_shard.setdefault(id(shard), []).append(i)
        refs = [(self._invoke(shards[idx[0]], "lease_many", tuple(requests[i] for i in idx)), idx)
                for idx in by_shard.values()]
        out: list[Any] = [None] * len(dbs)
        for ref, idx in refs:
            try:
                values = self._get(ref, lease_error=True)
            except LeaseError as exc:  # the shard did not answer
                values = [exc] * len(idx)
            for i, v in zip(idx, values):
                out[i] = v
        try:
            for i, v in enumerate(out):
                if isinstance(v, LeaseError):
                    if v.kind not in _RETRIED:
                        raise LeaseError(v.kind, v.message)
                    db, dialect, key, *rest = dbs[i]
                    out[i] = self._lease_retrying(db, dialect, key, rest[0] if rest else preprocess_sql,
                                                  limits, None)
        except LeaseError:
            self.release_many([v for v in out if isinstance(v, Lease)])
            raise
        _record_lease_wait(self.role, since, self._in_process)
        return out

    def release_many(self, leases: Sequence[Lease]) -> list[bool]:
        """``release`` for many leases, one round trip per shard; never raises."""
        by_shard: dict[str, list[int]] = {}
        for i, lease in enumerate(leases):
            by_shard.setdefault(getattr(lease, "shard", ""), []).append(i)
        out = [False] * len(leases)
        refs = []
        for idx in by_shard.values():
            shard = self._owner(leases[idx[0]])
            if not isinstance(shard, _Missing):
                refs.append((self._invoke(shard, "release_many", tuple(leases[i] for i in idx)), idx))
        for ref, idx in refs:
            try:
                values = self._get(ref, lease_error=True)
            except LeaseError:
                continue  # a dead shard took the sessions with it
            for i, v in zip(idx, values):
                out[i] = bool(v)
        return out

    def execute_many(self, calls: Sequence[tuple[Lease, str]]) -> list[QueryResult]:
        """Run ``(lease, sql)`` calls of many trajectories with one round trip per shard (a
        rollout worker's turn). Results in call order; never raises (as ``execute``)."""
        return self.resolve_many(self.execute_many_async(calls))

    def execute_many_async(self, calls: Sequence[tuple[Lease, str]]) -> "PendingBatch":
        """One ``submit_many`` call per shard involved; ``PendingBatch.refs`` are ObjectRefs (for
        ``ray.wait``), ``resolve_many`` assembles the results in call order."""
        by_shard: dict[str, list[int]] = {}
        for i, (lease, _) in enumerate(calls):
            by_shard.setdefault(getattr(lease, "shard", ""), []).append(i)
        parts = []
        for shard_id, idx in by_shard.items():
            shard = self._owner(calls[idx[0]][0])
            if isinstance(shard, _Missing):
                parts.append((shard.future("submit_many", len(idx)), idx))
                continue
            batch = tuple(ExecuteRequest(calls[i][0], calls[i][1]) for i in idx)
            parts.append((self._invoke(shard, "submit_many", batch), idx))
        return PendingBatch(len(calls), tuple(parts))

    def resolve_many(self, pending: "PendingBatch") -> list[QueryResult]:
        out: list[QueryResult | None] = [None] * pending.size
        for ref, idx in pending.parts:
            results = self._get(ref, lease_error=False)
            if isinstance(results, QueryResult):  # the shard did not answer: every call is lost
                results = (results,) * len(idx)
            for i, r in zip(idx, results):
                out[i] = r
        return out  # type: ignore[return-value]

    def renew_async(self, lease: Lease) -> Any:
        return self._invoke(self._owner(lease), "renew", lease)

    def release_async(self, lease: Lease) -> Any:
        return self._invoke(self._owner(lease), "release", lease)

    def resolve(self, ref: Any, timeout_s: float | None = None) -> Any:
        """The value behind an ``*_async`` result. A dead or silent shard raises
        ``LeaseError(shard-unavailable)``; a refused lease raises its ``LeaseError``."""
        return self._get(ref, lease_error=True, timeout_s=timeout_s)

    # -- internals ---------------------------------------------------------------------------------

    def _request(self, db: str, dialect: str | None, key: str | None, preprocess_sql: Any,
                 limits: Limits | None, worker_id: str | None) -> tuple[LeaseRequest, Any]:
        request = LeaseRequest(worker_id or self.worker_id, db, dialect, tuple(preprocess_sql),
                               limits)
        if dialect is None:
            dialect = _dialect_of(db, self.plan, self.role, self.worker)
        if key is None:
            self._keys += 1
            key = f"{self.worker_id}:{self._keys}"
        return request, self.shards[self.plan.pick(self.role, self.worker, dialect, key)]

    def _owner(self, lease: Lease) -> Any:
        shard = self.shards.get(getattr(lease, "shard", None))
        if shard is None:
            return _Missing(lease)
        return shard

    def _invoke(self, shard: Any, method: str, *args: Any) -> Any:
        if isinstance(shard, _Missing):
            return shard.future(method)
        if self._in_process:
            future: concurrent.futures.Future = concurrent.futures.Future()
            try:
                future.set_result(getattr(shard, method)(*args))
            except Exception as exc:  # a LeaseError, as a remote call would deliver it
                future.set_exception(exc)
            return future
        return getattr(shard, method).remote(*args)

    def _get(self, ref: Any, *, lease_error: bool, timeout_s: float | None = None) -> Any:
        timeout = self._timeout if timeout_s is None else timeout_s
        try:
            if isinstance(ref, concurrent.futures.Future):
                return ref.result(timeout)
            return ray.get(ref, timeout=timeout)
        except RayTaskError as exc:  # raised inside the shard: a refused lease, or a bug
            cause = getattr(exc, "cause", None)
            if isinstance(cause, LeaseError):
                raise LeaseError(cause.kind, cause.message) from None
            why = f"the shard call raised {type(cause or exc).__name__}: {cause or exc}"
        except _RAY_FAILURES as exc:
            why = (f"the DB shard did not answer ({type(exc).__name__}); it died or is "
                   f"overloaded, and its sessions are gone")
        if lease_error:
            raise LeaseError(LeaseErrorKind.SHARD_UNAVAILABLE, why)
        return QueryResult.failure(ErrorKind.SESSION_LOST, why)


@dataclass(frozen=True)
class PendingBatch:
    """What ``execute_many_async`` returns: per shard, an ObjectRef (or Future) and the positions
    of its calls in the batch."""

    size: int
    parts: tuple[tuple[Any, list[int]], ...]

    @property
    def refs(self) -> list[Any]:
        return [ref for ref, _ in self.parts]


class LeasedSession:
    """A lease plus its client: the object a trajectory holds inside ``client.session()``."""

    def __init__(self, client: DBPoolClient, lease: Lease) -> None:
        self.client = client
        self.lease = lease

    def execute(self, sql: str) -> QueryResult:
        return self.client.execute(self.lease, sql)

    def renew(self) -> None:
        self.lease = self.client.renew(self.lease)


class _Missing:
    """A lease naming a shard this client does not route to (another worker's, or rebalanced)."""

    def __init__(self, lease: Any) -> None:
        self.lease = lease

    def future(self, method: str, n: int = 1) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        lost = QueryResult.failure(
            ErrorKind.SESSION_LOST, f"lease for shard {getattr(self.lease, 'shard', '?')!r}, "
            "which is not one of this caller's shards")
        if method == "submit":
            future.set_result(lost)
        elif method == "submit_many":
            future.set_result((lost,) * n)
        elif method == "release":
            future.set_result(False)
        else:
            future.set_exception(LeaseError(LeaseErrorKind.BAD_REQUEST,
                                            "the lease belongs to a shard this caller does not use"))
        return future


def _dialect_of(db: str, plan: PartitionPlan, role: str, worker: int | None) -> str:
    """The dialect of a URL, or the only dialect this caller's shards serve."""
    if "://" in db:
        from sqlrl.db.url import dialect_name, parse_url
        try:
            return dialect_name(parse_url(db))
        except Exception as exc:
            raise LeaseError(LeaseErrorKind.BAD_REQUEST, f"not a database URL: {exc}") from None
    served = sorted({d for s in plan.shards_for(role, worker) for d in s.dialects})
    if len(served) != 1:
        raise LeaseError(LeaseErrorKind.BAD_REQUEST,
                         f"name the dialect for database {db!r} (this pool serves {served})")
    return served[0]


def _call(shard: Any, method: str, *args: Any, timeout: float, in_process: bool,
          default: Any) -> Any:
    if in_process:
        return getattr(shard, method)(*args)
    try:
        return ray.get(getattr(shard, method).remote(*args), timeout=timeout)
    except (*_RAY_FAILURES, RayTaskError):
        return default


__all__ = ["DBPoolConfig", "DBPoolGroup", "DBPoolClient", "LeasedSession", "PendingBatch"]
