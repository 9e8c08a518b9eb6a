"""SessionPool: warm connections per database, handed out as trajectory-scoped sessions.

Modelled on SQLAlchemy's ``QueuePool`` (``lib/sqlalchemy/pool/{base,impl,events}.py``):

- ``session(url, preprocess_sql=..., limits=...)`` checks a connection out (idle first, else a new
  one while the database's pool is below ``max_size``, else waits at most ``checkout_timeout_s``)
  and returns a ``Session``; the session's ``close()`` checks the connection back in. Connections
  are pooled per (URL, limits): a server connection keeps the timeout it was opened with, so
  sessions asking for other limits get connections opened with those.
- **Reset on return** is an explicit mode: ``"reset"`` ends the session's workspace and keeps the
  connection warm when the engine says it is reusable; ``"discard"`` ends the workspace and closes
  the connection. Server engines never reuse a connection (it belongs to one session's database
  and role, ``sqlrl.db.provisioning.scratch``): "opening" one takes a prepared clone, "closing" it drops the
  clone.
- **Pre-ping** (optional, on by default): an idle connection is pinged before reuse; a dead one is
  invalidated and replaced, so a restarted server costs one failed ping, not a failed trajectory.
- **Invalidation**: a session whose connection died mid-use (``session-lost``) returns it as
  unusable; the pool closes it and frees its slot.
- **Bounded wait**: ``PoolTimeout`` says the database, pool size, in-use count and the timeout.
- **Counters and events**: ``stats()`` returns a frozen ``PoolStats``; ``on(event, fn)``
  registers listeners for ``connect``, ``checkout``, ``checkin``, ``invalidate``, ``result``
  (the Ray pool actor turns them into metrics).

Thread-safe. It does not share one connection between two live sessions, ever.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal

from ..dialects.base import DialectAdapter, get_dialect
from .session import Session, close_connection, connect, start_session
from ..types import ErrorKind, Limits, QueryResult, SessionError
from ..url import dialect_name, parse_url, redact

EVENTS = ("connect", "checkout", "checkin", "invalidate", "result")


class PoolTimeout(SessionError):
    """No connection became free within the checkout timeout."""


@dataclass(frozen=True)
class PoolConfig:
    max_size: int = 8  # connections per database (idle + in use)
    checkout_timeout_s: float = 30.0
    pre_ping: bool = True
    reset_on_return: Literal["reset", "discard"] = "reset"
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if self.max_size < 1:
            raise ValueError(f"PoolConfig.max_size must be >= 1, got {self.max_size}")
        if self.reset_on_return not in ("reset", "discard"):
            raise ValueError(f"PoolConfig.reset_on_return must be 'reset' or 'discard', "
                             f"got {self.reset_on_return!r}")


@dataclass(frozen=True)
class PoolStats:
    leases: int = 0  # sessions handed out
    waits: int = 0  # checkouts that had to wait for a free connection
    wait_timeouts: int = 0
    connects: int = 0  # new connections opened
    connect_errors: int = 0
    resets: int = 0  # connections reset and kept warm on return
    discards: int = 0  # connections closed on return (discard mode, or not reusable)
    invalidations: int = 0  # dead connections found by pre-ping or by a session
    statement_errors: int = 0
    statement_timeouts: int = 0
    in_use: int = 0
    idle: int = 0


class _DatabasePool:
    """Idle connections and the slot count of one database URL opened with one set of limits
    (a server connection keeps the statement timeout it was opened with)."""

    def __init__(self, url: str, limits: Limits) -> None:
        self.url = url
        self.limits = limits
        self.parsed = parse_url(url)
        self.adapter: DialectAdapter = get_dialect(dialect_name(self.parsed))
        self.idle: deque[Any] = deque()
        self.total = 0  # idle + in use + being opened


class SessionPool:
    def __init__(self, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        self._cond = threading.Condition()
        self._pools: dict[tuple[str, Limits], _DatabasePool] = {}
        self._counts: dict[str, int] = defaultdict(int)
        self._listeners: dict[str, list[Callable[..., None]]] = {e: [] for e in EVENTS}
        self._closed = False

    # -- public API ------------------------------------------------------------------------------

    def on(self, event: str, fn: Callable[..., None]) -> None:
        """Register a listener: connect(url), checkout(url, waited_s), checkin(url, reused),
        invalidate(url, reason), result(url, QueryResult)."""
        if event not in self._listeners:
            raise ValueError(f"unknown pool event {event!r}; known: {', '.join(EVENTS)}")
        self._listeners[event].append(fn)

    def session(self, url: str, *, preprocess_sql: Iterable[str] = (),
                limits: Limits | None = None) -> Session:
        """Check out a connection for ``url`` and start a trajectory-scoped session on it."""
        t0 = time.perf_counter()
        pool = self._pool(url, limits or self.config.limits)
        conn = self._checkout(pool)
        waited = time.perf_counter() - t0
        self._emit("checkout", url, waited)
        return start_session(pool.adapter, conn, url, pool.parsed, pool.limits, preprocess_sql, release=self._releaser(pool), t0=t0,
                             on_result=lambda r: self._record(url, r))

    def stats(self) -> PoolStats:
        with self._cond:
            idle = sum(len(p.idle) for p in self._pools.values())
            total = sum(p.total for p in self._pools.values())
            return PoolStats(in_use=total - idle, idle=idle, **self._counts)

    def close(self) -> None:
        """Close idle connections; connections in use are closed when their sessions close."""
        with self._cond:
            self._closed = True
            pools = list(self._pools.values())
            idle = [(p, p.idle.popleft()) for p in pools for _ in range(len(p.idle))]
            for p, _ in idle:
                p.total -= 1
            self._cond.notify_all()
        for p, conn in idle:
            close_connection(p.adapter, conn)

    def __enter__(self) -> "SessionPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------

    def _pool(self, url: str, limits: Limits) -> _DatabasePool:
        with self._cond:
            if self._closed:
                raise SessionError("the session pool is closed")
            pool = self._pools.get((url, limits))
            if pool is None:
                pool = self._pools[(url, limits)] = _DatabasePool(url, limits)
            return pool

    def _checkout(self, pool: _DatabasePool) -> Any:
        cfg = self.config
        deadline = time.monotonic() + cfg.checkout_timeout_s
        while True:
            conn = None
            with self._cond:
                waited = False
                while not pool.idle and pool.total >= cfg.max_size:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closed:
                        self._counts["wait_timeouts"] += 1
                        raise PoolTimeout(
                            f"no free connection for {redact(pool.url)} within "
                            f"{cfg.checkout_timeout_s:g}s: pool size {cfg.max_size}, "
                            f"{pool.total - len(pool.idle)} in use")
                    if not waited:
                        self._counts["waits"] += 1
                        waited = True
                    self._cond.wait(remaining)
                if pool.idle:
                    conn = pool.idle.pop()  # LIFO: the warmest connection
                else:
                    pool.total += 1  # reserve a slot, open outside the lock
                self._counts["leases"] += 1
            if conn is None:
                return self._open(pool)
            if not cfg.pre_ping or pool.adapter.ping(conn):
                return conn
            self._invalidate(pool, conn, "pre-ping failed")
            with self._cond:
                self._counts["leases"] -= 1  # retry this checkout with a new connection

    def _open(self, pool: _DatabasePool) -> Any:
        try:
            conn = connect(pool.adapter, pool.parsed, pool.limits)
        except BaseException:
            with self._cond:
                pool.total -= 1
                self._counts["connect_errors"] += 1
                self._counts["leases"] -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._counts["connects"] += 1
        self._emit("connect", pool.url)
        return conn

    def _releaser(self, pool: _DatabasePool) -> Callable[[Any, Any, bool], None]:
        def release(conn: Any, state: Any, reusable: bool) -> None:
            keep = reusable and self.config.reset_on_return == "reset"
            with self._cond:
                if keep and not self._closed:
                    pool.idle.append(conn)
                    self._counts["resets"] += 1
                else:
                    pool.total -= 1
                    self._counts["discards"] += 1
                self._cond.notify()
            if not (keep and not self._closed):
                close_connection(pool.adapter, conn)
            self._emit("checkin", pool.url, keep)
        return release

    def _invalidate(self, pool: _DatabasePool, conn: Any, reason: str) -> None:
        close_connection(pool.adapter, conn)
        with self._cond:
            pool.total -= 1
            self._counts["invalidations"] += 1
            self._cond.notify()
        self._emit("invalidate", pool.url, reason)

    def _record(self, url: str, result: QueryResult) -> None:
        if result.error is not None:
            with self._cond:
                self._counts["statement_errors"] += 1
                if result.error.kind is ErrorKind.TIMEOUT:
                    self._counts["statement_timeouts"] += 1
        self._emit("result", url, result)

    def _emit(self, event: str, *args: Any) -> None:
        for fn in self._listeners[event]:
            try:
                fn(*args)
            except Exception:
                pass  # a metrics listener must never break a trajectory

