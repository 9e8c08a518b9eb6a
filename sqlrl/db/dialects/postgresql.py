"""PostgreSQL adapter: every session works in its own database, as its own role, in autocommit.

Isolation ("scratch-database"): ``connect`` takes a prepared clone of the URL's base from
``sqlrl.db.provisioning.scratch`` — a database ``CREATE DATABASE … TEMPLATE <base>`` and a login role made for
this session alone (``postgresql_admin``: what the server enforces). Everything the session does
(TEMP tables, CREATE/ALTER/DROP, DML, views, sequences, its own role's settings) stays in that
database and role, is invisible to every other session, and is dropped when the session closes;
the base has no CONNECT for any agent role. Statements run in autocommit: a COMMIT has nothing
to escape into, and there is no savepoint round trip. A connection serves one session
(``end`` says it is not reusable; ``close`` gives it back to ``scratch``, which drops the clone).

Row-returning queries (SELECT/VALUES/TABLE/WITH without data-modifying parts) run through a
server-side cursor (``BEGIN; DECLARE … ; FETCH n`` in one round trip), so the row cap also bounds
client memory and server work: a cross join of a billion rows stops after ``max_rows + 1`` rows.
The server measures every streamed row before sending it -- the length of the row's text
(``record_out``, at least what the wire carries), with names qualified by ``pg_catalog`` so that
nothing the session creates is called: a row longer than ``postgresql_wrap.row_bytes`` (a 16th of
``Limits.max_bytes``, at least 64 KiB) ends the query with a ``runtime`` error instead of reaching
libpq, which would hold it whole (decoded, ~4x its size) before the executor's byte cap applies;
and a later FETCH asks for at most ``LATER_BATCH_ROWS`` rows (``batch_rows``: the executor's
``BatchBound``), so no FETCH brings more than ``max(16 x max_bytes, 16 MiB)`` of text however
the rows widen. The text that runs a streamed query (cursor, barrier, check) and the reading of
the check's error are ``postgresql_wrap``.
The cursor's transaction block is ended (``COMMIT``, or ``ROLLBACK`` after an error, read from
libpq's local transaction status) in the same round trip as the session's next statement.

Timeout: ``statement_timeout`` and ``lock_timeout`` (= ``Limits.timeout_s``) and
``idle_in_transaction_session_timeout`` (``IDLE_IN_TRANSACTION_TIMEOUT_S``) are startup options;
a later statement of a call and every later ``FETCH`` get ``SET statement_timeout`` = the time
left to the call, and the next call ``RESET``s them. The executor's watchdog cancels from outside
(libpq's cancel request) whatever the session SET.

Read-only attestation (``read_only``, ``QueryResult.read_only``): a streamed statement's
transaction block is still open when its rows have been read, so the server is asked in that
block whether the transaction was given an xid (``pg_current_xact_id_if_assigned() IS NULL``;
``txid_current_if_assigned()`` before PostgreSQL 13): PostgreSQL assigns one to the first write
of any kind -- a row of any table (TEMP included) or a catalog row (DDL) -- whatever wrote it,
e.g. a function the query calls. No xid: the statement wrote nothing (True); an xid: it wrote
(False). Statements that are not streamed (DML, DDL, SET, SHOW, EXPLAIN, SELECT INTO, ...) ran
in autocommit, so there is no block left to ask: None. The question is one more round trip per
streamed statement, in the block, with no effect on it (the block still ends as before); it is
asked only when ``Limits.attest`` is on (the reward judge's sessions), never in rollouts.

Sandbox (friendly errors; the wall is the server): statements are split and classified by their
parse node with pglast (PostgreSQL's own parser: ``postgresql_lex``), whose ``denial`` refuses
role switching, COPY, ALTER SYSTEM, LISTEN/NOTIFY, extensions, role/database/tablespace DDL,
transaction control (incl. two-phase commit), DISCARD, CLOSE ALL, file/signal/admin functions and
the session's own cursor name. The agent connection refuses a role that is a superuser, has
CREATEROLE or is a member of a file/signal role (a check on what ``scratch`` created); that it
is a member of no role at all, so of no ``OWNER_ROLE`` it could ``SET ROLE`` to, is verified on
this connection by the admin's ``hand_over`` before ``scratch`` hands it out.
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
from .base import clone_source, error_message, register_dialect
from .postgresql_admin import OWNER_ROLE
from .postgresql_connect import connect_kwargs
from .postgresql_lex import denial, split, streamable
from .postgresql_wrap import CURSOR as _CURSOR
from .postgresql_wrap import LATER_BATCH_ROWS, OWN_TEXT, row_bytes, row_cap, streamed_text, wide_row

__all__ = ["PostgreSQLDialect", "StatementError", "denial"]

IDLE_IN_TRANSACTION_TIMEOUT_S = 600  # an abandoned session dies server-side after this
FIRST_BATCH_ROWS = 16  # rows fetched with DECLARE (later FETCHes are sized by the executor)
_FULL_BUDGET_MARGIN_MS = 50  # a statement starting this close to the call's start gets no SET
_NO_XID_SQL = "SELECT pg_current_xact_id_if_assigned() IS NULL"  # PostgreSQL 13+
_NO_TXID_SQL = "SELECT txid_current_if_assigned() IS NULL"  # 10-12
_RESET_LIMITS = ("RESET statement_timeout; RESET lock_timeout; "
                 "RESET idle_in_transaction_session_timeout; RESET standard_conforming_strings; ")
_ESCALATING_ROLES = ("pg_read_server_files", "pg_write_server_files", "pg_execute_server_program",
                     "pg_signal_backend")

_SYNTAX_CODES = {"42601", "42602", "42622", "42939"}
_PERMISSION_CODES = {"42501", "28000", "28P01", "2F003", "0LP01"}
_TIMEOUT_CODES = {"57014", "55P03"}
_LINE_RE = re.compile(r"\bLINE (\d+):")


class _Connection(_ext.connection):
    """A psycopg2 connection carrying the settings it was opened with."""

    limits: Limits
    batch_rows: int = FIRST_BATCH_ROWS
    row_cap: str = ""  # the streamed query's row-size check (``row_cap``)
    row_bytes: int = 0  # the most text one streamed row may have (``row_bytes``)


@dataclass
class _State:
    """A session's own bookkeeping (the transaction status is read locally from libpq)."""

    limits_set: bool = False  # sqlrl shortened the timeouts: RESET them before the next call


