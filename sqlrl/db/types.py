"""Typed contracts of the session layer: session requests, limits, errors and query results.

Guarantees:
- Every value here is a frozen dataclass or an enum, picklable, and safe to send across process
  (and Ray actor) boundaries.
- ``QueryResult.rows`` holds only JSON-serialisable, hashable Python values (see ``normalize``):
  ``None``, ``bool``, ``int``, ``float``, ``str``. Each row is a tuple, so rows can be put in sets
  and multisets by the comparators without conversion.
- A failed statement never raises out of ``Session.execute``: it returns a ``QueryResult`` whose
  ``error`` says what kind of failure happened and carries the driver's message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable


class ErrorKind(str, enum.Enum):
    """What kind of failure a statement hit. Values are stable strings (used in observations)."""

    SYNTAX = "syntax"  # the SQL did not parse
    TIMEOUT = "timeout"  # the statement (or a lock wait) ran past the limit and was stopped
    PERMISSION = "permission"  # denied by the sandbox or by the database's privileges
    RUNTIME = "runtime"  # any other error the database raised (no such column, division by zero, ...)
    SESSION_LOST = "session-lost"  # the session is closed or its connection died
    LEASE_EXPIRED = "lease-expired"  # the pool reclaimed the session: unused for longer than its TTL


@dataclass(frozen=True)
class QueryError:
    kind: ErrorKind
    message: str
    statement_index: int = 0  # which statement of a multi-statement call failed (0-based)

    def __str__(self) -> str:
        return f"{self.kind.value} error: {self.message}"


@dataclass(frozen=True)
class Limits:
    """Limits applied to every call of a session.

    ``timeout_s`` bounds the whole ``execute`` call (all its statements and fetches). It is
    enforced by the database itself (SQLite progress handler, PostgreSQL ``statement_timeout`` +
    ``lock_timeout`` set to the time left, MariaDB ``max_statement_time``) so that the work really
    stops, and on the servers also by the watchdog (``sqlrl.db.sessions.watchdog``) from outside the
    session. ``max_rows``/``max_bytes`` cap what one call returns (``truncated=True``); results
    are fetched in batches sized by bytes, so client memory stays near ``max_bytes``.

    ``attest`` asks the engine, after each statement, whether it only read
    (``QueryResult.read_only``). It costs something on some engines (PostgreSQL: one more round
    trip per streamed statement; SQLite: the statement is compiled afresh), so it is off unless a
    caller needs the answer: the reward ``Judge`` and the BIRD-CRITIC runner turn it on; rollout
    and serving sessions leave it off (``read_only`` is then None).
    """

    timeout_s: float = 5.0
    max_rows: int = 10_000
    max_bytes: int = 4 * 1024 * 1024
    max_statements: int = 32  # statements in one execute() call
    max_sql_chars: int = 200_000
    attest: bool = False  # ask the engine whether each statement only read (QueryResult.read_only)

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"Limits.timeout_s must be > 0, got {self.timeout_s}")
        for name in ("max_rows", "max_bytes", "max_statements", "max_sql_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class SessionRequest:
    """Ask for one trajectory-scoped session. The one shape of a request from its maker (the agent,
    the judge, the gateway) through a ``SessionSource`` and the pool client to the shard that
    opens it: nothing on the way converts it to another type (a pool client fills in ``key`` and
    ``worker_id`` with ``dataclasses.replace``).

    ``db`` is a catalog id or a database URL; ``dialect`` is needed when a catalog id has copies
    in several dialects; ``limits`` None means the source's (or shard's) default; ``key`` (e.g. the
    trajectory id) lets a pool route the request to a shard, others ignore it; ``worker_id`` names
    who holds the session in a pool's logs, stats and reclaim reports. ``preprocess_sql`` must be
    a sequence of SQL strings (kept as a tuple); one string is refused with ``TypeError``."""

    db: str
    dialect: str | None = None
    preprocess_sql: tuple[str, ...] = ()
    limits: Limits | None = None
    key: str | None = None
    worker_id: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.preprocess_sql, str) or not all(
                isinstance(s, str) for s in self.preprocess_sql):
            raise TypeError("SessionRequest.preprocess_sql must be a sequence of SQL strings")
        object.__setattr__(self, "preprocess_sql", tuple(self.preprocess_sql))


@dataclass(frozen=True)
class QueryResult:
    """The outcome of one ``Session.execute`` call (possibly several statements).

    For a multi-statement call, ``columns``/``rows`` are those of the last statement that ran;
    on error, execution stopped at ``error.statement_index`` and earlier statements' effects stay
    in the session.

    ``row_count`` is ``len(rows)``; ``affected_rows`` is the driver's count of rows changed by the
    last statement when it was DML (``None`` otherwise or when unknown).

    ``read_only`` is what the *engine* attests about the whole call, never read from the SQL text:
    True when it attests that every statement only read, False when it saw a statement write, None
    when the call is not attested (an engine, or a statement, its adapter cannot judge; a failed
    call). What each engine counts as a write: docs/rewards.md ("Read-only, as the engine
    attests it").
    """

    columns: tuple[str, ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    row_count: int = 0
    truncated: bool = False
    error: QueryError | None = None
    elapsed_ms: float = 0.0
    affected_rows: int | None = None
    statements: int = 1
    read_only: bool | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def failure(
        cls, kind: ErrorKind, message: str, *, statement_index: int = 0, elapsed_ms: float = 0.0,
        statements: int = 1,
    ) -> "QueryResult":
        return cls(error=QueryError(kind, message, statement_index), elapsed_ms=elapsed_ms,
                   statements=statements)

    def to_dict(self) -> dict[str, Any]:
        return {
            "columns": list(self.columns),
            "rows": [list(r) for r in self.rows],
            "row_count": self.row_count,
            "truncated": self.truncated,
            "error": None if self.error is None else {
                "kind": self.error.kind.value, "message": self.error.message,
                "statement_index": self.error.statement_index},
            "elapsed_ms": self.elapsed_ms,
            "affected_rows": self.affected_rows,
            "statements": self.statements,
            "read_only": self.read_only,
        }


def read_only_of(flags: Iterable[bool | None]) -> bool | None:
    """``read_only`` over several statements or calls: False when any is False (a write anywhere
    is a write), else None when any is None (not attested), else True (also for no flags)."""
    out: bool | None = True
    for flag in flags:
        if flag is False:
            return False
        if flag is not True:
            out = None
    return out


class SessionError(Exception):
    """Raised by ``open_session`` when a session cannot be set up (bad URL, unreachable server,
    a failing ``preprocess_sql`` statement, a privileged role). ``execute`` never raises it."""


class PolicyViolation(Exception):
    """Raised inside the executor when the sandbox rejects a statement; becomes a PERMISSION error."""


@dataclass(frozen=True)
class SessionInfo:
    """What a session reports about itself (for logs and the pool's stats)."""

    session_id: str
    dialect: str
    database: str
    isolation: str
    open_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
