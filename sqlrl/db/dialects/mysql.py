"""MariaDB / MySQL adapter: every session works in a private scratch database cloned from the base.

Isolation ("scratch-database"): DDL commits implicitly on these engines, so a transaction cannot
isolate CREATE/ALTER/DROP. ``begin`` creates ``sqlrl_s_<account>_<connection id>_<random>``,
clones every base table (``CREATE TABLE … LIKE`` + ``INSERT … SELECT``, foreign-key checks off)
and view (``SHOW CREATE VIEW`` rewritten to the scratch database, DEFINER dropped), then ``USE``s
it. The agent role may write only there (``sqlrl.db.provision``: SELECT/SHOW VIEW on the base,
DDL/DML only on ``sqlrl\\_s\\_%``). ``end`` drops the scratch database, then ``COM_RESET_CONNECTION``
drops TEMPORARY tables and user variables, releases named locks and resets session variables (the
limits are re-applied); the connection is reusable when all of that succeeded. Scratch databases of
connections that died (a killed session never reaches ``end``) are dropped by the next new
connection of the same account (connection ids are checked against the account's process list).

Timeout: MariaDB ``max_statement_time`` (seconds) or MySQL ``max_execution_time`` (ms, SELECT
only), ``lock_wait_timeout`` and ``innodb_lock_wait_timeout``; pymysql's ``read_timeout`` is a
backstop ``READ_TIMEOUT_MARGIN_S`` above the limit (it drops the connection: ``session-lost``).
Recursion limits (MariaDB ``max_recursive_iterations``, MySQL ``cte_max_recursion_depth``) are
lifted so that, as on the other engines, only the timeout stops a runaway recursive CTE. A
statement the timer stopped is always a ``timeout`` error: MariaDB ends ``DO SLEEP(n)`` and
``BENCHMARK(…)`` stopped that way as a success, so a statement that ran to its deadline is checked
against the session's ``Max_statement_time_exceeded`` status counter (one extra round trip, only
then). sql_mode is MySQL 8's default (incl. ONLY_FULL_GROUP_BY) on both engines.

Results are read unbuffered (``SSCursor``), so the row cap also bounds client memory.

Sandbox: no TLS on loopback; the client never enables multi-statements or LOCAL INFILE. Sessions
refuse accounts with global privileges, role grants, GRANT OPTION, or write privileges outside the
scratch pattern (unless ``?allow_superuser=1``, unsafe). Statements are split and read by
``mysql_lex`` (the server's lexer rules: ``--`` + control character, ``#``, executable comments
as code, backslash escapes), whose ``denial`` refuses USE, PREPARE/EXECUTE/
DEALLOCATE, LOAD DATA/XML, INTO OUTFILE/DUMPFILE, LOAD_FILE, any text naming the ``sqlrl_s_``
prefix, SET GLOBAL/PERSIST/PASSWORD/ROLE/STATEMENT/NAMES, sql_mode changes, KILL, FLUSH, LOCK/UNLOCK,
SHUTDOWN, GRANT/REVOKE, user/role/database/routine/trigger/event DDL, HANDLER, plugins, XA,
replication commands, compound statements (IF/WHILE/LOOP/…, labels) and the process list.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors
from sqlalchemy.engine import URL

from ..statements import Statement
from ..types import ErrorKind, Limits, SessionError
from .base import error_message, register_dialect, url_flag
from .mysql_fetch import Result as _Result, abandon_unbuffered, kill_query
from .mysql_fetch import stopped_by_timeout as _stopped_by_timeout
from .mysql_lex import DEFAULT, SCRATCH_PREFIX, Flavor, denial, server_flavor, split

__all__ = ["MySQLDialect", "SCRATCH_PREFIX", "denial", "privilege_problem", "connect_kwargs"]
READ_TIMEOUT_MARGIN_S = 5.0
CLONE_TIMEOUT_S = 300.0  # statement limit while begin() clones the base
CONNECT_TIMEOUT_S = 10
SQL_MODE = ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
            "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION")
_COM_RESET_CONNECTION = 0x1F
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_PASSTHROUGH_QUERY = {"unix_socket", "ssl_ca", "ssl_cert", "ssl_key", "charset"}
_SCRATCH_TARGET = "`sqlrl\\_s\\_%`.*"

_SYNTAX_CODES = {1064, 1065, 1149}
_PERMISSION_CODES = {1044, 1045, 1095, 1142, 1143, 1148, 1211, 1227, 1290, 1370, 1410, 1698}
_TIMEOUT_CODES = {1969, 3024, 1317, 1205, 3572}
_LOST_CODES = {0, 1053, 1927, 2003, 2006, 2013, 2055}
_GENERATED_COLUMN_CODES = {1906, 3105}
_MISSING_TABLE = 1146


class _Connection(pymysql.connections.Connection):
    """A pymysql connection that knows its server flavour, account and session settings."""

    mariadb: bool = True
    flavor: Flavor = DEFAULT  # what the statement lexer needs to know about the server
    account_tag: str = ""
    connect_kw: dict = {}  # how it was opened (the watchdog's KILL QUERY connection uses it)
    limits_sql: str = ""  # SET SESSION … applied at connect and after every reset
    fresh: bool = True  # no session has begun on it yet
    timeouts_seen: int = 0  # the session's Max_statement_time_exceeded when last read

    def reset_session(self) -> None:
        """COM_RESET_CONNECTION: TEMPORARY tables, user variables, prepared statements, named
        locks and session variables go back to a fresh connection's state."""
        self._execute_command(_COM_RESET_CONNECTION, b"")
        self._read_ok_packet()

    @property
    def alive(self) -> bool:
        return self._sock is not None


