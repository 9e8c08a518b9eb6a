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
``?allow_superuser=1`` (unsafe: only for trusted SQL). ``denied`` refuses role switching, COPY,
ALTER SYSTEM, LISTEN/NOTIFY, extensions, role/database/tablespace DDL, PREPARE TRANSACTION,
DISCARD, CLOSE ALL, file/signal/admin functions and the session's own savepoint/cursor names.
A statement holding a ``;`` outside strings/comments by PostgreSQL's own lexing rules (which the
splitter did not split on) is refused, so one ``execute`` can never smuggle a ``COMMIT``; the
transaction status is checked after every statement as a last line of defence.
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

from ..types import ErrorKind, Limits, SessionError
from .base import error_message, register_dialect

IDLE_IN_TRANSACTION_TIMEOUT_S = 600  # an abandoned session dies server-side after this
FETCH_BATCH_ROWS = 1000  # rows per FETCH of a streamed result
CONNECT_TIMEOUT_S = 10
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
    batch_rows: int = FETCH_BATCH_ROWS


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


# --- PostgreSQL's lexical rules: top-level ';' and a comment-free view ---------------------------

_IDENT_CHAR = r"[\w$\x80-\U0010ffff]"
_SCAN = re.compile(
    r"(?P<semi>;)|(?P<line>--)|(?P<block>/\*)"
    rf"|(?P<estr>(?<!{_IDENT_CHAR})[eE]')|(?P<str>')|(?P<ident>\")"
    rf"|(?P<dollar>(?<!{_IDENT_CHAR})\$(?:[A-Za-z_\x80-\U0010ffff][\w\x80-\U0010ffff]*)?\$)")
_ESTR_BODY = re.compile(r"(?:[^'\\]|\\.|'')*'", re.S)
_BLOCK_TOKEN = re.compile(r"/\*|\*/")


def scan(sql: str) -> tuple[str, bool]:
    """(``sql`` with comments blanked out, whether it holds a ``;`` outside strings and comments),
    following PostgreSQL's lexer with ``standard_conforming_strings = on``: '' strings without
    backslash escapes, E'' strings with them, "" identifiers, $tag$ bodies (not after an identifier
    character), -- comments and nested /* */ comments. Unterminated text makes the server reject
    the whole statement, so it counts as having no top-level ';'."""
    out: list[str] = []
    pos = 0
    n = len(sql)
    while pos < n:
        m = _SCAN.search(sql, pos)
        if m is None:
            out.append(sql[pos:])
            break
        kind = m.lastgroup
        if kind == "semi":
            return "".join(out) + sql[pos:], True
        out.append(sql[pos:m.start()])
        if kind == "line":
            end = sql.find("\n", m.end())
            end = n if end < 0 else end
            out.append(" ")
        elif kind == "block":
            depth, end = 1, m.end()
            while depth:
                t = _BLOCK_TOKEN.search(sql, end)
                if t is None:
                    return "".join(out), False
                depth += 1 if t.group() == "/*" else -1
                end = t.end()
            out.append(" ")
        else:
            if kind == "estr":
                body = _ESTR_BODY.match(sql, m.end())
                end = body.end() if body else -1
            elif kind in ("str", "ident"):
                quote = m.group()[-1]
                end = m.end()
                while True:
                    end = sql.find(quote, end)
                    if end < 0 or not sql.startswith(quote, end + 1):
                        break
                    end += 2
                end = end + 1 if end >= 0 else -1
            else:  # dollar
                close = sql.find(m.group(), m.end())
                end = close + len(m.group()) if close >= 0 else -1
            if end < 0:
                return "".join(out) + sql[m.start():], False
            out.append(sql[m.start():end])
        pos = end
    return "".join(out), False


# --- the sandbox -----------------------------------------------------------------------------------

