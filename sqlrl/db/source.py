"""Where sessions come from: one protocol for every place that opens one.

The agent loop (a session per trajectory), the reward ``Judge`` (a fresh session per prediction and
per gold), the BIRD-CRITIC runner (a fresh session per test case) and the stage-2 data builder all
take a ``SessionSource``; there is no other way to ask for a session.

    source = LocalSessions({"shop": {"sqlite": "sqlite:///shop.sqlite"}})
    with open_one(source, SessionRequest("shop", "sqlite")) as session:
        session.execute("SELECT 1")

- ``SessionRequest(db, dialect, preprocess_sql, limits, key)``: ``db`` is a catalog id or a
  database URL; ``limits`` None means the source's default; ``key`` (a trajectory id) lets a pool
  route the request (which shard), others ignore it.
- ``SessionSource``: ``open_many(requests)`` gives one fresh session per request, in order (an
  object with ``execute(sql) -> QueryResult``), all or nothing: when one cannot be opened it
  raises (``SessionError``; the pool's ``LeaseError`` is one) after closing those it opened.
  ``close_many(sessions)`` is best effort and never raises. Optional ``execute_many(pairs)``:
  ``[(session, sql)] -> [QueryResult]`` in one call (the agent loop then runs a round's tool calls
  at once; the Ray pool: one round trip per shard).
- Two implementations: ``LocalSessions`` (in this process: ``open_session``, or checkouts of a
  ``SessionPool``) and ``PoolSessions`` (leases from a DB-pool client: ``lease_many``,
  ``execute_many``, ``release_many``; Ray-free itself, the client carries the transport).

Not guaranteed here: what a session isolates (``docs/sessions.md``) -- a source only opens them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Protocol, Sequence

from .leases.client import LeasedSession
from .sessions.session import open_session
from .types import Limits, QueryResult


@dataclass(frozen=True)
class SessionRequest:
    db: str  # a catalog id, or a database URL
    dialect: str | None = None  # needed when a catalog id has copies in several dialects
    preprocess_sql: tuple[str, ...] = ()
    limits: Limits | None = None  # None: the source's default
    key: str | None = None  # routing key (e.g. the trajectory id); a pool picks a shard by it


class SessionSource(Protocol):
    def open_many(self, requests: Sequence[SessionRequest]) -> list[Any]:
        """One fresh session per request, in order; raises after closing those it opened."""

    def close_many(self, sessions: Sequence[Any]) -> None:
        """Best effort; never raises."""

    # Optional: ``execute_many(pairs: [(session, sql)]) -> [QueryResult]``.


@contextlib.contextmanager
def open_one(source: SessionSource, request: SessionRequest) -> Iterator[Any]:
    """``with open_one(source, request) as session:`` -- one session, closed at exit."""
    (session,) = source.open_many([request])
    try:
        yield session
    finally:
        source.close_many([session])


class LocalSessions:
    """Fresh sessions in this process: ``open_session`` (or ``pool.session`` when a
    ``sqlrl.db.SessionPool`` is given) on the URL of each request -- a URL itself, or a catalog
    ``{db_id: {dialect: url}}`` entry."""

    def __init__(self, catalog: Mapping[str, Mapping[str, str]] | None = None,
                 limits: Limits | None = None, pool: Any = None) -> None:
        self.catalog = {k: dict(v) for k, v in (catalog or {}).items()}
        self.limits = limits or Limits()
        self.pool = pool

    def url(self, db: str, dialect: str | None = None) -> str:
        """``db`` when it is a URL, else its catalog entry; ``LookupError`` naming what exists."""
        if "://" in db:
            return db
        urls = self.catalog.get(db)
        if not urls:
            raise LookupError(f"unknown database {db!r}")
        if dialect is None and len(urls) == 1:
            return next(iter(urls.values()))
        if dialect not in urls:
            raise LookupError(f"database {db!r} has no {dialect} copy (has: {', '.join(urls)})")
        return urls[dialect]

    def open_many(self, requests: Sequence[SessionRequest]) -> list[Any]:
        opened: list[Any] = []
        try:
            for r in requests:
                url, limits = self.url(r.db, r.dialect), r.limits or self.limits
                opened.append(self.pool.session(url, preprocess_sql=list(r.preprocess_sql), limits=limits)
                              if self.pool is not None else
                              open_session(url, limits=limits, preprocess_sql=list(r.preprocess_sql)))
        except BaseException:
            self.close_many(opened)
            raise
        return opened

    def close_many(self, sessions: Sequence[Any]) -> None:
        for s in sessions:
            try:
                s.close()
            except Exception:  # closing is best effort; the session layer sweeps orphans
                pass


class PoolSessions:
    """Leases from a DB-pool client (the Ray pool's ``DBPoolClient``, or any client with
    ``lease_many`` / ``execute`` / ``execute_many`` / ``release_many``): one ``lease_many`` per
    call (one round trip per shard; a request's ``key`` picks the shard), a round's SQL in one
    ``execute_many``, everything released together."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def open_many(self, requests: Sequence[SessionRequest]) -> list["LeasedSession"]:
        by_limits: dict[Limits | None, list[int]] = {}
        for i, r in enumerate(requests):
            by_limits.setdefault(r.limits, []).append(i)
        out: list[Any] = [None] * len(requests)
        try:
            for limits, idx in by_limits.items():
                leases = self.client.lease_many(
                    [(requests[i].db, requests[i].dialect, requests[i].key,
                      tuple(requests[i].preprocess_sql)) for i in idx], limits=limits)
                for i, lease in zip(idx, leases):
                    out[i] = LeasedSession(self.client, lease)
        except BaseException:
            self.close_many([s for s in out if s is not None])
            raise
        return out

    def close_many(self, sessions: Sequence["LeasedSession"]) -> None:
        self.client.release_many([s.lease for s in sessions])

    def execute_many(self, pairs: Sequence[tuple["LeasedSession", str]]) -> list[QueryResult]:
        """A round's execute_sql calls: one ``submit_many`` per shard (never raises)."""
        return self.client.execute_many([(s.lease, sql) for s, sql in pairs])
