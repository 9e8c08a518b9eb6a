"""Trajectory-scoped sessions: the public API of ``sqlrl.db``.

    with open_session("sqlite:///data/shop.sqlite", preprocess_sql=["CREATE TEMP TABLE t(x)"]) as s:
        s.execute("INSERT INTO t VALUES (1)")
        s.execute("SELECT * FROM t")          # -> QueryResult(columns=('x',), rows=((1,),), ...)

Guarantees:
- Everything a session does (TEMP tables, CREATE TABLE, DML, views) persists across its own
  ``execute`` calls, is invisible to every other session, and is gone after ``close()``; the base
  database is never modified. How each engine achieves this is documented in docs/sessions.md.
- ``execute`` never raises: errors come back typed in ``QueryResult.error``. After ``close()``, or
  after the connection died, it returns a ``session-lost`` error.
- ``close()`` is idempotent and safe to call from ``finally`` blocks and ``__exit__``.
- One session may be used from several threads; calls are serialised.
"""

from __future__ import annotations

import threading
import time
import os
from typing import Any, Callable, Iterable

from ..dialects.base import DialectAdapter, error_message, get_dialect
from ..provisioning import scratch  # noqa: F401  (registers the clone source of server sessions)
from .executor import run_call
from ..types import ErrorKind, Limits, QueryResult, SessionError
from ..url import dialect_name, parse_url, redact

# Called on close with (conn, state, reusable); the pool uses it to take the connection back.
ReleaseHook = Callable[[Any, Any, bool], None]
# Called with every QueryResult a session returns (the pool counts errors and timeouts with it).
ResultHook = Callable[[QueryResult], None]


class Session:
    def __init__(self, adapter: DialectAdapter, conn: Any, state: Any, url: str, limits: Limits,
                 release: ReleaseHook | None = None, open_ms: float = 0.0,
                 on_result: ResultHook | None = None) -> None:
        self.id = os.urandom(12).hex()
        self.adapter = adapter
        self.url = url
        self.limits = limits
        self.open_ms = open_ms
        self._conn = conn
        self._state = state
        self._release = release
        self._on_result = on_result
        self._lock = threading.Lock()
        self._closed = False
        self._lost = False

    @property
    def dialect(self) -> str:
        return self.adapter.name

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def lost(self) -> bool:
        """True once the session's connection died (every later call is ``session-lost``)."""
        return self._lost

    def execute(self, sql: str) -> QueryResult:
        with self._lock:
            if self._closed:
                return QueryResult.failure(ErrorKind.SESSION_LOST, "the session is closed")
            if self._lost:
                return QueryResult.failure(
                    ErrorKind.SESSION_LOST,
                    "the session's connection was lost earlier; its state is gone")
            try:
                result = run_call(self.adapter, self._conn, self._state, sql, self.limits)
            except Exception as exc:  # a bug below us: the connection's state is unknown now
                self._lost = True
                result = QueryResult.failure(
                    ErrorKind.SESSION_LOST, f"internal error in sqlrl ({type(exc).__name__}: "
                    f"{error_message(exc)}); the session was abandoned")
            if result.error is not None and result.error.kind is ErrorKind.SESSION_LOST:
                self._lost = True
        if self._on_result is not None:
            self._on_result(result)
        return result

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, state, self._conn, self._state = self._conn, self._state, None, None
        reusable = False
        if not self._lost:
            try:
                reusable = self.adapter.end(conn, state)
            except Exception:
                reusable = False
        if self._release is not None:
            self._release(conn, state, reusable)
        else:
            close_connection(self.adapter, conn)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("lost" if self._lost else "open")
        return f"<Session {self.id[:8]} {self.dialect} {redact(self.url)} {state}>"


def open_session(url: str, *, preprocess_sql: Iterable[str] = (), limits: Limits | None = None) -> Session:
    """Open a trajectory-scoped session on the database at ``url``.

    ``preprocess_sql`` statements run first, inside the session (so their effects are private to
    it too). Raises ``SessionError`` when the URL is bad, the server is unreachable, the role is
    privileged, or a preprocess statement fails; the half-open session is closed first.
    """
    t0 = time.perf_counter()
    limits = limits or Limits()
    parsed = parse_url(url)
    adapter = get_dialect(dialect_name(parsed))
    conn = connect(adapter, parsed, limits)
    session = start_session(adapter, conn, str(url), parsed, limits, preprocess_sql, release=None,
                            t0=t0)
    return session


def connect(adapter: DialectAdapter, parsed: Any, limits: Limits) -> Any:
    try:
        return adapter.connect(parsed, limits)
    except SessionError:
        raise
    except Exception as exc:
        raise SessionError(f"cannot connect to {redact(parsed)}: {error_message(exc)}") from exc


def start_session(adapter: DialectAdapter, conn: Any, url: str, parsed: Any, limits: Limits,
                  preprocess_sql: Iterable[str], release: ReleaseHook | None, t0: float,
                  on_result: ResultHook | None = None) -> Session:
    """Begin a workspace on an open connection and run ``preprocess_sql`` in it (used by
    ``open_session`` and by ``SessionPool``)."""
    try:
        state = adapter.begin(conn, parsed)
    except Exception as exc:
        if release is not None:
            release(conn, None, False)
        else:
            close_connection(adapter, conn)
        raise SessionError(f"cannot start a session on {redact(parsed)}: {error_message(exc)}") from exc
    session = Session(adapter, conn, state, url, limits, release=release, on_result=on_result)
    for sql in ([preprocess_sql] if isinstance(preprocess_sql, str) else preprocess_sql):
        result = session.execute(sql)
        if result.error is not None:
            session.close()
            raise SessionError(f"preprocess_sql failed ({result.error}): {sql[:200]}")
    session.open_ms = (time.perf_counter() - t0) * 1e3
    return session


def close_connection(adapter: DialectAdapter, conn: Any) -> None:
    """Close a connection through its adapter, ignoring errors (it may already be dead)."""
    try:
        adapter.close(conn)
    except Exception:
        pass
