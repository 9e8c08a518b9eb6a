"""PostgreSQL adapter: every session is one transaction, rolled back at close.

Isolation ("transaction"): a session's statements run inside one transaction that ``end`` rolls
back, so TEMP tables, CREATE/ALTER/DROP, DML and views persist across the session's own calls, are
invisible to every other session (MVCC) and are gone afterwards. A savepoint per statement makes an
error undo only the failing statement:

- ``BEGIN; SAVEPOINT sqlrl_sp`` is sent in the same round trip as the session's first statement;
- after a successful statement the next call first sends one round trip
  ``[CLOSE sqlrl_c;] RESET <limits>; RELEASE SAVEPOINT sqlrl_sp; SAVEPOINT sqlrl_sp``;
- after a failed statement the next call prefixes ``ROLLBACK TO SAVEPOINT sqlrl_sp;`` to its own
  text (same round trip), so earlier statements' effects survive.

The refresh cannot share the statement's round trip: a statement that fails to parse aborts the
whole query string, and the savepoint would then still be the one before the previous statement.
``end`` is ``ROLLBACK; DISCARD ALL`` (prepared statements, advisory locks, cursors, GUCs); the
connection is reusable when it is back to idle.

Row-returning queries (SELECT/VALUES/TABLE/WITH without data-modifying parts) run through a
server-side cursor (``DECLARE … ; FETCH n`` in one round trip), so the row cap also bounds client
memory and server work: a cross join of a billion rows stops after ``max_rows + 1`` rows.

Timeout: ``statement_timeout`` and ``lock_timeout`` (= ``Limits.timeout_s``) and
``idle_in_transaction_session_timeout`` (``IDLE_IN_TRANSACTION_TIMEOUT_S``) are startup options, so
``RESET``/``DISCARD ALL`` restore them; they are re-``RESET`` before every statement, so even a
``DO`` block's dynamic ``SET`` cannot carry over. Each later ``FETCH`` of a streamed result is also
checked against the statement's deadline.

Sandbox: sessions refuse superusers and roles that can escalate (CREATEROLE, members of
pg_read/write_server_files, pg_execute_server_program, pg_signal_backend) unless the URL says
``?allow_superuser=1`` (unsafe: only for trusted SQL). Statements are split and classified by
their parse node with pglast (PostgreSQL's own parser: ``postgresql_lex``), whose ``denial``
refuses role switching, COPY, ALTER SYSTEM, LISTEN/NOTIFY, extensions, role/database/tablespace
DDL, transaction control (incl. two-phase commit), DISCARD, CLOSE ALL, file/signal/admin functions
and the session's own savepoint/cursor names; the transaction status is checked after every
statement as a last line of defence.
``sqlrl.db.provision`` creates the unprivileged role and revokes file/signal functions per database.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extensions as _ext
from sqlalchemy.engine import URL

from ..statements import Statement
from ..types import ErrorKind, Limits, SessionError
from .base import error_message, register_dialect
from .postgresql_lex import denial, split, streamable

__all__ = ["PostgreSQLDialect", "StatementError", "connect_kwargs", "denial"]

IDLE_IN_TRANSACTION_TIMEOUT_S = 600  # an abandoned session dies server-side after this
FIRST_BATCH_ROWS = 16  # rows fetched with DECLARE (later FETCHes are sized by the executor)
CONNECT_TIMEOUT_S = 10
_FULL_BUDGET_MARGIN_MS = 50  # a statement starting this close to the call's start gets no SET
_SAVEPOINT = "sqlrl_sp"
_CURSOR = "sqlrl_c"
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_OWN_QUERY_KEYS = {"allow_superuser"}  # URL query keys sqlrl reads itself (not passed to libpq)
_RESET_LIMITS = ("RESET statement_timeout; RESET lock_timeout; "
                 "RESET idle_in_transaction_session_timeout; RESET standard_conforming_strings; ")
_ESCALATING_ROLES = ("pg_read_server_files", "pg_write_server_files", "pg_execute_server_program",
                     "pg_signal_backend")

_VETTED: set[tuple[Any, ...]] = set()  # (host, port, database, role) that passed the check

_SYNTAX_CODES = {"42601", "42602", "42622", "42939"}
_PERMISSION_CODES = {"42501", "28000", "28P01", "2F003", "0LP01"}
_TIMEOUT_CODES = {"57014", "55P03"}


class _Connection(_ext.connection):
    """A psycopg2 connection carrying the settings it was opened with."""

    limits: Limits
    batch_rows: int = FIRST_BATCH_ROWS


@dataclass
class _Txn:
    """Where a session's transaction stands (the server's status is read locally from libpq)."""

    began: bool = False  # the transaction is open (seen in the server's status)
    dirty: bool = False  # a statement succeeded since the savepoint was (re)set
    failed: bool = False  # the last statement failed client-side (deadline): roll it back
    cursor_open: bool = False  # the streamed result's cursor still needs CLOSE


class StatementError(Exception):
    """A statement's error with sqlrl's own wrapping removed from the message."""

    def __init__(self, message: str, pgcode: str | None = None, kind: ErrorKind | None = None):
        super().__init__(message)
        self.pgcode = pgcode
        self.kind = kind


# --- URL -> libpq keywords (shared with sqlrl.db.provision) ----------------------------------------

def connect_kwargs(url: URL, database: str | None = None) -> dict[str, Any]:
    """psycopg2.connect keywords for ``url`` (its query string passes through to libpq)."""
    kw: dict[str, Any] = {
        "host": url.host, "port": url.port, "user": url.username, "password": url.password,
        "dbname": database or url.database or "postgres",
        "connect_timeout": CONNECT_TIMEOUT_S, "application_name": "sqlrl",
    }
    if url.host in _LOOPBACK:
        kw["sslmode"] = "disable"  # no SSLRequest round trip on loopback
    for key, value in url.query.items():
        if key not in _OWN_QUERY_KEYS:
            kw[key] = value[-1] if isinstance(value, tuple) else value
    return {k: v for k, v in kw.items() if v is not None}


def _flag(url: URL, key: str) -> bool:
    value = url.query.get(key)
    value = value[-1] if isinstance(value, tuple) else value
    return str(value).lower() in ("1", "true", "yes", "on")


# --- results ---------------------------------------------------------------------------------------

class _StreamedCursor:
    """The rows of a server-side cursor, fetched on demand as many as the executor asks for
    (it sizes batches by bytes). Every FETCH carries ``SET statement_timeout`` = the time left
    to the call, so a slow cursor cannot take a full timeout per FETCH."""

    rowcount = -1

    def __init__(self, adapter: "PostgreSQLDialect", conn: Any, state: _Txn, cur: Any,
                 deadline: float) -> None:
        self._adapter, self._conn, self._state, self._cur = adapter, conn, state, cur
        self._deadline = deadline
        self.description = cur.description
        self._rows = cur.fetchall()
        self._done = len(self._rows) < conn.batch_rows
        self._pos = 0

    def fetchmany(self, size: int) -> list[tuple[Any, ...]]:
        out = self._rows[self._pos:self._pos + size]
        self._pos += len(out)
        if self._pos >= len(self._rows):
            self._rows, self._pos = [], 0  # free the batch already handed out
        while len(out) < size and not self._done:
            left_ms = int((self._deadline - time.monotonic()) * 1000)
            if left_ms < 1:
                self._state.failed = True
                raise StatementError("canceling statement due to statement timeout "
                                     "(while fetching rows)", "57014")
            want = size - len(out)
            self._cur.close()  # drop the previous batch's result before the next arrives
            self._cur = self._conn.cursor()
            self._adapter._execute(self._conn, self._state, self._cur,
                                   f"SET statement_timeout = {left_ms}; "
                                   f"FETCH FORWARD {want} FROM {_CURSOR}", 0)
            more = self._cur.fetchall()
            self._done = len(more) < want
            out.extend(more)
        return out

    def close(self) -> None:
        self._cur.close()


_OPEN = (_ext.TRANSACTION_STATUS_INTRANS, _ext.TRANSACTION_STATUS_INERROR)
_LINE_RE = re.compile(r"\bLINE (\d+):")
_OWN_TEXT = re.compile(rf"DECLARE {_CURSOR} NO SCROLL CURSOR FOR|\s*;FETCH FORWARD \d+ FROM {_CURSOR}"
                       rf"|SET statement_timeout = \d+; (FETCH FORWARD \d+ FROM {_CURSOR})?")


@register_dialect("postgresql")
class PostgreSQLDialect:
    name = "postgresql"
    sqlglot_dialect = "postgres"
    isolation = "transaction"

    # -- connections ---------------------------------------------------------------------------

    def connect(self, url: URL, limits: Limits) -> Any:
        ms = max(1, round(limits.timeout_s * 1000))
        options = (f"-c statement_timeout={ms} -c lock_timeout={ms} "
                   f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_S * 1000} "
                   "-c standard_conforming_strings=on -c cursor_tuple_fraction=1")
        kw = connect_kwargs(url)
        if kw.get("options"):
            options = f"{kw.pop('options')} {options}"
        try:
            conn = psycopg2.connect(connection_factory=_Connection, options=options, **kw)
        except psycopg2.Error as exc:
            raise SessionError(f"cannot connect to PostgreSQL at {url.host}:{url.port}: "
                               f"{error_message(exc)}") from exc
        conn.autocommit = True  # sqlrl sends BEGIN/ROLLBACK itself
        conn.limits = limits
        conn.batch_rows = min(limits.max_rows + 1, FIRST_BATCH_ROWS)
        try:
            if not _flag(url, "allow_superuser"):
                self._refuse_privileged(conn, url)
        except BaseException:
            conn.close()
            raise
        return conn

    def _refuse_privileged(self, conn: Any, url: URL) -> None:
        """Superuser status comes with the connection (no query); the escalation check costs a
        catalog query (~2 ms on a new backend), so a role that passed it is remembered per
        server/database/role for the life of the process."""
        why = None
        key = (conn.info.host, conn.info.port, conn.info.dbname, conn.info.user)
        if conn.get_parameter_status("is_superuser") == "on":
            why = "is a superuser"
        elif key not in _VETTED:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT (SELECT rolcreaterole FROM pg_roles WHERE rolname = current_user), "
                    "ARRAY(SELECT rolname::text FROM pg_roles WHERE rolname = ANY(%s) "
                    "AND pg_has_role(oid, 'MEMBER'))", (list(_ESCALATING_ROLES),))
                createrole, members = cur.fetchone()
            if createrole:
                why = "has CREATEROLE"
            elif members:
                why = f"is a member of {', '.join(members)}"
            else:
                _VETTED.add(key)
        if why:
            raise SessionError(
                f"refusing to run agent SQL as PostgreSQL role {conn.info.user!r}, which {why}: "
                "create an unprivileged role with sqlrl.db.provision.ensure_agent_role(admin_url) "
                "and grant_database(admin_url, db), then use provision.agent_url(admin_url, db) "
                "(or add ?allow_superuser=1 to the URL — unsafe, only for trusted SQL)")

    def ping(self, conn: Any) -> bool:
        if conn.closed:
            return False
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
            return conn.info.transaction_status == _ext.TRANSACTION_STATUS_IDLE
        except Exception:
            return False

    def close(self, conn: Any) -> None:
        conn.close()

    # -- workspace -----------------------------------------------------------------------------

    def begin(self, conn: Any, url: URL) -> Any:
        """Nothing is sent: BEGIN rides along with the session's first statement."""
        if conn.info.transaction_status != _ext.TRANSACTION_STATUS_IDLE:
            raise SessionError("the connection is not idle (a previous session did not end)")
        return _Txn()

    def end(self, conn: Any, state: Any) -> bool:
        if conn.closed:
            return False
        if state is not None and not state.began:
            return conn.info.transaction_status == _ext.TRANSACTION_STATUS_IDLE
        with conn.cursor() as cur:
            cur.execute("ROLLBACK")
            cur.execute("DISCARD ALL")  # prepared statements, advisory locks, GUCs, temp schema
        return conn.info.transaction_status == _ext.TRANSACTION_STATUS_IDLE

    # -- statements ----------------------------------------------------------------------------

    def canceller(self, conn: Any) -> Any:
        """What the watchdog calls to stop this connection's statement from outside: libpq's
        cancel request (the backend gets SIGINT, as from ``pg_cancel_backend``)."""
        return conn.cancel

    def timed_out(self, conn: Any, state: Any) -> None:
        """The watchdog stopped the call: undo its last statement at the next call."""
        if state is not None and state.began:
            state.failed = True

    def run(self, conn: Any, state: Any, statement: str, deadline: float) -> Any:
        cur = conn.cursor()
        try:
            prefix = self._prelude(conn, state, cur)
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms < 1:
                raise StatementError("canceling statement due to statement timeout (the call's "
                                     "time limit was used up)", "57014")
            if left_ms < conn.limits.timeout_s * 1000 - _FULL_BUDGET_MARGIN_MS:
                # a later statement of the call: the server's timers get only the time left
                prefix += f"SET statement_timeout = {left_ms}; SET lock_timeout = {left_ms};"
            if streamable(statement):
                text = (f"{prefix}DECLARE {_CURSOR} NO SCROLL CURSOR FOR\n{statement}\n"
                        f";FETCH FORWARD {conn.batch_rows} FROM {_CURSOR}")
                self._execute(conn, state, cur, text, 1, statement_ran=True)
                state.cursor_open = True
                return _StreamedCursor(self, conn, state, cur, deadline)
            if prefix:
                self._execute(conn, state, cur, f"{prefix}\n{statement}", 1, statement_ran=True)
            else:
                self._execute(conn, state, cur, statement, 0, statement_ran=True)
            return cur
        except BaseException:
            cur.close()
            raise

    def _prelude(self, conn: Any, state: _Txn, cur: Any) -> str:
        """Bring the transaction to "savepoint set right after the last successful statement";
        returns the text to prefix to the statement (same round trip)."""
        status = conn.info.transaction_status
        if not state.began:  # (a first statement that failed to parse left no transaction)
            return f"BEGIN; SAVEPOINT {_SAVEPOINT};"
        if status == _ext.TRANSACTION_STATUS_INERROR or state.failed:
            state.failed = state.dirty = state.cursor_open = False
            return f"ROLLBACK TO SAVEPOINT {_SAVEPOINT};"
        if status != _ext.TRANSACTION_STATUS_INTRANS:
            raise StatementError("the session's transaction ended unexpectedly; its state is gone",
                                 kind=ErrorKind.SESSION_LOST)
        if state.dirty:
            close = f"CLOSE {_CURSOR}; " if state.cursor_open else ""
            self._execute(conn, state, cur, f"{close}{_RESET_LIMITS}RELEASE SAVEPOINT {_SAVEPOINT}; "
                          f"SAVEPOINT {_SAVEPOINT}", 0)
            state.dirty = state.cursor_open = False
        return ""

    def _execute(self, conn: Any, state: _Txn, cur: Any, text: str, shift: int,
                 statement_ran: bool = False) -> None:
        """Send ``text``; wrap driver errors (messages without sqlrl's prefix lines) and check that
        the session's transaction is still open."""
        try:
            cur.execute(text)
        except psycopg2.Error as exc:
            if conn.info.transaction_status in _OPEN:
                state.began = True
            if conn.closed:
                raise StatementError(error_message(exc) or "the connection was closed",
                                     getattr(exc, "pgcode", None), ErrorKind.SESSION_LOST) from exc
            message = _OWN_TEXT.sub("", str(exc))
            if shift:
                message = _LINE_RE.sub(lambda m: f"LINE {max(1, int(m.group(1)) - shift)}:", message)
            raise StatementError(message.strip() or type(exc).__name__,
                                 getattr(exc, "pgcode", None)) from exc
        if conn.info.transaction_status != _ext.TRANSACTION_STATUS_INTRANS:
            # Impossible through the sandbox (no COMMIT/ROLLBACK reaches the server); if it ever
            # happens the session's isolation is gone, so the connection is closed for good.
            conn.close()
            raise StatementError("the session's transaction ended unexpectedly; the connection "
                                 "was closed", kind=ErrorKind.SESSION_LOST)
        state.began = True
        if statement_ran:
            state.dirty = True

    # -- errors and the sandbox ----------------------------------------------------------------

    def classify(self, exc: BaseException) -> ErrorKind:
        kind = getattr(exc, "kind", None)
        if isinstance(kind, ErrorKind):
            return kind
        code = getattr(exc, "pgcode", None) or ""
        if code in _TIMEOUT_CODES:
            return ErrorKind.TIMEOUT
        if code in _SYNTAX_CODES:
            return ErrorKind.SYNTAX
        if code in _PERMISSION_CODES:
            return ErrorKind.PERMISSION
        if code[:2] in ("08", "57") or code == "25P03":
            return ErrorKind.SESSION_LOST
        if isinstance(exc, psycopg2.InterfaceError) or (
                isinstance(exc, psycopg2.OperationalError) and not code):
            return ErrorKind.SESSION_LOST
        return ErrorKind.RUNTIME

    def lex(self, conn: Any, sql: str) -> list[Statement]:
        """``sql``'s statements as PostgreSQL reads them (``postgresql_lex``: pglast)."""
        return split(sql)

    def denied(self, statement: Statement | str) -> str | None:
        return denial(statement)
