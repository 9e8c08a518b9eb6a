"""SQL Server adapter (pyodbc). UNVERIFIED: built against the real driver and its error classes, but
never run against a SQL Server (none can run on the CI machines); see docs/unverified_dialects.md.

URL: ``mssql+pyodbc://user:pw@host:1433/db?driver=FreeTDS`` (or ``driver=ODBC Driver 18 for
SQL Server``; other query keys such as ``TrustServerCertificate=yes`` or ``TDS_Version=7.4`` go into
the ODBC connection string unchanged; ``odbc_connect=<whole connection string>`` is accepted too).
``?allow_superuser=1`` lets a sysadmin login through; ``?connect_timeout=N`` is the login timeout.

Isolation ("transaction"): one explicit transaction per session. The ODBC connection is in
autocommit mode so that the driver never starts or ends transactions itself (FreeTDS implements
manual-commit mode with transaction-manager requests and restarts a transaction after every
``SQLEndTran``; Microsoft's drivers differ), and the adapter drives the transaction in T-SQL:

- ``begin``: ``BEGIN TRANSACTION`` (``@@TRANCOUNT`` is then exactly 1).
- before every statement, one guard batch: ``IF XACT_STATE() = 1 AND @@TRANCOUNT = 1 SAVE
  TRANSACTION sqlrl_sp ELSE RAISERROR(...)``. If the server ended or doomed the transaction
  (deadlock victim, an error that rolls the transaction back), the guard fails, the session is
  marked lost and no later statement can run outside the transaction in autocommit mode.
- after a failed statement: ``SELECT @@TRANCOUNT, XACT_STATE()``; when the transaction is intact,
  ``ROLLBACK TRANSACTION sqlrl_sp`` undoes only that statement and earlier effects survive; when
  it is gone (``@@TRANCOUNT = 0``) or uncommittable (``XACT_STATE() = -1``) the statement's result
  is ``session-lost``.
- ``end``: ``IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION``. A connection is reused only if the session
  changed no SET option and declared no cursor (those outlive a rollback).

Connection setup: ``SET IMPLICIT_TRANSACTIONS OFF``, ``SET XACT_ABORT OFF`` (an error then rolls
back only its statement), ``SET LOCK_TIMEOUT <timeout ms>`` and ``SET TEXTSIZE`` (64 MiB per
returned value).

Timeout: pyodbc ``Connection.timeout`` (ODBC ``SQL_ATTR_QUERY_TIMEOUT``, whole seconds, rounded
up) is set from the statement's deadline before each statement; on expiry the driver sends a TDS
attention, so the server stops the work, and raises SQLSTATE HYT00. ``LOCK_TIMEOUT`` turns lock
waits into error 1222. Both are ``ErrorKind.TIMEOUT``; the transaction survives (statement-level
rollback), so the session stays usable.

Sandbox (``denied``): T-SQL runs several statements in one batch without semicolons, so the rules
look at every token of the batch, not only the first word: the tokens sqlglot's T-SQL tokenizer
gives the statement the call was split into (``glot_lex.TSQL``: strings and nested comments
dropped, the text after command words such as PRINT read again). See ``mssql_denial``.
The rules live in ``mssql_sandbox.py`` (their names are imported here).

Errors are re-raised as ``MSSQLError`` (readable text, pyodbc's ``(sqlstate, message)`` args kept)
and classified by SQLSTATE and native error number (``classify_mssql``).
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import struct
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pyodbc
from sqlalchemy.engine import URL

from ..types import ErrorKind, Limits, SessionError
from ..url import redact
from .base import close_quietly, error_message, register_dialect, url_option
from .glot_lex import TSQL
from .mssql_sandbox import (  # noqa: F401  (the rules' names, importable from here as before)
    ALLOWED_SET_OPTIONS, CATALOG_PROCEDURES, DENIED_PROCEDURES, DENIED_SET_OPTIONS, DENIED_WORDS,
    SERVER_OBJECTS, STATEMENT_KEYWORDS, _procedure_at, mssql_denial)
from .transaction import SAVEPOINT, SessionLost, TransactionDialect, refuse_privileged, setup_failed
MAX_VALUE_BYTES = 64 * 1024 * 1024  # SET TEXTSIZE: the largest (max)/text value returned
DEFAULT_LOGIN_TIMEOUT_S = 10
SQL_SS_TIMESTAMPOFFSET = -155  # DATETIMEOFFSET, which pyodbc cannot read without a converter
GUARD_MESSAGE = "sqlrl: the session transaction is no longer active"
_GUARD = (f"IF XACT_STATE() = 1 AND @@TRANCOUNT = 1 SAVE TRANSACTION {SAVEPOINT} "
          f"ELSE RAISERROR('{GUARD_MESSAGE}', 16, 1)")
_PREFERRED_DRIVERS = ("ODBC Driver 18 for SQL Server", "ODBC Driver 17 for SQL Server", "FreeTDS")
_SQLRL_KEYS = {"driver", "odbc_connect", "allow_superuser", "connect_timeout"}
_ODBC_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_ ]*$")


@dataclass
class _State:
    lost: bool = False  # the transaction ended behind our back; every later call is session-lost
    dirty: bool = False  # SET options or cursors that outlive ROLLBACK: do not reuse the connection


# --- URL -> ODBC connection string (pure) --------------------------------------------------------





def _odbc_value(value: str, always_brace: bool = False) -> str:
    if always_brace or re.search(r"[;{}=\s]", value) or value != value.strip():
        return "{" + value.replace("}", "}}") + "}"
    return value


def is_freetds(driver: str) -> bool:
    return "freetds" in driver.lower() or "libtdsodbc" in driver.lower()


def odbc_connection_string(url: URL, installed_drivers: Sequence[str] = ()) -> str:
    """The ODBC connection string for a ``mssql+pyodbc://`` URL.

    The driver comes from ``?driver=``; without it the first installed of ODBC Driver 18, 17 and
    FreeTDS. FreeTDS takes ``SERVER=host;PORT=port`` and ``ClientCharset=UTF-8``, Microsoft's drivers
    ``SERVER=host,port``. Query keys other than sqlrl's own are passed through as ODBC keywords.
    """
    whole = url_option(url, "odbc_connect")
    if whole:
        return whole
    driver = url_option(url, "driver")
    if not driver:
        driver = next((d for d in _PREFERRED_DRIVERS if d in installed_drivers), None)
        if driver is None:
            raise SessionError(
                "no SQL Server ODBC driver: install FreeTDS (apt-get install tdsodbc) or Microsoft's "
                "ODBC Driver 18, or name one with ?driver=")
    if not url.host:
        raise SessionError(f"the SQL Server URL has no host: {redact(url)}")
    freetds = is_freetds(driver)
    parts = [f"DRIVER={_odbc_value(driver, always_brace=True)}"]
    if freetds:
        parts.append(f"SERVER={_odbc_value(url.host)}")
        parts.append(f"PORT={int(url.port or 1433)}")
    else:
        parts.append(f"SERVER={_odbc_value(url.host + (f',{int(url.port)}' if url.port else ''))}")
    if url.database:
        parts.append(f"DATABASE={_odbc_value(url.database)}")
    if url.username:
        parts.append(f"UID={_odbc_value(url.username, always_brace=True)}")
        parts.append(f"PWD={_odbc_value(url.password or '', always_brace=True)}")
    extra = {k: url_option(url, k) for k in url.query if k not in _SQLRL_KEYS}
    if freetds and not any(k.lower() == "clientcharset" for k in extra):
        parts.append("ClientCharset=UTF-8")
    if not any(k.lower() in ("app", "application name") for k in extra):
        parts.append("APP=sqlrl")
    for key, value in extra.items():
        if not _ODBC_KEY.match(key):
            raise SessionError(f"not an ODBC connection keyword: {key!r}")
        parts.append(f"{key}={_odbc_value(value or '')}")
    return ";".join(parts)


def query_timeout_seconds(seconds: float) -> int:
    """ODBC's query timeout is whole seconds (0 means none): round up, at least 1."""
    return max(1, math.ceil(round(seconds, 3)))