_DENIED_HEADS = [
    (re.compile(r"SET\s+(SESSION\s+|LOCAL\s+)?(ROLE|SESSION\s+AUTHORIZATION)\b"), "switching roles"),
    (re.compile(r"RESET\s+(ROLE|SESSION\s+AUTHORIZATION)\b"), "switching roles"),
    (re.compile(r"COPY\b"), "COPY (server files, programs and the COPY protocol)"),
    (re.compile(r"ALTER\s+SYSTEM\b"), "ALTER SYSTEM"),
    (re.compile(r"(LISTEN|UNLISTEN|NOTIFY)\b"), "LISTEN/NOTIFY"),
    (re.compile(r"LOAD\b"), "LOAD (shared libraries)"),
    (re.compile(r"(CREATE|ALTER|DROP)\s+EXTENSION\b"), "managing extensions"),
    (re.compile(r"(CREATE|ALTER|DROP)\s+(ROLE|USER|GROUP)\b"), "managing roles"),
    (re.compile(r"(CREATE|ALTER|DROP)\s+(DATABASE|TABLESPACE|SUBSCRIPTION|PUBLICATION|SERVER"
                r"|FOREIGN\s+DATA\s+WRAPPER|USER\s+MAPPING|EVENT\s+TRIGGER)\b"),
     "managing databases, tablespaces, replication and foreign servers"),
    (re.compile(r"(REASSIGN|DROP)\s+OWNED\b"), "REASSIGN/DROP OWNED"),
    (re.compile(r"PREPARE\s+TRANSACTION\b"), "two-phase commit"),
    (re.compile(r"(COMMIT|ROLLBACK)\s+PREPARED\b"), "two-phase commit"),
    (re.compile(r"(DISCARD|CHECKPOINT|VACUUM|SECURITY\s+LABEL)\b"),
     "DISCARD, CHECKPOINT, VACUUM and SECURITY LABEL"),
    (re.compile(r"CLOSE\s+ALL\b"), "CLOSE ALL (close cursors by name)"),
]
_DENIED_ANYWHERE = re.compile(
    r"\b(pg_read_file|pg_read_binary_file|pg_ls_\w*dir|pg_stat_file|pg_file_\w+|lo_import|lo_export"
    r"|pg_terminate_backend|pg_cancel_backend|pg_signal_backend|pg_reload_conf|pg_rotate_logfile"
    r"|pg_promote|set_config|dblink\w*|standard_conforming_strings|sqlrl_sp|sqlrl_c)\b", re.I)
_HEAD_SKIP = re.compile(r"[\s(]+")


def denial(statement: str) -> str | None:
    code, top_level_semicolon = scan(statement)
    if top_level_semicolon:
        return ("the statement holds a ';' that PostgreSQL would read as a second statement; "
                "send statements separated by plain ';'")
    head = _HEAD_SKIP.sub(" ", code[:400]).strip().upper()
    for pattern, what in _DENIED_HEADS:
        if pattern.match(head):
            return f"{what} is not allowed in a session"
    m = _DENIED_ANYWHERE.search(code)
    if m:
        return f"{m.group(1)} is not allowed in a session"
    return None


_STREAMABLE = re.compile(r"(SELECT|VALUES|TABLE|WITH)\b")
_NOT_STREAMABLE = re.compile(r"\b(INSERT|UPDATE|DELETE|MERGE|INTO)\b", re.I)


def _streamable(code: str) -> bool:
    """A plain query that DECLARE … CURSOR FOR accepts (no data-modifying WITH, no SELECT INTO,
    no FOR UPDATE): its rows are streamed."""
    head = code.lstrip(" \t\r\n(").upper()
    return bool(_STREAMABLE.match(head)) and not _NOT_STREAMABLE.search(code)


# --- results ---------------------------------------------------------------------------------------

class _StreamedCursor:
    """The rows of a server-side cursor, fetched in batches on demand (DB-API subset)."""

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
        while len(out) < size and not self._done:
            if time.monotonic() > self._deadline:
                self._state.failed = True
                raise StatementError("canceling statement due to statement timeout "
                                     "(while fetching rows)", "57014")
            self._adapter._execute(self._conn, self._state, self._cur,
                                   f"FETCH FORWARD {self._conn.batch_rows} FROM {_CURSOR}", 0)
            self._rows, self._pos = self._cur.fetchall(), 0
            self._done = len(self._rows) < self._conn.batch_rows
            more = self._rows[:size - len(out)]
            self._pos = len(more)
            out.extend(more)
        return out

    def close(self) -> None:
        self._cur.close()


_OPEN = (_ext.TRANSACTION_STATUS_INTRANS, _ext.TRANSACTION_STATUS_INERROR)
_LINE_RE = re.compile(r"\bLINE (\d+):")
_OWN_TEXT = re.compile(rf"DECLARE {_CURSOR} NO SCROLL CURSOR FOR|\s*;FETCH FORWARD \d+ FROM {_CURSOR}")


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
        conn.batch_rows = min(limits.max_rows + 1, FETCH_BATCH_ROWS)
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

    def run(self, conn: Any, state: Any, statement: str, deadline: float) -> Any:
        cur = conn.cursor()
        try:
            prefix = self._prelude(conn, state, cur)
            code, _ = scan(statement)
            if _streamable(code):
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

    def denied(self, statement: str) -> str | None:
        return denial(statement)
