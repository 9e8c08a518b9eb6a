"""The one Protocol every database engine implements, the registry that names them, and the
sandbox rules shared by all engines.

An adapter owns everything engine-specific: how to connect (applying the statement timeout and
refusing privileged roles), how a session's workspace is isolated (``begin``/``end``), how one
statement runs (``run``), and how driver exceptions map onto ``ErrorKind``. Everything else —
splitting, the sandbox's common rules, row caps, normalisation, timing — is the single executor's
(``sqlrl.db.executor``) and identical for every engine.

Adapters register themselves by name with ``@register_dialect``; ``get_dialect`` imports an
adapter's module (named by the engine's descriptor, ``descriptor.py`` / ``engines.py``) only when
first asked for, so optional drivers (pyodbc, oracledb) are needed only by users of those engines.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Protocol, runtime_checkable

from sqlalchemy.engine import URL

from ..statements import Statement, as_statement
from ..types import ErrorKind, Limits, SessionError
from .descriptor import dialect_of, find, names


@runtime_checkable
class DialectAdapter(Protocol):
    name: str  # registry key (set by ``@register_dialect``)
    sqlglot_dialect: str  # sqlglot's name for the engine (set from its descriptor)
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


_REGISTRY: dict[str, type] = {}
_INSTANCES: dict[str, DialectAdapter] = {}


class _FromDescriptor:
    """A class attribute read from the engine's descriptor (``Dialect.<field>``) when used, so
    the adapter module holds no copy of it."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return getattr(dialect_of((owner or type(obj)).name), self.field)


def register_dialect(name: str) -> Callable[[type], type]:
    """Class decorator: the adapter of the engine ``name``; its ``name`` and ``sqlglot_dialect``
    come from the engine's descriptor (``engines.py``)."""
    def deco(cls: type) -> type:
        cls.name = name  # type: ignore[attr-defined]
        cls.sqlglot_dialect = _FromDescriptor("sqlglot")  # type: ignore[attr-defined]
        _REGISTRY[name] = cls
        return cls
    return deco


def available_dialects() -> tuple[str, ...]:
    return names()


def get_dialect(name: str) -> DialectAdapter:
    """The (shared, stateless) adapter of the dialect named (or aliased) ``name``: its
    descriptor's ``adapter`` module is imported on first use and registers the class."""
    if name in _INSTANCES:
        return _INSTANCES[name]
    descriptor = find(name)
    if descriptor is None:
        raise SessionError(f"unknown dialect {name!r}; known: {', '.join(names())}")
    try:
        importlib.import_module(descriptor.adapter)
    except ImportError as exc:
        raise SessionError(f"the {descriptor.name} adapter needs a driver that is not installed: "
                           f"{exc}") from exc
    adapter = _REGISTRY[descriptor.name]()
    _INSTANCES[name] = adapter
    return adapter


def forget_adapter(name: str) -> None:
    """Drop the cached adapter instance of ``name`` (``descriptor.unregister`` calls it; the
    class stays registered, as its module stays imported)."""
    for key in [k for k, a in _INSTANCES.items() if k == name or getattr(a, "name", None) == name]:
        del _INSTANCES[key]


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
