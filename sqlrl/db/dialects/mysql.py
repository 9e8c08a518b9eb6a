"""MariaDB / MySQL adapter: every session works in its own database, as its own account.

Isolation ("scratch-database"): ``connect`` takes a prepared clone of the URL's base from
``sqlrl.db.provisioning.scratch`` — a database cloned by the admin and an account ``<name>@'%'`` made for this
session alone, holding privileges on that database only (``mysql_admin``: what the server
enforces). DDL commits implicitly on these engines; here it has nothing to escape into. The
session's TEMPORARY tables, user variables, prepared statements and locks die with its
connection, its database and account are dropped when it closes (``end`` says the connection is
not reusable; ``close`` gives it back to ``scratch``). No agent account has any privilege on the
base, on another session's database, or any global privilege (no PROCESS: it sees and may kill
only its own connections).

Timeout: MariaDB ``max_statement_time`` (seconds) or MySQL ``max_execution_time`` (ms, SELECT
only), ``lock_wait_timeout`` and ``innodb_lock_wait_timeout``. A stopped write returns only once
InnoDB has undone it, which can take longer than the write ran: on MariaDB every INSERT, REPLACE,
UPDATE, DELETE and EXECUTE runs as ``SET STATEMENT max_statement_time=<WRITE_SHARE of the time
left> FOR …`` (sqlrl's prefix, after the sandbox; the lexer reads the kind as the server does), so
the undo fits in the rest of the call; pymysql's ``read_timeout`` is a
backstop ``READ_TIMEOUT_MARGIN_S`` above the limit (it drops the connection: ``session-lost``);
the executor's watchdog sends ``KILL QUERY`` from the admin connection (registered from the
session URL) whatever the session SET. Recursion limits (MariaDB ``max_recursive_iterations``,
MySQL ``cte_max_recursion_depth``) are lifted so that, as on the other engines, only the timeout
stops a runaway recursive CTE. A statement the timer stopped is always a ``timeout`` error:
MariaDB ends ``DO SLEEP(n)`` and ``BENCHMARK(…)`` stopped that way as a success, so a statement
that ran to its deadline is checked against the session's ``Max_statement_time_exceeded`` status
counter (one extra round trip, only then). sql_mode is MySQL 8's default (incl.
ONLY_FULL_GROUP_BY) on both engines.

Results are read unbuffered (``SSCursor``), so the row cap also bounds client memory.

No read-only attestation (``QueryResult.read_only`` is None): MariaDB's session status counters
(``Com_*`` other than ``Com_select``, ``Handler_write/update/delete``) do tell a read from a
write, but reading them is a statement on the session, which resets what the agent's next
statement sees (``ROW_COUNT()``, ``FOUND_ROWS()``, the warning list); a second connection cannot
read another session's counters without performance_schema. So nothing is attested here.

Sandbox (friendly errors; the wall is the server): no TLS on loopback; the client never enables
multi-statements or LOCAL INFILE. The agent connection refuses accounts with global privileges,
role grants, GRANT OPTION, or write privileges outside the scratch pattern (a check on what
``scratch`` created). Statements are split and read by ``mysql_lex`` (the server's lexer rules:
``--`` + control character, ``#``, executable comments as code, backslash escapes), whose
``denial`` refuses USE, PREPARE/EXECUTE/DEALLOCATE, LOAD DATA/XML, INTO OUTFILE/DUMPFILE,
LOAD_FILE, any text naming the ``sqlrl_s_`` prefix, SET GLOBAL/PERSIST/PASSWORD/ROLE/STATEMENT/
NAMES, sql_mode changes, KILL, FLUSH, LOCK/UNLOCK, SHUTDOWN, GRANT/REVOKE, user/role/database/
routine/trigger/event DDL, HANDLER, plugins, XA, replication commands, compound statements
(IF/WHILE/LOOP/…, labels) and the process list.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors
from sqlalchemy.engine import URL

from ..statements import Statement
from ..types import ErrorKind, Limits, SessionError
from .base import clone_source, error_message, register_dialect
from .mysql_admin import grant_target
from .mysql_connect import connect_kwargs
from .mysql_fetch import Result as _Result, abandon_unbuffered, kill_query, register_admin_url
from .mysql_fetch import stopped_by_timeout as _stopped_by_timeout
from .mysql_lex import DEFAULT, Flavor, denial, lex, server_flavor, split

__all__ = ["MySQLDialect", "denial", "privilege_problem"]
READ_TIMEOUT_MARGIN_S = 5.0
# MariaDB: a write gets this share of the time left to its call as its own max_statement_time;
# InnoDB's undo of a stopped UPDATE/DELETE took 1-2.5x the time the statement had run (measured
# on 320,000 rows of 1 KB, issue 46; up to 5x on a machine at load 36), so a quarter leaves the
# undo the rest of the call in most cases (a call that still ends late says so: executor).
WRITE_SHARE = 1 / 4
WRITE_KINDS = frozenset({"INSERT", "REPLACE", "UPDATE", "DELETE", "EXECUTE"})
SQL_MODE = ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
            "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION")

_SYNTAX_CODES = {1064, 1065, 1149}
_PERMISSION_CODES = {1044, 1045, 1095, 1142, 1143, 1148, 1211, 1227, 1290, 1370, 1410, 1698}
_TIMEOUT_CODES = {1969, 3024, 1317, 1205, 3572}
_LOST_CODES = {0, 1053, 1927, 2003, 2006, 2013, 2055}


class _Connection(pymysql.connections.Connection):
    """A pymysql connection that knows its server flavour and session settings."""

    mariadb: bool = True
    flavor: Flavor = DEFAULT  # what the statement lexer needs to know about the server
    connect_kw: dict = {}  # how it was opened (the watchdog's KILL QUERY connection uses it)
    limits_sql: str = ""  # SET SESSION … applied at connect
    max_bytes: int = 0  # the session's byte cap: a batch stops being read past it (mysql_fetch)
    timeouts_seen: int = 0  # the session's Max_statement_time_exceeded when last read

    @property
    def alive(self) -> bool:
        return self._sock is not None


@dataclass
class _Scratch:
    name: str  # the session's database (shown to the model as the base's name)
    base: str


class StatementError(Exception):
    """A driver error with its message cleaned (the scratch database shown as the base's name);
    ``args`` stay ``(code, message)`` as pymysql's."""

    def __init__(self, code: int | None, message: str, kind: ErrorKind) -> None:
        super().__init__(code, message)
        self.kind = kind

    def __str__(self) -> str:
        code, message = self.args
        return f"ERROR {code}: {message}" if code else message


# --- privileges ----------------------------------------------------------------------------------

_GRANT_RE = re.compile(r"^GRANT (.+?) ON (.+?) TO (\S+)")


def privilege_problem(grant_lines: list[str], database: str) -> str | None:
    """Why an account with these SHOW GRANTS lines is unfit for agent SQL in ``database`` (its
    scratch database), or None: anything beyond USAGE, and privileges on that one database."""
    own = grant_target(database)
    for line in grant_lines:
        m = _GRANT_RE.match(line)
        if m is None:
            if line.upper().startswith("GRANT "):
                return f"it has a role granted ({line})"
            continue
        privileges, target, _ = m.groups()
        if re.search(r"WITH (GRANT|ADMIN) OPTION", line, re.I):
            return f"it holds WITH GRANT OPTION ({line[:120]})"
        names = {p.strip().upper() for p in re.sub(r"\([^)]*\)", "", privileges).split(",")}
        if target == "*.*":
            if names - {"USAGE"}:
                return f"it has global privileges ({', '.join(sorted(names))} ON *.*)"
        elif target.lower() != f"{own}.*".lower():
            return f"it has privileges outside its own database ({', '.join(sorted(names))} " \
                   f"ON {target})"
    return None


# --- the adapter -----------------------------------------------------------------------------------

@register_dialect("mysql")
class MySQLDialect:
    isolation = "scratch-database"

    def connect(self, url: URL, limits: Limits) -> Any:
        """An agent connection on a fresh clone of ``url``'s database (``url``: an admin URL of the
        base, ``provision.session_url``)."""
        if not url.database:
            raise SessionError("a MariaDB/MySQL session URL must name its base database")
        if "allow_superuser" in url.query:
            raise SessionError("?allow_superuser is not supported: the agent's SQL always runs as "
                               "an account made for its session; give the admin URL of the base")
        register_admin_url(url)  # the watchdog's KILL QUERY runs as the admin
        return clone_source().take(url, limits, self)

    def open_agent(self, url: URL, limits: Limits) -> Any:
        """Log in as a session's own account (``scratch`` calls this when preparing a clone)."""
        kw = connect_kwargs(url, url.database)
        kw["read_timeout"] = kw["write_timeout"] = limits.timeout_s + READ_TIMEOUT_MARGIN_S
        try:
            conn = _Connection(**kw)
            conn.connect_kw = kw
        except pymysql.Error as exc:
            raise SessionError(f"cannot connect to MariaDB/MySQL at {kw['host']}:{kw['port']}: "
                               f"{error_message(exc)}") from exc
        try:
            conn.mariadb = "mariadb" in conn.get_server_info().lower()
            conn.flavor = server_flavor(conn.get_server_info())
            with conn.cursor() as cur:
                cur.execute("SHOW GRANTS")
                lines = [row[0] for row in cur.fetchall()]
                problem = privilege_problem(lines, url.database)
                if problem:
                    raise SessionError(f"refusing to run agent SQL as {url.username!r}: {problem}")
                conn.limits_sql = self._limits_sql(conn, limits)
                conn.max_bytes = limits.max_bytes
                cur.execute(conn.limits_sql)
        except BaseException as exc:
            _close(conn)
            if isinstance(exc, pymysql.Error):
                raise SessionError(f"cannot set up a MariaDB/MySQL session: {error_message(exc)}") from exc
            raise
        return conn

    @staticmethod
    def _limits_sql(conn: _Connection, limits: Limits) -> str:
        """Session settings. ``sql_select_limit`` makes the server stop a top-level SELECT without
        its own LIMIT one row past the row cap, so a truncated result ends at once instead of the
        unbuffered rest being drained until the timeout."""
        timeout_s = limits.timeout_s
        lock = max(1, math.ceil(timeout_s))
        if conn.mariadb:
            limit = f"max_statement_time={timeout_s:.3f}, max_recursive_iterations=4294967295"
        else:
            limit = (f"max_execution_time={max(1, round(timeout_s * 1000))}, "
                     "cte_max_recursion_depth=4294967295")
        return (f"SET SESSION sql_mode='{SQL_MODE}', {limit}, lock_wait_timeout={lock}, "
                f"innodb_lock_wait_timeout={lock}, sql_select_limit={limits.max_rows + 1}")

    def ping(self, conn: Any) -> bool:
        try:
            conn.ping(reconnect=False)
            return True
        except Exception:
            return False

    def close(self, conn: Any) -> None:
        """Give the connection back: ``scratch`` closes it and drops its database and account."""
        clone_source().give_back(conn)

    def close_agent(self, conn: Any) -> None:
        _close(conn)

    # -- workspace -----------------------------------------------------------------------------

    def begin(self, conn: Any, url: URL) -> Any:
        """Nothing to do: the connection's database is the session's own."""
        return _Scratch(conn.db.decode() if isinstance(conn.db, bytes) else conn.db, url.database)

    def end(self, conn: Any, state: Any) -> bool:
        """Never reusable: the database and account are dropped with the connection."""
        return False

    # -- statements ----------------------------------------------------------------------------

    def canceller(self, conn: Any) -> Any:
        """What the watchdog calls to stop this connection's statement: ``KILL QUERY``."""
        return lambda: kill_query(conn)

    def abandon(self, conn: Any, cursor: Any) -> None:
        """The executor wants no more rows (a cap or the deadline): stop the statement instead of
        draining the unbuffered rest (a query with its own huge LIMIT)."""
        abandon_unbuffered(conn, getattr(cursor, "_cur", cursor))

    def run(self, conn: Any, state: Any, statement: str, deadline: float) -> Any:
        cur = conn.cursor(pymysql.cursors.SSCursor)
        text = statement
        if conn.mariadb and lex(statement, conn.flavor).kind in WRITE_KINDS:
            # InnoDB undoes a stopped write before the statement returns: stop it early enough
            # that the undo fits in the rest of the call (module doc, "Timeout")
            budget = max(0.001, (deadline - time.monotonic()) * WRITE_SHARE)
            text = f"SET STATEMENT max_statement_time={budget:.3f} FOR {statement}"

        def clean(exc: BaseException) -> StatementError:
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
            message = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
            if state is not None:
                message = re.sub(re.escape(state.name), state.base, message, flags=re.I)
            return StatementError(code, message or type(exc).__name__, self.classify(exc))

        def finished() -> None:
            if _stopped_by_timeout(conn, deadline):
                raise StatementError(1969, "Query execution was interrupted (the statement "
                                     "exceeded the session's time limit)", ErrorKind.TIMEOUT)

        try:
            cur.execute(text)
            if cur.description is None:  # nothing to fetch: the statement has ended
                finished()
        except (pymysql.Error, StatementError) as exc:
            if isinstance(exc, pymysql.Error):
                _stopped_by_timeout(conn, deadline)  # keep the timeout counter in step
            try:
                cur.close()
            except Exception:
                pass
            raise (exc if isinstance(exc, StatementError) else clean(exc)) from exc
        return _Result(cur, clean, finished, conn.max_bytes)

    def classify(self, exc: BaseException) -> ErrorKind:
        kind = getattr(exc, "kind", None)
        if isinstance(kind, ErrorKind):
            return kind
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        if code in _TIMEOUT_CODES:
            return ErrorKind.TIMEOUT
        if code in _LOST_CODES or isinstance(exc, (pymysql.err.InterfaceError, OSError)):
            return ErrorKind.SESSION_LOST
        if isinstance(exc, pymysql.err.InternalError) and code is None:
            return ErrorKind.SESSION_LOST  # packet sequence broken: pymysql closed the socket
        if code in _SYNTAX_CODES:
            return ErrorKind.SYNTAX
        if code in _PERMISSION_CODES:
            return ErrorKind.PERMISSION
        return ErrorKind.RUNTIME

    def lex(self, conn: Any, sql: str) -> list[Statement]:
        """``sql``'s statements as this connection's server reads them (``mysql_lex``)."""
        return split(sql, getattr(conn, "flavor", DEFAULT))

    def denied(self, statement: Statement | str) -> str | None:
        return denial(statement)


def _close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        conn._force_close()
