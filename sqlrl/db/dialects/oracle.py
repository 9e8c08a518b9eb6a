"""Oracle adapter (python-oracledb, thin mode). UNVERIFIED: built against the real driver and its
error classes, but never run against an Oracle server (none can run on the CI machines); see
docs/unverified_dialects.md.

URL (SQLAlchemy's rules): ``oracle://user:pw@host:1521/?service_name=FREEPDB1`` (a service name),
``oracle://user:pw@host:1521/ORCL`` (the database part is a SID), or ``oracle://user:pw@alias``
(a TNS alias or Easy Connect string in the host part). ``oracle+oracledb://`` works the same.
``?connect_timeout=N`` is the TCP connect timeout; ``?allow_superuser=1`` lets DBA accounts through.

Isolation ("transaction"): one transaction per session (oracledb never autocommits by default).
``SAVEPOINT sqlrl_sp`` before each statement (Oracle keeps only the newest savepoint of a name) and
``ROLLBACK TO SAVEPOINT sqlrl_sp`` after a failed one, so earlier effects survive; ``end`` rolls
back. Oracle commits implicitly before and after every DDL statement, which would make the
session's changes permanent, so the sandbox allows only DML and queries, plus private temporary
tables (18c+): ``CREATE PRIVATE TEMPORARY TABLE ora$ptt_x (...)`` with the default
``ON COMMIT DROP DEFINITION`` (their creation does not commit; ``ON COMMIT PRESERVE DEFINITION``
is refused because Oracle documents an implicit commit for it) and ``DROP TABLE ora$ptt_x``.
Scratch schemas per session would need a privileged account to create and drop users, so they
are not used. The rules (``oracle_denial``) live in ``oracle_sandbox.py``, imported here.

Timeout: ``Connection.call_timeout`` (milliseconds, set from the statement's deadline before each
statement). Thin mode turns an expired round trip into a break sent to the server (ORA-01013 on the
server side), reads the reset and raises DPY-4024; the connection stays usable and the statement is
rolled back by Oracle's statement-level atomicity. Lock waits are bounded the same way.

Rows: CLOB/NCLOB are fetched as ``str`` and BLOB as ``bytes`` (an output type handler), so no LOB
locator reaches the executor's normaliser.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

import oracledb
from sqlalchemy.engine import URL

from ..types import ErrorKind, Limits, SessionError
from ..url import redact
from .base import close_quietly, error_message, register_dialect, url_flag, url_option
from .glot_lex import ORACLE
from .oracle_sandbox import (  # noqa: F401  (the rules' names, importable from here as before)
    _DDL_REASON, ALLOWED_PACKAGES, DDL, DENIED_NAMES, DML, PTT_PREFIX, oracle_denial)
from .transaction import SAVEPOINT, SessionLost, TransactionDialect, refuse_privileged, setup_failed

DEFAULT_CONNECT_TIMEOUT_S = 10.0
_ARRAYSIZE = 256
_URL_KEYS = {"service_name", "sid", "mode", "allow_superuser", "connect_timeout", "protocol",
             "config_dir", "wallet_location", "wallet_password"}
PRIVILEGED_ROLES = {"DBA", "PDB_DBA", "SYSDBA", "SYSOPER", "IMP_FULL_DATABASE", "EXP_FULL_DATABASE",
                    "DATAPUMP_IMP_FULL_DATABASE", "DATAPUMP_EXP_FULL_DATABASE", "RECOVERY_CATALOG_OWNER"}
PRIVILEGED_PRIVILEGES = {
    "SYSDBA", "SYSOPER", "SYSBACKUP", "SYSDG", "SYSKM", "ALTER SYSTEM", "ALTER DATABASE",
    "GRANT ANY PRIVILEGE", "GRANT ANY ROLE", "GRANT ANY OBJECT PRIVILEGE", "BECOME USER",
    "CREATE ANY DIRECTORY", "EXECUTE ANY PROCEDURE", "CREATE USER", "ALTER USER", "DROP USER",
    "DROP ANY TABLE", "CREATE ANY PROCEDURE", "ALTER ANY PROCEDURE", "CREATE ANY JOB",
}
PRIVILEGED_USERS = {"SYS", "SYSTEM", "SYSBACKUP", "SYSDG", "SYSKM", "SYSRAC"}


@dataclass
class _State:
    lost: bool = False


# --- URL -> connect parameters (pure) ------------------------------------------------------------





def connect_params(url: URL) -> dict[str, Any]:
    """Keyword arguments for ``oracledb.connect`` from an ``oracle://`` URL (SQLAlchemy's rules:
    the database part is a SID, ``?service_name=`` a service name, neither: the host is a TNS
    alias or Easy Connect string)."""
    unknown = sorted(set(url.query) - _URL_KEYS)
    if unknown:
        raise SessionError(f"unknown Oracle URL option(s) {', '.join(unknown)}; "
                           f"known: {', '.join(sorted(_URL_KEYS))}")
    service_name, sid = url_option(url, "service_name"), url_option(url, "sid") or url.database
    if service_name and sid:
        raise SessionError("an Oracle URL names either a service (?service_name=) or a SID "
                           "(the database part or ?sid=), not both")
    if not url.host:
        raise SessionError(f"the Oracle URL has no host: {redact(url)}")
    params: dict[str, Any] = {}
    if url.username is not None:
        params["user"] = url.username
    if url.password is not None:
        params["password"] = url.password
    if service_name or sid:
        params["host"] = url.host
        params["port"] = int(url.port or 1521)
        if service_name:
            params["service_name"] = service_name
        else:
            params["sid"] = sid
    else:
        params["dsn"] = url.host if url.port is None else f"{url.host}:{url.port}"
    params["tcp_connect_timeout"] = float(url_option(url, "connect_timeout") or DEFAULT_CONNECT_TIMEOUT_S)
    for key in ("protocol", "config_dir", "wallet_location", "wallet_password"):
        if url_option(url, key):
            params[key] = url_option(url, key)
    mode = (url_option(url, "mode") or "").strip().upper()
    if mode and mode not in ("DEFAULT", "AUTH_MODE_DEFAULT"):
        if not url_flag(url, "allow_superuser"):
            raise SessionError(f"refusing to connect with mode={mode.lower()} (an administrative "
                               "privilege): use an unprivileged user, or add ?allow_superuser=1")
        name = mode if mode.startswith("AUTH_MODE_") else f"AUTH_MODE_{mode}"
        if not hasattr(oracledb, name):
            raise SessionError(f"unknown Oracle connection mode {mode.lower()!r}")
        params["mode"] = getattr(oracledb, name)
    return params


def call_timeout_ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def privileged_reasons(user: str, is_dba: str | None, roles: list[str], privileges: list[str]) -> list[str]:
    """Why an account is too privileged to run model-written SQL (empty: it is fine)."""
    reasons = []
    if (user or "").upper() in PRIVILEGED_USERS:
        reasons.append(f"user {user}")
    if (is_dba or "").upper() == "TRUE":
        reasons.append("connected AS SYSDBA")
    reasons += [f"role {r}" for r in roles if r.upper() in PRIVILEGED_ROLES]
    reasons += [f"privilege {p}" for p in privileges if p.upper() in PRIVILEGED_PRIVILEGES]
    return reasons


def output_type_handler(cursor: Any, metadata: Any) -> Any:
    """Fetch CLOB/NCLOB as str and BLOB as bytes (LOB locators would need more round trips and
    cannot be normalised)."""
    if metadata.type_code in (oracledb.DB_TYPE_CLOB, oracledb.DB_TYPE_NCLOB):
        return cursor.var(oracledb.DB_TYPE_LONG, arraysize=cursor.arraysize)
    if metadata.type_code is oracledb.DB_TYPE_BLOB:
        return cursor.var(oracledb.DB_TYPE_LONG_RAW, arraysize=cursor.arraysize)
    return None


class OracleError(Exception):
    """An oracledb error re-raised without the "Help: <url>" lines the driver appends; ``args[0]``
    is still oracledb's error object (code, full_code, is_session_dead), so classification is
    unchanged."""

    def __str__(self) -> str:
        arg = self.args[0] if self.args else ""
        text = getattr(arg, "message", None) or str(arg)
        return "\n".join(line for line in str(text).splitlines() if not line.startswith("Help: "))


def readable(exc: BaseException) -> BaseException:
    """``exc`` as an ``OracleError`` when it is an oracledb error (others unchanged)."""
    if isinstance(exc, oracledb.Error) and exc.args:
        wrapped = OracleError(*exc.args)
        wrapped.__cause__ = exc
        return wrapped
    return exc


class _Rows:
    """The executor's view of an oracledb cursor: errors raised while fetching become readable."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor
        self.description = cursor.description
        self.rowcount = cursor.rowcount

    def fetchmany(self, size: int) -> list[Any]:
        try:
            return self._cursor.fetchmany(size)
        except Exception as exc:
            raise readable(exc) from exc

    def close(self) -> None:
        self._cursor.close()