@dataclass
class _Scratch:
    name: str
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


def connect_kwargs(url: URL, database: str | None) -> dict[str, Any]:
    """pymysql.connect keywords for ``url`` (shared with sqlrl.db.provision)."""
    kw: dict[str, Any] = {
        "host": url.host or "127.0.0.1", "port": url.port or 3306, "user": url.username,
        "password": url.password or "", "database": database, "charset": "utf8mb4",
        "autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S, "local_infile": False,
        "program_name": "sqlrl",
    }
    query = {k: (v[-1] if isinstance(v, tuple) else v) for k, v in url.query.items()}
    ssl = str(query.get("ssl", "")).lower()
    if ssl in ("0", "false", "no", "off") or (url.host in _LOOPBACK and ssl not in ("1", "true")):
        kw["ssl_disabled"] = True  # loopback: no TLS handshake (~25 ms -> ~0.4 ms per connect)
    kw.update({k: v for k, v in query.items() if k in _PASSTHROUGH_QUERY})
    return kw


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# --- privileges ----------------------------------------------------------------------------------

_GRANT_RE = re.compile(r"^GRANT (.+?) ON (.+?) TO (\S+)")
_ACCOUNT_RE = re.compile(r" TO (`[^`]*`@`[^`]*`|'[^']*'@'[^']*')")


def privilege_problem(grant_lines: list[str]) -> str | None:
    """Why an account with these SHOW GRANTS lines is unfit for agent SQL, or None."""
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
        elif target == _SCRATCH_TARGET:
            continue
        elif names - {"USAGE", "SELECT", "SHOW VIEW"}:
            return (f"it may write outside its scratch databases ({', '.join(sorted(names))} "
                    f"ON {target})")
    return None


# --- the adapter -----------------------------------------------------------------------------------

