"""ShardCore: one shard of the DB-session pool — a SessionPool plus a lease table with a TTL.

``actors/db_pool.py`` wraps this class in a threaded Ray actor; in-process mode uses it directly.
Every rule of the lease protocol lives here, so it is tested without Ray.

Guarantees:
- ``lease(SessionRequest)`` opens a trajectory-scoped session (``SessionPool.session``) and
  returns a ``Lease``, or raises ``LeaseError`` with a typed kind; it never waits for capacity (a
  full shard answers ``capacity`` at once, so waiting callers never occupy the actor's threads —
  the client retries). The request must name its holder (``worker_id``; the client fills it in).
- ``execute`` never raises. On a lease that was released, reclaimed, granted by an earlier shard
  process, or never existed, it returns an error ``QueryResult``: ``lease-expired`` when the TTL
  reclaimed it, ``session-lost`` otherwise, each with a message saying which case it is.
- **Renew-on-use**: every ``execute`` (at its start and at its end) and every ``renew`` push the
  lease's deadline to now + ``lease_ttl_s``. A lease is reclaimed only when it is idle (no call
  running) and past its deadline, by ``reclaim_expired`` (run by the reaper thread every
  ``reaper_interval_s``) or lazily by the next call that touches it. So a caller that died loses
  its sessions at most ``lease_ttl_s + reaper_interval_s`` after its last call.
- ``release`` is idempotent: the first call closes the session (connection reset and returned to
  the pool, or discarded) and returns True; later calls return False.
- ``close`` ends every lease and the pool; afterwards ``lease`` raises ``closed``.
- Thread-safe: calls on different leases run concurrently; calls on one lease are serialised by
  its ``Session``.

It does not retry, route or know about other shards (``sqlrl.db.leases.partition`` and the client do).
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from ..dialects.descriptor import find
from .protocol import Catalog, ExecuteRequest, Lease, LeaseError, LeaseErrorKind
from ..sessions.pool import PoolConfig, PoolStats, SessionPool
from ..sessions.session import Session
from ..types import ErrorKind, QueryResult, SessionError, SessionRequest
from ..url import redact

MetricHook = Callable[[str, float], None]
# What the metric hook is called with: (counter name, increment), ("active_sessions", gauge value)
# or ("execute_ms", one latency sample).
COUNTERS = ("leases", "releases", "reclaimed", "refused", "executes", "errors", "timeouts",
            "lost_calls", "resets", "invalidations")


@dataclass(frozen=True)
class ShardConfig:
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(max_size=64, checkout_timeout_s=5.0))
    catalog: Catalog = field(default_factory=Catalog)
    lease_ttl_s: float = 300.0  # idle time after which a lease is reclaimed (renewed on use)
    max_leases: int = 64  # live sessions per shard
    allow_urls: bool = True  # accept database URLs besides catalog ids
    remember_ended: int = 4096  # ended lease ids kept, so late calls get a precise error
    batch_threads: int = 8  # threads for the server calls of one *_many batch (SQLite: serial)

    def __post_init__(self) -> None:
        if self.lease_ttl_s <= 0:
            raise ValueError(f"ShardConfig.lease_ttl_s must be > 0, got {self.lease_ttl_s}")
        if self.max_leases < 1:
            raise ValueError(f"ShardConfig.max_leases must be >= 1, got {self.max_leases}")


@dataclass(frozen=True)
class ShardStats:
    shard: str
    incarnation: str
    active_leases: int
    granted: int  # leases handed out since this shard process started
    released: int
    reclaimed: int  # leases ended by the TTL
    refused: int  # lease requests answered with a LeaseError
    executes: int
    errors: int  # execute calls whose result carried an error (incl. lost calls)
    timeouts: int
    lost_calls: int  # execute calls on a lease that had ended or was unknown
    holders: tuple[tuple[str, int], ...]  # (worker_id, active leases), sorted
    pool: PoolStats
    draining: bool = False
    closed: bool = False


class _Held:
    __slots__ = ("lease", "session", "deadline", "busy")

    def __init__(self, lease: Lease, session: Session, deadline: float) -> None:
        self.lease = lease
        self.session = session
        self.deadline = deadline  # monotonic
        self.busy = 0  # execute calls running on it


_ENDED_MESSAGES = {
    "released": (ErrorKind.SESSION_LOST, "this lease was released; lease a new session"),
    "expired": (ErrorKind.LEASE_EXPIRED, "this lease was idle for longer than its TTL ({ttl:g}s) "
                "and its session was reclaimed; lease a new session (or renew() during long gaps)"),
    "closed": (ErrorKind.SESSION_LOST, "the shard was shut down; its sessions are gone"),
    "worker-released": (ErrorKind.SESSION_LOST, "the pool released every lease of this worker"),
}


class ShardCore:
    def __init__(self, shard_id: str, config: ShardConfig | None = None) -> None:
        self.shard_id = shard_id
        self.config = config or ShardConfig()
        self.incarnation = os.urandom(6).hex()
        self._pool = SessionPool(self.config.pool)
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._opening = 0  # sessions being opened (count against max_leases)
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._counts = collections.Counter()
        self._hooks: list[MetricHook] = []
        self._draining = False
        self._closed = False
        self._reaper: threading.Thread | None = None
        self._stop = threading.Event()
        self._batch_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool.on("checkin", lambda url, reused: self._metric("resets") if reused else None)
        self._pool.on("invalidate", lambda url, reason: self._metric("invalidations"))

    # -- protocol --------------------------------------------------------------------------------

    def lease(self, request: SessionRequest) -> Lease:
        try:
            return self._grant(request)
        except LeaseError:
            self._count("refused")
            raise

    def lease_many(self, requests: tuple[SessionRequest, ...]) -> tuple[Lease | LeaseError, ...]:
        """Several ``lease`` calls in one; a refusal comes back as its ``LeaseError`` in place
        (not raised), so one full or failing request does not cost the others their leases."""
        def one(request: SessionRequest) -> Lease | LeaseError:
            try:
                return self.lease(request)
            except LeaseError as exc:
                return exc
        # opening a session is I/O on a server (a clone may be made on the spot): in parallel
        return self._map(one, requests, parallel=True)

    def release_many(self, leases: tuple[Lease, ...]) -> tuple[bool, ...]:
        return self._map(self.release, leases, parallel=any(map(_on_server, leases)))

    def execute(self, lease: Lease, sql: str) -> QueryResult:
        t0 = time.perf_counter()
        held, lost = self._touch(lease, busy=+1)
        if held is None:
            self._count("lost_calls", "errors", "executes")
            return lost  # type: ignore[return-value]
        try:
            result = held.session.execute(sql)
        finally:
            self._touch(lease, busy=-1)
        self._count("executes")
        if result.error is not None:
            self._count("errors")
            if result.error.kind is ErrorKind.TIMEOUT:
                self._count("timeouts")
        self._metric("execute_ms", (time.perf_counter() - t0) * 1e3)
        return result

    def submit(self, request: ExecuteRequest) -> QueryResult:
        """``execute`` with its arguments packed in one ``ExecuteRequest`` (what the Ray client
        sends). Never raises either."""
        if not isinstance(request, ExecuteRequest):
            return QueryResult.failure(ErrorKind.SESSION_LOST,
                                       f"expected an ExecuteRequest, got {type(request).__name__}")
        return self.execute(request.lease, request.sql)

    def submit_many(self, requests: tuple[ExecuteRequest, ...]) -> tuple[QueryResult, ...]:
        """Several ``submit`` calls in one (a rollout worker's whole turn on this shard: one Ray
        round trip instead of one per trajectory). Results in request order; never raises. The
        calls run one after another, so the batch takes the sum of its queries' times."""
        if not isinstance(requests, (tuple, list)):
            return (QueryResult.failure(ErrorKind.SESSION_LOST, "expected a tuple of "
                                        f"ExecuteRequest, got {type(requests).__name__}"),)
        return self._map(self.submit, requests, parallel=any(
            _on_server(getattr(r, "lease", None)) for r in requests))

    def renew(self, lease: Lease) -> Lease:
        """Push the deadline out by the TTL; returns the lease with its new ``expires_at``.
        Raises ``LeaseError`` (closed) when the lease has ended."""
        held, lost = self._touch(lease, busy=0)
        if held is None:
            raise LeaseError(LeaseErrorKind.CLOSED, lost.error.message)  # type: ignore[union-attr]
        return held.lease

    def release(self, lease: Lease) -> bool:
        if lease.incarnation != self.incarnation:
            return False  # granted by a shard process that is gone, with its sessions
        return self._end([lease.id], "released") == 1

    def release_worker(self, worker_id: str) -> int:
        """End every lease of one worker (its process is known dead); returns how many."""
        with self._lock:
            ids = [i for i, h in self._held.items() if h.lease.worker_id == worker_id]
        return self._end(ids, "worker-released")

    def reclaim_expired(self) -> int:
        """End idle leases past their deadline; returns how many were reclaimed."""
        now = time.monotonic()
        with self._lock:
            ids = [i for i, h in self._held.items() if h.busy == 0 and h.deadline <= now]
        return self._end(ids, "expired", only_if_expired=True)

    def drain(self) -> None:
        """Stop granting leases (rebalanced away); live leases run to their end."""
        with self._lock:
            self._draining = True

    def stats(self) -> ShardStats:
        with self._lock:
            holders = collections.Counter(h.lease.worker_id for h in self._held.values())
            c = self._counts
            return ShardStats(
                shard=self.shard_id, incarnation=self.incarnation, active_leases=len(self._held),
                granted=c["leases"], released=c["releases"], reclaimed=c["reclaimed"],
                refused=c["refused"], executes=c["executes"], errors=c["errors"],
                timeouts=c["timeouts"], lost_calls=c["lost_calls"],
                holders=tuple(sorted(holders.items())), pool=self._pool.stats(),
                draining=self._draining, closed=self._closed)

    def _map(self, fn: Callable, items: tuple, parallel: bool) -> tuple:
        if not parallel or len(items) < 2 or self.config.batch_threads < 2:
            return tuple(fn(item) for item in items)
        with self._lock:
            if self._batch_pool is None:
                self._batch_pool = concurrent.futures.ThreadPoolExecutor(
                    self.config.batch_threads, thread_name_prefix=f"batch-{self.shard_id}")
        return tuple(self._batch_pool.map(fn, items))

    def on_metric(self, hook: MetricHook) -> None:
        self._hooks.append(hook)

    def start_reaper(self, interval_s: float) -> None:
        """Run ``reclaim_expired`` every ``interval_s`` seconds on a daemon thread."""
        if self._reaper is not None:
            return

        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.reclaim_expired()
                except Exception:  # the reaper must outlive any single failure
                    pass

        self._reaper = threading.Thread(target=loop, name=f"reaper-{self.shard_id}", daemon=True)
        self._reaper.start()

    def close(self) -> int:
        """End every lease and close the pool; returns how many leases were still live."""
        self._stop.set()
        with self._lock:
            self._closed = True
            ids = list(self._held)
        ended = self._end(ids, "closed")
        if self._reaper is not None and self._reaper is not threading.current_thread():
            self._reaper.join(timeout=5.0)  # it wakes on _stop at once (unless mid-reclaim)
        self._pool.close()
        if self._batch_pool is not None:
            self._batch_pool.shutdown(wait=False)
        return ended

    # -- internals -------------------------------------------------------------------------------

    def _grant(self, request: SessionRequest) -> Lease:
        if not isinstance(request, SessionRequest):
            raise LeaseError(LeaseErrorKind.BAD_REQUEST,
                             f"expected a SessionRequest, got {type(request).__name__}")
        if not request.worker_id:
            raise LeaseError(LeaseErrorKind.BAD_REQUEST,
                             "the request names no worker_id (who holds the session); "
                             "a pool client fills it in")
        if "://" in request.db and not self.config.allow_urls:
            raise LeaseError(LeaseErrorKind.BAD_REQUEST,
                             "this pool only serves catalog database ids, not URLs")
        url, dialect = self.config.catalog.resolve(request.db, request.dialect)
        with self._lock:
            if self._closed or self._draining:
                state = "shut down" if self._closed else "draining (rebalanced away)"
                raise LeaseError(LeaseErrorKind.CLOSED, f"shard {self.shard_id} is {state}")
            if len(self._held) + self._opening >= self.config.max_leases:
                raise LeaseError(LeaseErrorKind.CAPACITY,
                                 f"shard {self.shard_id} holds its maximum of "
                                 f"{self.config.max_leases} leases")
            self._opening += 1
        try:
            session = self._pool.session(url, preprocess_sql=request.preprocess_sql,
                                         limits=request.limits)
        except BaseException as exc:
            with self._lock:
                self._opening -= 1
            if isinstance(exc, SessionError):
                raise LeaseError(LeaseErrorKind.OPEN_FAILED,
                                 f"could not open a session on {redact(url)}: {exc}") from None
            raise
        ttl = self.config.lease_ttl_s
        lease_id = os.urandom(12).hex()
        lease = Lease(id=lease_id, shard=self.shard_id, incarnation=self.incarnation,
                      worker_id=request.worker_id, db=request.db, dialect=dialect,
                      expires_at=time.time() + ttl, ttl_s=ttl)
        with self._lock:
            self._opening -= 1
            closed = self._closed
            if not closed:
                self._held[lease_id] = _Held(lease, session, time.monotonic() + ttl)
            active = len(self._held)
        if closed:
            session.close()
            raise LeaseError(LeaseErrorKind.CLOSED, f"shard {self.shard_id} was shut down")
        self._count("leases")
        self._metric("active_sessions", active)
        return lease

    def _touch(self, lease: Lease, busy: int) -> tuple[_Held | None, QueryResult | None]:
        """Renew a live lease (and count a call in or out); or say why it is not live."""
        if not isinstance(lease, Lease):
            return None, QueryResult.failure(
                ErrorKind.SESSION_LOST, f"expected a Lease, got {type(lease).__name__}")
        if lease.incarnation != self.incarnation:
            return None, QueryResult.failure(
                ErrorKind.SESSION_LOST, f"shard {lease.shard} restarted after this lease was "
                "granted; its session is gone; lease a new session")
        now = time.monotonic()
        expired = None
        with self._lock:
            held = self._held.get(lease.id)
            if held is not None and busy >= 0 and held.busy == 0 and held.deadline <= now:
                expired, held = self._held.pop(lease.id), None  # lazily reclaimed
                self._forget(lease.id, "expired")
            if held is None:
                reason = self._ended.get(lease.id)
            else:
                held.busy += busy
                held.deadline = now + self.config.lease_ttl_s
                if busy == 0:
                    held.lease = _renewed(held.lease, self.config.lease_ttl_s)
                return held, None
        if expired is not None:
            self._close_sessions([expired], "expired")
        if reason is None:
            return None, QueryResult.failure(
                ErrorKind.SESSION_LOST, f"no lease {lease.id} on shard {self.shard_id}")
        kind, message = _ENDED_MESSAGES[reason]
        return None, QueryResult.failure(kind, message.format(ttl=self.config.lease_ttl_s))

    def _end(self, ids: list[str], reason: str, only_if_expired: bool = False) -> int:
        now = time.monotonic()
        ended: list[_Held] = []
        with self._lock:
            for lease_id in ids:
                held = self._held.get(lease_id)
                if held is None:  # already ended
                    continue
                if only_if_expired and (held.busy or held.deadline > now):
                    continue  # used again since it was picked
                del self._held[lease_id]
                self._forget(lease_id, reason)
                ended.append(held)
        self._close_sessions(ended, reason)
        return len(ended)

    def _close_sessions(self, ended: list[_Held], reason: str) -> None:
        for held in ended:
            held.session.close()  # waits for a running call on it; never raises
        if ended:
            self._count({"released": "releases", "expired": "reclaimed"}.get(reason, "releases"),
                        n=len(ended))
            with self._lock:
                active = len(self._held)
            self._metric("active_sessions", active)

    def _forget(self, lease_id: str, reason: str) -> None:
        self._ended[lease_id] = reason
        while len(self._ended) > self.config.remember_ended:
            self._ended.popitem(last=False)

    def _count(self, *names: str, n: int = 1) -> None:
        with self._lock:
            for name in names:
                self._counts[name] += n
        for name in names:
            self._metric(name, n)

    def _metric(self, name: str, value: float = 1.0) -> None:
        for hook in self._hooks:
            try:
                hook(name, value)
            except Exception:
                pass  # metrics never break a call


def _renewed(lease: Lease, ttl: float) -> Lease:
    return replace(lease, expires_at=time.time() + ttl)


def _on_server(lease: object) -> bool:
    """Whether calls on ``lease`` wait on a server (worth threads); a file-based engine's work
    (``Dialect.file_based``) is CPU here, where threads would only trade the GIL."""
    engine = find(getattr(lease, "dialect", ""))  # None: not a lease of a known engine
    return engine is not None and not engine.file_based