# --- error classification ------------------------------------------------------------------------

# ORA-00900..00999 are parse errors; these among them are about names and types, not syntax.
NOT_SYNTAX_900 = {904, 909, 913, 918, 932, 934, 935, 937, 938, 939, 942, 947, 955, 957, 960, 979, 980,
                  990, 997, 998}
SYNTAX_CODES = {1740, 1756, 1747, 2000, 6550}
PERMISSION_CODES = {990, 1031, 1045, 1720, 1749, 1924, 1950, 16000, 24247, 28031, 29024}
TIMEOUT_CODES = {40, 54, 1013, 2393, 2395, 4021, 30006}
LOST_CODES = {22, 28, 31, 45, 378, 600, 602, 603, 1012, 1041, 1086, 1089, 1092, 2396, 3113, 3114,
              3122, 3135, 12153, 12537, 12547, 12570, 12583, 27146, 28511, 56600}
SYNTAX_DPY = {"DPY-2041", "DPY-2042"}  # missing ending single / double quote (found by the driver)
TIMEOUT_DPY = {"DPY-4024"}  # call timeout exceeded
LOST_DPY = {"DPY-1001", "DPY-4011", "DPY-6005", "DPY-6000"}  # not connected / closed / cannot connect


def oracle_error_info(exc: BaseException) -> tuple[int, str, bool]:
    """(ORA code or 0, full code such as "ORA-00942" or "DPY-4024", session dead) of an error."""
    arg = exc.args[0] if getattr(exc, "args", None) else None
    code = getattr(arg, "code", 0) or 0
    full = getattr(arg, "full_code", "") or ""
    if not full:
        m = re.match(r"\s*((?:ORA|DPY|DPI)-\d+)", str(exc))
        full = m.group(1) if m else ""
        if full.startswith("ORA-") and not code:
            code = int(full[4:])
    return int(code), full, bool(getattr(arg, "is_session_dead", False))


