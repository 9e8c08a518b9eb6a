"""The registry of engine adapters and the sandbox rules shared by all engines. The Protocol every
adapter implements, and its optional capabilities, are declared in ``contract.py``.

An adapter owns everything engine-specific: how to connect (applying the statement timeout and
refusing privileged roles), how a session's workspace is isolated (``begin``/``end``), how one
statement runs (``run``), and how driver exceptions map onto ``ErrorKind``. Everything else —
splitting, the sandbox's common rules, row caps, normalisation, timing — is the single executor's
(``sqlrl.db.sessions.executor``) and identical for every engine.

Adapters register themselves by name with ``@register_dialect``, which checks the class against
the contract (``contract.check_adapter``: a missing method is an error naming it, here, not an
``AttributeError`` mid-rollout); ``get_dialect`` also checks the engine's storage layout against
its adapter and admin (``contract.check_engine``) before the first session, and imports an
adapter's module (named by the engine's descriptor, ``descriptor.py`` / ``engines.py``) only when
first asked for, so optional drivers (pyodbc, oracledb) are needed only by users of those engines.

Server-clone adapters take each session's connection from a ``contract.CloneSource`` that the
provisioning layer registers here (``use_clone_source``): dependency inversion, so nothing in
``sqlrl.db.dialects`` imports ``sqlrl.db.provisioning``.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable

from sqlalchemy.engine import URL

from ..statements import Statement, as_statement
from ..types import SessionError
from .contract import CloneSource, DialectAdapter, check_clone_source, check_engine, contract_of
from .descriptor import Dialect, dialect_of, find, names

__all__ = ["DialectAdapter", "available_dialects", "clone_source", "close_quietly",
           "common_denial", "error_message", "get_dialect", "register_dialect", "url_flag",
           "url_option", "use_clone_source"]


_REGISTRY: dict[str, type] = {}
# One adapter per descriptor (``Dialect`` compares by identity): a descriptor unregistered or
# replaced (``descriptor.registered`` in tests) is a new key, so a stale adapter is never reused.
_INSTANCES: dict[Dialect, DialectAdapter] = {}
_CLONES: list[CloneSource] = []  # the clone source of server-clone engines (at most one)


class _FromDescriptor:
    """A class attribute read from the engine's descriptor (``Dialect.<field>``) when used, so
    the adapter module holds no copy of it."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return getattr(dialect_of((owner or type(obj)).name), self.field)


def register_dialect(name: str) -> Callable[[type], type]:
    """Class decorator: the adapter of the engine ``name``; its ``name`` and ``sqlglot_dialect``
    come from the engine's descriptor (``engines.py``). Raises ``AdapterContractError`` naming
    what the class lacks (``contract.py``)."""
    def deco(cls: type) -> type:
        contract_of(cls)
        cls.name = name  # type: ignore[attr-defined]
        cls.sqlglot_dialect = _FromDescriptor("sqlglot")  # type: ignore[attr-defined]
        _REGISTRY[name] = cls
        for engine in [e for e in _INSTANCES if e.name == name]:  # a class registered anew
            del _INSTANCES[engine]
        return cls
    return deco


def available_dialects() -> tuple[str, ...]:
    return names()


def get_dialect(name: str) -> DialectAdapter:
    """The (shared, stateless) adapter of the dialect named (or aliased) ``name``: its
    descriptor's ``adapter`` module is imported on first use and registers the class."""
    descriptor = find(name)
    if descriptor is None:
        raise SessionError(f"unknown dialect {name!r}; known: {', '.join(names())}")
    adapter = _INSTANCES.get(descriptor)
    if adapter is not None:
        return adapter
    try:
        importlib.import_module(descriptor.adapter)
    except ImportError as exc:
        raise SessionError(f"the {descriptor.name} adapter needs a driver that is not installed: "
                           f"{exc}") from exc
    cls = _REGISTRY.get(descriptor.name)
    if cls is None:
        raise SessionError(f"the module {descriptor.adapter} registers no adapter named "
                           f"{descriptor.name!r} (@register_dialect)")
    try:
        check_engine(descriptor, cls)
    except ImportError as exc:
        raise SessionError(f"the {descriptor.name} admin needs a driver that is not installed: "
                           f"{exc}") from exc
    adapter = cls()
    _INSTANCES[descriptor] = adapter
    return adapter


def use_clone_source(source: CloneSource) -> None:
    """Make ``source`` where server-clone adapters take their sessions' connections from
    (``sqlrl.db.provisioning.scratch`` registers ``SCRATCH`` when imported; ``sqlrl.db``'s
    sessions import it). Checked against ``contract.CloneSource``; replaces an earlier one."""
    check_clone_source(source)
    _CLONES[:] = [source]


def clone_source() -> CloneSource:
    """The registered clone source; ``SessionError`` when none is (provisioning not imported)."""
    if not _CLONES:
        raise SessionError("no clone source for server-clone sessions: import "
                           "sqlrl.db.provisioning.scratch (sqlrl.db's sessions do), which "
                           "registers its scratch manager")
    return _CLONES[0]


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