def lock_timeout_ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def datetimeoffset_to_text(value: bytes | None) -> str | None:
    """Output converter for DATETIMEOFFSET (SQL_SS_TIMESTAMPOFFSET_STRUCT, 20 bytes)."""
    if value is None:
        return None
    if len(value) != 20:  # a driver that sends text instead of the struct
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + value.hex()
    year, month, day, hour, minute, second, nanos, tz_h, tz_m = struct.unpack("<6hI2h", value)
    text = _dt.datetime(year, month, day, hour, minute, second, nanos // 1000).isoformat(sep=" ")
    sign = "-" if tz_h < 0 or tz_m < 0 else "+"
    return f"{text}{sign}{abs(tz_h):02d}:{abs(tz_m):02d}"


# --- error classification ------------------------------------------------------------------------

_SQLSTATE = re.compile(r"^[0-9A-Z]{5}$")
_NATIVE = re.compile(r"\((-?\d+)\)")
SYNTAX_ERRORS = {102, 103, 105, 111, 137, 153, 155, 156, 170, 319, 1018, 1038, 4145, 8180}
PERMISSION_ERRORS = {229, 230, 262, 297, 300, 916, 1088, 3906, 15247, 27212}
TIMEOUT_ERRORS = {1222}  # lock request time out period exceeded
LOST_ERRORS = {596, 628, 3902, 3903, 3930, 3998, 6005, 6006}  # the transaction or session ended
LOST_SQLSTATES = {"08S01", "08001", "08003", "08004", "08007", "01002"}


def sqlstate_and_natives(exc: BaseException) -> tuple[str | None, tuple[int, ...], str]:
    """(SQLSTATE, native error numbers, message) of a pyodbc error.

    pyodbc builds driver errors as ``Error(sqlstate, "[sqlstate] message (native) (function)")`` and
    its own errors as ``Error(message, sqlstate)`` or ``Error(message)``.
    """
    args = [a for a in getattr(exc, "args", ()) if isinstance(a, str)]
    state = next((a for a in args if _SQLSTATE.match(a)), None)
    message = " ".join(a for a in args if a is not state) or str(exc)
    return state, tuple(int(n) for n in _NATIVE.findall(message)), message


class MSSQLError(Exception):
    """A pyodbc error re-raised with a readable message: ``str`` drops pyodbc's tuple form and the
    driver tags (``Invalid object name 'x'. (error 208, SQLSTATE 42S02)``); ``args`` keep pyodbc's
    ``(sqlstate, message)`` so classification is unchanged."""

    def __str__(self) -> str:
        state, natives, message = sqlstate_and_natives(self)
        text = re.sub(r"^\[[0-9A-Z]{5}\]\s*", "", message)
        text = re.sub(r"^(\[[^\]]*\])+\s*", "", text)  # [FreeTDS][SQL Server] / [Microsoft]...
        text = re.sub(r"\s*\(SQL\w+\)\s*$", "", text)  # (SQLExecDirectW)
        text = re.sub(r"\s*\(-?\d+\)\s*$", "", text)  # (208)
        detail = ", ".join(([f"error {natives[0]}"] if natives and natives[0] else [])
                           + ([f"SQLSTATE {state}"] if state else []))
        return f"{text} ({detail})" if detail else text


def readable(exc: BaseException) -> BaseException:
    """``exc`` as an ``MSSQLError`` when it is a pyodbc error (others unchanged)."""
    if isinstance(exc, pyodbc.Error) and not isinstance(exc, MSSQLError):
        state, _, message = sqlstate_and_natives(exc)
        wrapped = MSSQLError(state or "HY000", message)
        wrapped.__cause__ = exc
        return wrapped
    return exc


def classify_mssql(exc: BaseException) -> ErrorKind:
    if isinstance(exc, SessionLost):
        return ErrorKind.SESSION_LOST
    state, natives, message = sqlstate_and_natives(exc)
    low = message.lower()
    if (state in LOST_SQLSTATES or any(n in LOST_ERRORS for n in natives) or GUARD_MESSAGE in message
            or "closed connection" in low or "connection has been closed" in low
            or "communication link failure" in low or "write to the server failed" in low
            or "read from the server failed" in low):
        return ErrorKind.SESSION_LOST
    if state in ("HYT00", "HYT01") or any(n in TIMEOUT_ERRORS for n in natives):
        return ErrorKind.TIMEOUT
    if any(n in PERMISSION_ERRORS for n in natives) or "permission was denied" in low:
        return ErrorKind.PERMISSION
    if any(n in SYNTAX_ERRORS for n in natives) or (state == "42000" and "syntax" in low):
        return ErrorKind.SYNTAX
    return ErrorKind.RUNTIME


# --- what outlives ROLLBACK (the sandbox rules are in mssql_sandbox.py) --------------------------

def _marks_dirty(statement: str) -> bool:
    """Statements whose effects outlive ROLLBACK on the connection (SET options, cursors)."""
    words = [text for kind, text in TSQL.tokens(statement) if kind == "WORD"]
    return words[:1] == ["SET"] or "CURSOR" in words


# --- results -------------------------------------------------------------------------------------

class _Results:
    """The executor's view of one T-SQL batch: the first result set with columns (or, for a batch
    without any, the last row count). When its rows are exhausted the rest of the batch is run, so
    an error in a later statement of the batch is reported; when the caller stops early (row or
    byte cap) the rest of the batch is cancelled."""

    def __init__(self, cursor: Any, rowcount: int, recover: Callable[[BaseException], BaseException]) -> None:
        self._cursor = cursor
        self._recover = recover
        self._done = cursor.description is None
        self.description = cursor.description
        self.rowcount = rowcount

    def fetchmany(self, size: int) -> list[tuple[Any, ...]]:
        try:
            rows = self._cursor.fetchmany(size)
            if len(rows) < size and not self._done:
                while self._cursor.nextset():
                    pass
                self._done = True
        except Exception as exc:
            self._done = True
            close_quietly(self._cursor)  # free the connection (no MARS) before recovering
            raise self._recover(readable(exc)) from exc
        return [tuple(r) for r in rows]  # pyodbc.Row -> tuple

    def close(self) -> None:
        if not self._done:
            try:
                self._cursor.cancel()
            except Exception:
                pass
        close_quietly(self._cursor)


# --- the adapter ---------------------------------------------------------------------------------

@register_dialect("mssql")
class MSSQLDialect(TransactionDialect):
    lexer = TSQL  # sqlglot's T-SQL tokenizer (glot_lex.TSQL)
    denial = staticmethod(mssql_denial)
    classify_error = staticmethod(classify_mssql)

    def connect(self, url: URL, limits: Limits) -> Any:
        connstr = odbc_connection_string(url, pyodbc.drivers() if not url_option(url, "driver") else ())
        login_timeout = int(float(url_option(url, "connect_timeout") or DEFAULT_LOGIN_TIMEOUT_S))
        try:
            conn = pyodbc.connect(connstr, autocommit=True, timeout=login_timeout)
        except pyodbc.Error as exc:
            raise SessionError(f"cannot connect to {redact(url)}: {error_message(readable(exc))}") from exc
        try:
            conn.timeout = query_timeout_seconds(limits.timeout_s)
            conn.add_output_converter(SQL_SS_TIMESTAMPOFFSET, datetimeoffset_to_text)
            cur = conn.cursor()
            try:
                cur.execute("SET IMPLICIT_TRANSACTIONS OFF; SET XACT_ABORT OFF; "
                            f"SET LOCK_TIMEOUT {lock_timeout_ms(limits.timeout_s)}; "
                            f"SET TEXTSIZE {MAX_VALUE_BYTES}")
                sysadmin, control_server = cur.execute(
                    "SELECT IS_SRVROLEMEMBER('sysadmin'), "
                    "HAS_PERMS_BY_NAME(NULL, NULL, 'CONTROL SERVER')").fetchone()
            finally:
                cur.close()
        except Exception as exc:
            raise setup_failed(conn, url, exc, readable) from exc
        if sysadmin == 1 or control_server == 1:
            refuse_privileged(conn, url, "a sysadmin (or CONTROL SERVER) login", "login")
        return conn

    def begin(self, conn: Any, url: URL) -> Any:
        cur = conn.cursor()
        try:
            cur.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION; BEGIN TRANSACTION")
        finally:
            cur.close()
        return _State()

    def end(self, conn: Any, state: Any) -> bool:
        cur = conn.cursor()
        try:
            cur.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION")
            trancount = cur.execute("SELECT @@TRANCOUNT").fetchone()[0]
        finally:
            cur.close()
        return trancount == 0 and not state.lost and not state.dirty

    def run(self, conn: Any, state: Any, statement: str, deadline: float) -> Any:
        if state.lost:
            raise SessionLost("the session's transaction ended earlier; its state is gone")
        conn.timeout = query_timeout_seconds(deadline - time.monotonic())
        cur = conn.cursor()
        try:
            cur.execute(_GUARD)
        except Exception as exc:
            state.lost = True
            close_quietly(cur)
            raise SessionLost(f"the session's transaction is no longer active; its state is gone "
                              f"({error_message(readable(exc))})") from exc
        if _marks_dirty(statement):
            state.dirty = True
        try:
            cur.execute(statement)
            affected = cur.rowcount
            while cur.description is None:
                if cur.rowcount is not None and cur.rowcount >= 0:
                    affected = cur.rowcount
                if not cur.nextset():
                    break
        except Exception as exc:
            close_quietly(cur)
            raise self._recover(conn, state, readable(exc)) from exc
        return _Results(cur, affected, lambda e: self._recover(conn, state, e))

    def _recover(self, conn: Any, state: Any, exc: BaseException) -> BaseException:
        """After a failed statement: undo it (rollback to the savepoint) when the transaction is
        intact, otherwise mark the session lost. Returns the exception to raise."""
        if isinstance(exc, SessionLost) or classify_mssql(exc) is ErrorKind.SESSION_LOST:
            state.lost = True
            return exc
        try:
            cur = conn.cursor()
            try:
                trancount, xact_state = cur.execute("SELECT @@TRANCOUNT, XACT_STATE()").fetchone()
                if trancount == 1 and xact_state == 1:
                    cur.execute(f"ROLLBACK TRANSACTION {SAVEPOINT}")
                    return exc
            finally:
                cur.close()
        except Exception as exc2:
            state.lost = True
            return SessionLost(f"{error_message(exc)}; then the connection failed: "
                               f"{error_message(readable(exc2))}")
        state.lost = True
        return SessionLost(
            f"{error_message(exc)} -- the server ended the session's transaction (@@TRANCOUNT="
            f"{trancount}, XACT_STATE()={xact_state}), so every earlier effect of this session is gone")

    def ping(self, conn: Any) -> bool:
        try:
            cur = conn.cursor()
            try:
                return cur.execute("SELECT 1").fetchone()[0] == 1
            finally:
                cur.close()
        except Exception:
            return False
