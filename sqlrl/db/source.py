"""Where sessions come from: one protocol for every place that opens one.

The agent loop (a session per trajectory), the reward ``Judge`` (a fresh session per prediction and
per gold), the BIRD-CRITIC runner (a fresh session per test case) and the stage-2 data builder all
take a ``SessionSource``; there is no other way to ask for a session.

    source = LocalSessions({"shop": {"sqlite": "sqlite:///shop.sqlite"}})
    with open_one(source, SessionRequest("shop", "sqlite")) as session:
        session.execute("SELECT 1")

- ``SessionRequest(db, dialect, preprocess_sql, limits, key, worker_id)`` (``sqlrl.db.types``):
  ``db`` is a catalog id or a database URL; ``limits`` None means the source's default; ``key``
  (a trajectory id) lets a pool route the request (which shard), others ignore it. The same
  object goes on to the pool client and the shard (``PoolClient.lease_many(requests)``).
- ``SessionSource``: ``open_many(requests)`` gives one fresh session per request, in order (an
  object with ``execute(sql) -> QueryResult``), all or nothing: when one cannot be opened it
  raises (``SessionError``; the pool's ``LeaseError`` is one) after closing those it opened.
  ``close_many(sessions)`` is best effort and never raises. Optional ``execute_many(pairs)``:
  ``[(session, sql)] -> [QueryResult]`` in one call (the agent loop then runs a round's tool calls
  at once; the Ray pool: one round trip per shard).
- ``DurableSessions`` (optional, declared): a source whose sessions outlive the process that opened
  them (pool leases) names each in a JSON record (``record_of``) that another process can release
  (``release_records``): a restarted gateway releases its dead incarnation's sessions this way.
  ``PoolSessions`` is one; ``LocalSessions`` is not (its sessions die with the process).
- Two implementations: ``LocalSessions`` (in this process: ``open_session``, or checkouts of a
  ``SessionPool``) and ``PoolSessions`` (leases from a ``PoolClient``: ``lease_many``,
  ``execute_many``, ``release_many``; Ray-free itself, the client carries the transport).

Not guaranteed here: what a session isolates (``docs/sessions.md``) -- a source only opens them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from .leases.client import LeasedSession, PoolClient
from .leases.protocol import Lease
from .sessions.session import open_session
from .types import Limits, QueryResult, SessionRequest


class SessionSource(Protocol):
    def open_many(self, requests: Sequence[SessionRequest]) -> list[Any]:
        """One fresh session per request, in order; raises after closing those it opened."""

    def close_many(self, sessions: Sequence[Any]) -> None:
        """Best effort; never raises."""

    # Optional: ``execute_many(pairs: [(session, sql)]) -> [QueryResult]``.


@runtime_checkable
class DurableSessions(Protocol):
    """A ``SessionSource`` whose sessions another process can release (module docstring)."""

    def record_of(self, session: Any) -> dict[str, Any]:
        """A JSON-ready record naming ``session`` (opened by this source)."""

    def release_records(self, records: Sequence[Mapping[str, Any]]) -> list[bool]:
        """Release the sessions the records name (from any process); per record, whether this call
        ended it (False: already ended, or gone with its server). Never raises."""


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
    """Leases from a ``PoolClient`` (or any object with its ``lease_many`` / ``execute`` /
    ``execute_many`` / ``release_many``): one ``lease_many`` of the requests themselves per call
    (one round trip per shard; a request's ``key`` picks the shard; all or nothing), a round's SQL
    in one ``execute_many``, everything released together."""

    def __init__(self, client: PoolClient) -> None:
        self.client = client

    def open_many(self, requests: Sequence[SessionRequest]) -> list["LeasedSession"]:
        return [LeasedSession(self.client, lease) for lease in self.client.lease_many(requests)]

    def close_many(self, sessions: Sequence["LeasedSession"]) -> None:
        self.client.release_many([s.lease for s in sessions])

    def execute_many(self, pairs: Sequence[tuple["LeasedSession", str]]) -> list[QueryResult]:
        """A round's execute_sql calls: one ``submit_many`` per shard (never raises)."""
        return self.client.execute_many([(s.lease, sql) for s, sql in pairs])

    def record_of(self, session: "LeasedSession") -> dict[str, Any]:
        """``DurableSessions``: the lease, as a dict."""
        return dataclasses.asdict(session.lease)

    def release_records(self, records: Sequence[Mapping[str, Any]]) -> list[bool]:
        """``DurableSessions``: ``release_many`` of the recorded leases (a lease of a shard
        incarnation that is gone is False: its session went with it). Never raises."""
        try:
            leases = [Lease(**dict(r)) for r in records]
        except TypeError:
            return [False] * len(records)
        return self.client.release_many(leases)


__all__ = ["DurableSessions", "LocalSessions", "PoolSessions", "SessionRequest", "SessionSource", "open_one"]
