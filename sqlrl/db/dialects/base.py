"""The one Protocol every database engine implements, the registry that names them, and the
sandbox rules shared by all engines.

An adapter owns everything engine-specific: how to connect (applying the statement timeout and
refusing privileged roles), how a session's workspace is isolated (``begin``/``end``), how one
statement runs (``run``), and how driver exceptions map onto ``ErrorKind``. Everything else —
splitting, the sandbox's common rules, row caps, normalisation, timing — is the single executor's
(``sqlrl.db.executor``) and identical for every engine.

Adapters register themselves by name with ``@register_dialect``; ``get_dialect`` imports an
adapter's module only when first asked for, so optional drivers (pyodbc, oracledb) are needed only
by users of those engines.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Protocol, runtime_checkable

from sqlalchemy.engine import URL

from ..statements import Statement, as_statement
from ..types import ErrorKind, Limits, SessionError


@runtime_checkable
class DialectAdapter(Protocol):
    name: str  # registry key: "sqlite", "postgresql", "mysql", "mssql", "oracle"
    sqlglot_dialect: str  # sqlglot's name for the engine (splitting, transpiling)
    isolation: str  # short name of the isolation mechanism (docs/sessions.md)

    def connect(self, url: URL, limits: Limits) -> Any:
        """A DB-API connection with session-wide limits applied. Raises ``SessionError``."""

    def begin(self, conn: Any, url: URL) -> Any:
        """Create a fresh isolated workspace on ``conn``; returns the adapter's state for it."""

    def end(self, conn: Any, state: Any) -> bool:
        """Discard the workspace; True when ``conn`` is clean and may serve another session."""

    def run(self, conn: Any, state: Any, statement: str, deadline: float) -> Any:
        """Execute one statement; returns a DB-API cursor positioned before its first row.
        ``deadline`` (``time.monotonic()``) is informational: the engine enforces the timeout."""

    def ping(self, conn: Any) -> bool: ...

    def classify(self, exc: BaseException) -> ErrorKind: ...

    def denied(self, statement: str) -> str | None:
        """The reason this engine's sandbox rejects ``statement``, or None. An adapter that also
        defines ``lex(conn, sql) -> list[Statement]`` (its own exact lexer: PostgreSQL, MariaDB,
        SQLite) has the call split by it and receives each lexed ``Statement`` here."""

    def close(self, conn: Any) -> None: ...


_MODULES = {
    "sqlite": "sqlrl.db.dialects.sqlite",
    "postgresql": "sqlrl.db.dialects.postgresql",
    "mysql": "sqlrl.db.dialects.mysql",
    "mssql": "sqlrl.db.dialects.mssql",
    "oracle": "sqlrl.db.dialects.oracle",
}
_REGISTRY: dict[str, type] = {}
_INSTANCES: dict[str, DialectAdapter] = {}


def register_dialect(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        _REGISTRY[name] = cls
        return cls
    return deco


def available_dialects() -> tuple[str, ...]:
    return tuple(_MODULES)


def get_dialect(name: str) -> DialectAdapter:
    """The (shared, stateless) adapter registered under ``name``."""
    if name in _INSTANCES:
        return _INSTANCES[name]
    if name not in _MODULES:
        raise SessionError(f"unknown dialect {name!r}; known: {', '.join(_MODULES)}")
    try:
        importlib.import_module(_MODULES[name])
    except ImportError as exc:
        raise SessionError(f"the {name} adapter needs a driver that is not installed: {exc}") from exc
    adapter = _REGISTRY[name]()
    _INSTANCES[name] = adapter
    return adapter


# --- sandbox rules shared by every engine ------------------------------------------------------

_TRANSACTION_CONTROL = {"BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE", "ABORT"}
_LIMIT_SETTINGS = re.compile(
    r"\b(statement_timeout|lock_timeout|idle_in_transaction_session_timeout|transaction_timeout"
    r"|max_statement_time|max_execution_time|autocommit)\b", re.I)


def common_denial(statement: Statement | str) -> str | None:
    """Rules every engine applies before a statement reaches the database. ``statement`` is read
    by its engine's lexer (``sqlrl.db.statements``); a plain text is read by SQLite's rules."""
    s = as_statement(statement)
    words = s.words[:2]
    if s.kind == "TransactionStmt" or (words and words[0] in _TRANSACTION_CONTROL) or words in {
            ("START", "TRANSACTION"), ("SET", "TRANSACTION")}:
        return ("transaction control is not allowed: the session manages its own transaction "
                "(every statement's effects already persist until the session ends)")
    code = s.code or s.text
    lowered = code.lower()
    if ("time" in lowered or "autocommit" in lowered) and _LIMIT_SETTINGS.search(code):
        return "changing the session's limits (timeouts, autocommit) is not allowed"
    return None


def url_option(url: URL, key: str) -> str | None:
    """A query-string option of ``url`` (the last one when repeated)."""
    value = url.query.get(key)
    if isinstance(value, tuple):
        value = value[-1] if value else None
    return value


def url_flag(url: URL, key: str) -> bool:
    """True when ``url``'s query string sets ``key`` to 1/true/yes/on."""
    return (url_option(url, key) or "").strip().lower() in ("1", "true", "yes", "on")


def close_quietly(obj: Any) -> None:
    """Close a connection or cursor, ignoring errors (it may already be dead)."""
    try:
        obj.close()
    except Exception:
        pass


def error_message(exc: BaseException, limit: int = 600) -> str:
    """The driver's message, trimmed to something an observation can show."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