class StatementError(Exception):
    """A statement's error with sqlrl's own wrapping removed from the message."""

    def __init__(self, message: str, pgcode: str | None = None, kind: ErrorKind | None = None):
        super().__init__(message)
        self.pgcode = pgcode
        self.kind = kind


# --- results ---------------------------------------------------------------------------------------

class _StreamedCursor:
    """The rows of a server-side cursor, fetched on demand as many as the executor asks for
    (it sizes batches by bytes, at most ``batch_rows``), at most ``LATER_BATCH_ROWS`` per FETCH
    (one arrives whole). Every FETCH carries ``SET statement_timeout`` = the time left
    to the call, so a slow cursor cannot take a full timeout per FETCH."""

    rowcount = -1

    def __init__(self, adapter: "PostgreSQLDialect", conn: Any, state: _State, cur: Any,
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
                raise StatementError("canceling statement due to statement timeout "
                                     "(while fetching rows)", "57014")
            want = min(size - len(out), LATER_BATCH_ROWS)  # one FETCH arrives whole
            self._cur.close()  # drop the previous batch's result before the next arrives
            self._cur = self._conn.cursor()
            self._state.limits_set = True
            self._adapter._execute(self._conn, self._cur, f"SET statement_timeout = {left_ms}; "
                                   f"FETCH FORWARD {want} FROM {_CURSOR}", 0, wrapped=True)
            more = self._cur.fetchall()
            self._done = len(more) < want
            out.extend(more)
        return out

    def close(self) -> None:
        self._cur.close()


@register_dialect("postgresql")
class PostgreSQLDialect:
    isolation = "scratch-database"

    # -- connections ---------------------------------------------------------------------------

    def connect(self, url: URL, limits: Limits) -> Any:
        """An agent connection on a fresh clone of ``url``'s database (``url``: an admin URL of the
        base, ``provision.session_url``)."""
        if "allow_superuser" in url.query:
            raise SessionError("?allow_superuser is not supported: the agent's SQL always runs as "
                               "a role made for its session; give the admin URL of the base")
        return clone_source().take(url, limits, self)

    def open_agent(self, url: URL, limits: Limits) -> Any:
        """Log in as a session's own role (``scratch`` calls this when preparing a clone)."""
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
        conn.autocommit = True
        conn.limits = limits
        conn.batch_rows = min(limits.max_rows + 1, FIRST_BATCH_ROWS)
        conn.row_cap = row_cap(limits.max_bytes)  # once per session, not per call
        conn.row_bytes = row_bytes(limits.max_bytes)
        try:
            self._refuse_privileged(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _refuse_privileged(self, conn: Any) -> None:
        """Superuser status comes with the connection (no query); the escalation check is one
        catalog query, made while the clone is prepared (off the lease path). Membership in
        ``OWNER_ROLE`` is not refused here: the role has it while it takes ownership of its clone,
        and the admin's ``hand_over`` takes it back and verifies, on this login, that the role is
        a member of no role before ``scratch`` hands the connection out."""
        why = None
        if conn.get_parameter_status("is_superuser") == "on":
            why = "is a superuser"
        else:
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
        if why:
            raise SessionError(
                f"refusing to run agent SQL as PostgreSQL role {conn.info.user!r}, which {why} "
                f"(was it made by an older sqlrl, or is the role {OWNER_ROLE!r} granted a "
                "privileged role? sqlrl.db.provisioning.provision.prepare_server(admin_url) revokes that)")

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
        """Give the connection back: ``scratch`` closes it and drops its database and role."""
        clone_source().give_back(conn)

    def close_agent(self, conn: Any) -> None:
        conn.close()

    # -- workspace -----------------------------------------------------------------------------

    def begin(self, conn: Any, url: URL) -> Any:
        """Nothing to do: the connection's database is the session's own."""
        return _State()

    def end(self, conn: Any, state: Any) -> bool:
        """Never reusable: the database is dropped with the connection."""
        return False

    # -- statements ----------------------------------------------------------------------------

    def canceller(self, conn: Any) -> Any:
        """What the watchdog calls to stop this connection's statement from outside: libpq's
        cancel request (the backend gets SIGINT, as from ``pg_cancel_backend``)."""
        return conn.cancel

    def run(self, conn: Any, state: Any, statement: str, deadline: float) -> Any:
        cur = conn.cursor()
        try:
            prefix = self._prelude(conn, state)
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms < 1:
                raise StatementError("canceling statement due to statement timeout (the call's "
                                     "time limit was used up)", "57014")
            if left_ms < conn.limits.timeout_s * 1000 - _FULL_BUDGET_MARGIN_MS:
                # a later statement of the call: the server's timers get only the time left
                prefix += f"SET statement_timeout = {left_ms}; SET lock_timeout = {left_ms};"
                state.limits_set = True
            if streamable(statement):
                text = prefix + streamed_text(statement, conn.row_cap, conn.batch_rows)
                self._execute(conn, cur, text, 1, wrapped=True)
                return _StreamedCursor(self, conn, state, cur, deadline)
            if prefix:
                self._execute(conn, cur, f"{prefix}\n{statement}", 1)
            else:
                self._execute(conn, cur, statement, 0)
            return cur
        except BaseException:
            cur.close()
            raise

    def batch_rows(self, conn: Any) -> int:
        """One FETCH arrives whole: at most ``LATER_BATCH_ROWS`` rows of at most ``row_bytes``
        each (``postgresql_wrap``), however narrow the rows before them were."""
        return LATER_BATCH_ROWS

    def observe(self, conn: Any, state: Any) -> None:
        """Nothing to prepare: the server's transaction id tells (``read_only``)."""

    def read_only(self, conn: Any, state: Any, cursor: Any) -> bool | None:
        """Whether the statement that just ran wrote nothing, as the server says (module doc)."""
        if (not isinstance(cursor, _StreamedCursor)
                or conn.info.transaction_status != _ext.TRANSACTION_STATUS_INTRANS):
            return None
        with conn.cursor() as cur:
            cur.execute(_NO_XID_SQL if conn.server_version >= 130000 else _NO_TXID_SQL)
            (unassigned,) = cur.fetchone()
        return bool(unassigned)

    @staticmethod
    def _prelude(conn: Any, state: "_State") -> str:
        """What the statement's round trip starts with: the end of the previous streamed
        result's block, and the timeouts back to the session's own after a shortened one."""
        status = conn.info.transaction_status
        prefix = ("COMMIT;" if status == _ext.TRANSACTION_STATUS_INTRANS else
                  "ROLLBACK;" if status == _ext.TRANSACTION_STATUS_INERROR else "")
        if state.limits_set:
            state.limits_set = False
            prefix += _RESET_LIMITS
        return prefix

    def _execute(self, conn: Any, cur: Any, text: str, shift: int, wrapped: bool = False) -> None:
        """Send ``text``; wrap driver errors (messages without sqlrl's prefix lines). ``wrapped``:
        ``text`` runs or fetches a streamed query, whose row-size check may have stopped it."""
        try:
            cur.execute(text)
        except UnicodeEncodeError as exc:  # nothing was sent: the connection is as it was
            raise StatementError(f"the SQL text is not valid Unicode ({exc.reason} at character "
                                 f"{exc.start}): nothing was run", "42601") from exc
        except psycopg2.Error as exc:
            if conn.closed:
                raise StatementError(error_message(exc) or "the connection was closed",
                                     getattr(exc, "pgcode", None), ErrorKind.SESSION_LOST) from exc
            if wrapped and wide_row(exc):
                raise StatementError(
                    f"a row of this result has more than the byte limit on one row "
                    f"({conn.row_bytes:,} bytes of text; the call's limit is "
                    f"{conn.limits.max_bytes:,}), so it was not sent: select fewer or narrower "
                    "columns (e.g. left(col, 1000))", "54000") from exc
            message = OWN_TEXT.sub("", str(exc))
            if shift:
                message = _LINE_RE.sub(lambda m: f"LINE {max(1, int(m.group(1)) - shift)}:", message)
            raise StatementError(message.strip() or type(exc).__name__,
                                 getattr(exc, "pgcode", None)) from exc

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
        """``sql``'s statements as PostgreSQL reads them (``postgresql_lex``: pglast). Text that
        is not valid Unicode (a lone surrogate such as ``'\\ud800'``) cannot be sent at all: it
        is one statement, which ``run`` reports as a syntax error without contacting the server."""
        try:
            return split(sql)
        except UnicodeError:
            return [Statement(text=sql)]

    def denied(self, statement: Statement | str) -> str | None:
        return denial(statement)
