"""Typed contracts of the DB-session pool's lease protocol (Ray-free; sent across actor boundaries).

A rollout worker or reward actor never holds a connection: it holds a ``Lease``, an id for one
trajectory-scoped session living on one shard. The protocol (implemented by ``sqlrl.db.leases.shard``):

    lease(SessionRequest) -> Lease                raises LeaseError (typed kind) when it cannot
    execute(lease, sql) -> QueryResult            never raises; a dead lease is an error result
    renew(lease) -> Lease                         heartbeat for long gaps between calls
    release(lease) -> bool                        idempotent; True only for the call that ended it

Guarantees:
- Every class here is a frozen dataclass, an enum, or an exception that pickles with its fields.
- A lease is asked for with the same ``sqlrl.db.types.SessionRequest`` the caller made (its
  ``worker_id`` filled in by the pool client): there is no separate lease-request type.
- ``Lease.expires_at`` is wall-clock (``time.time()``) so it means the same in every process; the
  shard keeps its own monotonic deadline, renewed on every ``execute`` (renew-on-use).
- ``Lease.incarnation`` names the shard process that granted it: a lease presented to a restarted
  shard is recognised as lost with the shard, not mistaken for an unknown or expired one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from ..types import SessionError
from ..url import dialect_name, parse_url


class LeaseErrorKind(str, enum.Enum):
    """Why a lease could not be granted. Values are stable strings (logged, shown in metrics)."""

    UNKNOWN_DATABASE = "unknown-database"  # a db id that is not in the catalog for that dialect
    BAD_REQUEST = "bad-request"  # malformed request: not a SessionRequest, no worker_id, wrong dialect for a URL
    CAPACITY = "capacity"  # the shard holds its maximum number of leases
    OPEN_FAILED = "open-failed"  # the session could not be set up (server down, preprocess_sql failed)
    SHARD_UNAVAILABLE = "shard-unavailable"  # the shard actor died or did not answer in time
    CLOSED = "closed"  # the shard is shutting down or draining (rebalanced away)


class LeaseError(SessionError):
    """A lease request failed; ``kind`` says why, ``message`` is for humans and logs."""

    def __init__(self, kind: LeaseErrorKind, message: str) -> None:
        super().__init__(kind, message)
        self.kind = LeaseErrorKind(kind)
        self.message = message

    def __str__(self) -> str:
        return f"lease {self.kind.value}: {self.message}"

    def __reduce__(self):  # pickle with the typed fields (Ray ships exceptions by pickle)
        return (type(self), (self.kind, self.message))


@dataclass(frozen=True)
class Catalog:
    """Where each database id lives, per dialect: ``{"concert_singer": {"sqlite": url, ...}}``.

    A job builds one catalog (from its task data and the loader's reports) and hands it to every
    shard; callers then lease by id (``db="concert_singer", dialect="postgresql"``). URLs are
    checked to belong to the dialect they are listed under.
    """

    urls: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        frozen = {}
        for db_id, by_dialect in self.urls.items():
            for dialect, url in by_dialect.items():
                actual = dialect_name(parse_url(url))
                if actual != dialect:
                    raise ValueError(f"catalog entry {db_id!r}/{dialect}: the URL is a {actual} URL")
            frozen[db_id] = MappingProxyType(dict(by_dialect))
        object.__setattr__(self, "urls", MappingProxyType(frozen))

    def __reduce__(self):  # mappingproxy does not pickle; ship plain dicts
        return (Catalog, ({k: dict(v) for k, v in self.urls.items()},))

    def resolve(self, db: str, dialect: str | None) -> tuple[str, str]:
        """``(url, dialect)`` for a db id or a URL. Raises ``LeaseError`` (unknown-database or
        bad-request) with a message that lists what is available."""
        if "://" in db:
            try:
                actual = dialect_name(parse_url(db))
            except Exception as exc:
                raise LeaseError(LeaseErrorKind.BAD_REQUEST, f"not a database URL: {exc}") from None
            if dialect is not None and dialect != actual:
                raise LeaseError(LeaseErrorKind.BAD_REQUEST,
                                 f"the URL is a {actual} URL but dialect {dialect!r} was asked for")
            return db, actual
        by_dialect = self.urls.get(db)
        if by_dialect is None:
            known = ", ".join(sorted(self.urls)[:10]) or "none"
            raise LeaseError(LeaseErrorKind.UNKNOWN_DATABASE,
                             f"no database {db!r} in the catalog (known: {known}"
                             f"{', ...' if len(self.urls) > 10 else ''})")
        if dialect is None:
            if len(by_dialect) != 1:
                raise LeaseError(LeaseErrorKind.BAD_REQUEST,
                                 f"database {db!r} exists in {sorted(by_dialect)}; name the dialect")
            dialect = next(iter(by_dialect))
        url = by_dialect.get(dialect)
        if url is None:
            raise LeaseError(LeaseErrorKind.UNKNOWN_DATABASE,
                             f"database {db!r} is not loaded into {dialect} "
                             f"(available: {', '.join(sorted(by_dialect))})")
        return url, dialect


@dataclass(frozen=True)
class Lease:
    """A granted session: present it to ``execute``/``renew``/``release`` on the same shard."""

    id: str
    shard: str  # shard id in the PartitionPlan
    incarnation: str  # the shard process that granted it (changes when Ray restarts the shard)
    worker_id: str
    db: str
    dialect: str
    expires_at: float  # wall clock; renewed by every execute and by renew()
    ttl_s: float


@dataclass(frozen=True)
class ExecuteRequest:
    """``execute(lease, sql)`` as one value: a Ray actor call costs ~0.2 ms per argument on a
    2-core machine (bench/pool.py), so the client sends one argument, not two."""

    lease: Lease
    sql: str