@register_dialect("mysql")
class MySQLDialect:
    name = "mysql"
    sqlglot_dialect = "mysql"
    isolation = "scratch-database"

    def connect(self, url: URL, limits: Limits) -> Any:
        if not url.database:
            raise SessionError("a MariaDB/MySQL session URL must name its base database")
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
                account = next((m.group(1) for m in map(_ACCOUNT_RE.search, lines[:1]) if m),
                               f"{url.username}@{url.host}")
                conn.account_tag = hashlib.sha1(account.encode()).hexdigest()[:8]
                problem = privilege_problem(lines)
                if problem and not url_flag(url, "allow_superuser"):
                    raise SessionError(
                        f"refusing to run agent SQL as {account}: {problem}. Create an "
                        "unprivileged user with sqlrl.db.provision.ensure_agent_role(admin_url) "
                        "and grant_database(admin_url, db), then use provision.agent_url(admin_url, "
                        "db) (or add ?allow_superuser=1 to the URL — unsafe, only for trusted SQL)")
                conn.limits_sql = self._limits_sql(conn, limits)
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

    def _statement_limit_sql(self, conn: _Connection, timeout_s: float) -> str:
        if conn.mariadb:
            return f"max_statement_time={timeout_s:.3f}"
        return f"max_execution_time={max(1, round(timeout_s * 1000))}"

    def ping(self, conn: Any) -> bool:
        try:
            conn.ping(reconnect=False)
            return True
        except Exception:
            return False

    def close(self, conn: Any) -> None:
        _close(conn)

    # -- workspace -----------------------------------------------------------------------------

    def begin(self, conn: Any, url: URL) -> Any:
        base = url.database
        name = f"{SCRATCH_PREFIX}{conn.account_tag}_{conn.thread_id():x}_{os.urandom(4).hex()}"
        read_timeout = conn._read_timeout
        conn._read_timeout = CLONE_TIMEOUT_S + READ_TIMEOUT_MARGIN_S
        created = False
        try:
            with conn.cursor() as cur:
                cur.execute(f"SET SESSION {self._statement_limit_sql(conn, CLONE_TIMEOUT_S)}, "
                            "foreign_key_checks=0, sql_select_limit=DEFAULT")
                if conn.fresh:
                    conn.fresh = False
                    self._drop_orphans(conn)
                cur.execute(f"SHOW CREATE DATABASE {_q(base)}")
                charset = re.search(r"DEFAULT CHARACTER SET \w+( COLLATE \w+)?", cur.fetchone()[1])
                cur.execute(f"SHOW FULL TABLES FROM {_q(base)}")
                objects = cur.fetchall()
                cur.execute(f"CREATE DATABASE {_q(name)} {charset.group() if charset else ''}")
                created = True
                for table, kind in objects:
                    if kind != "VIEW":
                        self._clone_table(cur, base, name, table)
                conn.select_db(name)
                self._clone_views(cur, base, [t for t, kind in objects if kind == "VIEW"])
                cur.execute(conn.limits_sql + ", foreign_key_checks=1")
        except BaseException:
            if created:
                try:
                    with conn.cursor() as cur:
                        cur.execute(f"DROP DATABASE IF EXISTS {_q(name)}")
                except Exception:
                    pass
            raise
        finally:
            conn._read_timeout = read_timeout
        return _Scratch(name, base)

    @staticmethod
    def _clone_table(cur: Any, base: str, name: str, table: str) -> None:
        src, dst = f"{_q(base)}.{_q(table)}", f"{_q(name)}.{_q(table)}"
        cur.execute(f"CREATE TABLE {dst} LIKE {src}")
        try:
            cur.execute(f"INSERT INTO {dst} SELECT * FROM {src}")
        except pymysql.Error as exc:
            if exc.args[0] not in _GENERATED_COLUMN_CODES:
                raise
            cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                        "AND TABLE_NAME = %s AND COALESCE(GENERATION_EXPRESSION, '') = '' "
                        "ORDER BY ORDINAL_POSITION", (base, table))
            cols = ", ".join(_q(c) for (c,) in cur.fetchall())
            cur.execute(f"INSERT INTO {dst} ({cols}) SELECT {cols} FROM {src}")

    @staticmethod
    def _clone_views(cur: Any, base: str, views: list[str]) -> None:
        """Views in dependency order: a view whose source view is missing waits for a later pass."""
        qualifier = re.compile(re.escape(_q(base)) + r"\.", re.I)
        pending = {}
        for view in views:
            cur.execute(f"SHOW CREATE VIEW {_q(base)}.{_q(view)}")
            ddl = cur.fetchone()[1]
            ddl = re.sub(r"DEFINER=(`[^`]*`|'[^']*'|\S+)@(`[^`]*`|'[^']*'|\S+)\s*", "", ddl, count=1)
            pending[view] = qualifier.sub("", ddl)
        while pending:
            failed: dict[str, str] = {}
            error: Exception | None = None
            for view, ddl in pending.items():
                try:
                    cur.execute(ddl)
                except pymysql.Error as exc:
                    if exc.args[0] != _MISSING_TABLE:
                        raise
                    failed[view], error = ddl, exc
            if len(failed) == len(pending):
                raise error  # type: ignore[misc]
            pending = failed

    def _drop_orphans(self, conn: _Connection) -> None:
        """Drop this account's scratch databases whose connection is gone (sessions that died
        never reached ``end``). Best effort."""
        try:
            with conn.cursor() as cur:
                pattern = f"{SCRATCH_PREFIX}{conn.account_tag}_".replace("_", "\\_") + "%"
                cur.execute("SHOW DATABASES LIKE %s", (pattern,))
                names = [row[0] for row in cur.fetchall()]
                if not names:
                    return
                cur.execute("SELECT ID FROM information_schema.PROCESSLIST")
                alive = {int(row[0]) for row in cur.fetchall()}
                for name in names:
                    parts = name[len(SCRATCH_PREFIX):].split("_")
                    try:
                        owner = int(parts[1], 16)
                    except (IndexError, ValueError):
                        continue
                    if owner not in alive:
                        cur.execute(f"DROP DATABASE IF EXISTS {_q(name)}")
        except pymysql.Error:
            pass

    def end(self, conn: Any, state: Any) -> bool:
        if not conn.alive:
            return False
        try:
            with conn.cursor() as cur:
                if state is not None:
                    prefix = "SET STATEMENT max_statement_time=0 FOR " if conn.mariadb else ""
                    cur.execute(f"{prefix}DROP DATABASE IF EXISTS {_q(state.name)}")
                conn.reset_session()
                conn.timeouts_seen = 0  # session status counters start again
                cur.execute(conn.limits_sql)
            return True
        except pymysql.Error:
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
            cur.execute(statement)
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
        return _Result(cur, clean, finished)

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