def classify_oracle(exc: BaseException) -> ErrorKind:
    if isinstance(exc, SessionLost):
        return ErrorKind.SESSION_LOST
    code, full, dead = oracle_error_info(exc)
    if dead or full in LOST_DPY or code in LOST_CODES:
        return ErrorKind.SESSION_LOST
    if full in TIMEOUT_DPY or code in TIMEOUT_CODES:
        return ErrorKind.TIMEOUT
    if code in PERMISSION_CODES:
        return ErrorKind.PERMISSION
    if full in SYNTAX_DPY or code in SYNTAX_CODES or (900 <= code <= 999 and code not in NOT_SYNTAX_900):
        return ErrorKind.SYNTAX
    return ErrorKind.RUNTIME


# --- the adapter ---------------------------------------------------------------------------------

@register_dialect("oracle")
class OracleDialect(TransactionDialect):
    lexer = ORACLE  # sqlglot's Oracle tokenizer (glot_lex.ORACLE)
    denial = staticmethod(oracle_denial)
    classify_error = staticmethod(classify_oracle)

    def connect(self, url: URL, limits: Limits) -> Any:
        params = connect_params(url)
        try:
            conn = oracledb.connect(**params)
        except oracledb.Error as exc:
            raise SessionError(f"cannot connect to {redact(url)}: {error_message(readable(exc))}") from exc
        try:
            conn.autocommit = False
            conn.call_timeout = call_timeout_ms(limits.timeout_s)
            conn.outputtypehandler = output_type_handler
            cur = conn.cursor()
            try:
                user, is_dba = cur.execute(
                    "SELECT USER, SYS_CONTEXT('USERENV', 'ISDBA') FROM dual").fetchone()
                roles = [r for (r,) in cur.execute("SELECT role FROM session_roles").fetchall()]
                privs = [p for (p,) in cur.execute("SELECT privilege FROM session_privs").fetchall()]
            finally:
                cur.close()
        except Exception as exc:
            raise setup_failed(conn, url, exc, readable) from exc
        reasons = privileged_reasons(user, is_dba, roles, privs)
        if reasons:
            refuse_privileged(conn, url, f"a privileged Oracle account ({', '.join(reasons[:5])})",
                              "user")
        return conn

    def begin(self, conn: Any, url: URL) -> Any:
        conn.rollback()
        return _State()

    def end(self, conn: Any, state: Any) -> bool:
        conn.rollback()
        # private temporary tables ON COMMIT DROP DEFINITION end with the transaction; drop any
        # that are left (DDL on them does not commit, and there is nothing left to commit anyway)
        cur = conn.cursor()
        try:
            try:
                leftover = [t for (t,) in cur.execute(
                    "SELECT table_name FROM user_private_temp_tables").fetchall()]
            except oracledb.DatabaseError as exc:
                return oracle_error_info(exc)[0] == 942 and not state.lost  # before 18c: no PTTs
            for table in leftover:
                cur.execute(f'DROP TABLE "{table}"')
        finally:
            cur.close()
        return not state.lost

    def run(self, conn: Any, state: Any, statement: str, deadline: float) -> Any:
        if state.lost:
            raise SessionLost("the session's transaction ended earlier; its state is gone")
        conn.call_timeout = call_timeout_ms(deadline - time.monotonic())
        cur = conn.cursor()
        cur.arraysize = _ARRAYSIZE
        cur.prefetchrows = _ARRAYSIZE + 1
        try:
            cur.execute(f"SAVEPOINT {SAVEPOINT}")
        except Exception as exc:
            close_quietly(cur)
            if classify_oracle(exc) is ErrorKind.SESSION_LOST:
                state.lost = True
            raise readable(exc) from exc
        try:
            cur.execute(statement)
        except Exception as exc:
            close_quietly(cur)
            raise self._recover(conn, state, readable(exc)) from exc
        return _Rows(cur)

    def _recover(self, conn: Any, state: Any, exc: BaseException) -> BaseException:
        if classify_oracle(exc) is ErrorKind.SESSION_LOST:
            state.lost = True
            return exc
        try:
            cur = conn.cursor()
            try:
                cur.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
            finally:
                cur.close()
        except Exception as exc2:  # ORA-01086: the savepoint (so the transaction) is gone
            state.lost = True
            return SessionLost(f"{error_message(exc)}; then the session's transaction could not be "
                               f"rolled back to its savepoint: {error_message(readable(exc2))}")
        return exc

    def ping(self, conn: Any) -> bool:
        try:
            conn.ping()
            return True
        except Exception:
            return False
