"""The declared contract of an engine: the session adapter's required Protocol, its optional
capabilities (each a small Protocol of its own), and the server admin's Protocols, checked when
an engine registers.

    @register_dialect("name")          # checks the class: required methods, whole capabilities
    class MyAdapter: ...
    contract_of(adapter).has(Cancellable)   # what the executor asks, never getattr

Guarantees:
- An adapter class registers only when it defines every method of ``DialectAdapter`` and an
  ``isolation`` name, and, for each optional capability, either every method of it or none:
  anything else is an ``AdapterContractError`` at registration naming the class, the capability
  and the missing method(s), never an ``AttributeError`` in the middle of a rollout.
- ``contract_of`` resolves an adapter's capabilities once per class (at registration for the
  registered ones; an unregistered class, such as a test's fake, is checked on first use, with
  the same errors).
- ``check_engine`` holds an engine's storage layout (``descriptor.Storage``) to what its adapter
  and admin implement: a server-clone engine's adapter logs agents in (``AgentLogin``; no other
  engine's adapter does) and its admin class implements ``ServerAdmin`` (and ``BulkLoad`` when the
  loader targets it); and its descriptor to its adapter: a ``lexer`` named exactly when the
  adapter has ``ExactLexer``.
- ``admin_class(engine)`` is the one way to an engine's admin class: imported by the name its
  descriptor gives and checked before it is returned.
- Methods are read off the class statically (``inspect.getattr_static``): no instance is made,
  no descriptor runs, no ``__getattr__`` answers for a method the class does not define.

The contract of each hook (when it is called, what it must return) is in docs/dialects.md.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from sqlalchemy.engine import URL

from ..statements import Statement
from ..types import ErrorKind, Limits
from .descriptor import Dialect

__all__ = ["Abandoning", "AdapterContractError", "AgentLogin", "BatchBound", "BulkLoad", "CAPABILITIES",
           "Cancellable", "CloneHandOver", "CloneSource", "Contract", "DialectAdapter",
           "ExactLexer", "ReadOnlyAttestation", "ServerAdmin", "admin_class", "check_adapter",
           "check_admin",
           "check_clone_source", "check_engine", "contract_of", "hands_over", "methods_of"]


class AdapterContractError(TypeError):
    """An engine's adapter or admin class does not implement what it must (raised at
    registration, naming the class, the capability and the missing methods)."""


@runtime_checkable
class DialectAdapter(Protocol):
    """Required of every engine's adapter."""

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

    def ping(self, conn: Any) -> bool:
        """True when ``conn`` answers (a pooled or prepared connection is checked with it)."""

    def classify(self, exc: BaseException) -> ErrorKind:
        """The ``ErrorKind`` of an exception ``run`` or a fetch raised."""

    def denied(self, statement: Statement | str) -> str | None:
        """The reason this engine's sandbox rejects ``statement``, or None. An adapter with the
        ``ExactLexer`` capability receives each ``Statement`` its ``lex`` made; others the
        statement's text, split by sqlglot's tokenizer for the engine."""

    def close(self, conn: Any) -> None:
        """Close ``conn`` for good (quietly when it is already dead)."""


# --- optional capabilities: all of a capability's methods, or none ----------------------------

class ExactLexer(Protocol):
    """The engine reads SQL text with a lexer of its own (PostgreSQL's pglast, MariaDB's and
    SQLite's rules): the executor splits every call with it, and ``denied`` judges its tokens."""

    def lex(self, conn: Any, sql: str) -> list[Statement]:
        """``sql``'s statements as the server behind ``conn`` reads them; never raises."""


class Cancellable(Protocol):
    """A statement can be stopped from outside the session (the watchdog, at the deadline)."""

    def canceller(self, conn: Any) -> Callable[[], None] | None:
        """A callable, safe to call from another thread, that stops ``conn``'s running
        statement (libpq's cancel, ``KILL QUERY``, DuckDB's interrupt); None: no way now."""


class Abandoning(Protocol):
    """A result whose rest is not wanted (a row/byte cap or the deadline) must be stopped on the
    server rather than drained (an unbuffered MariaDB result)."""

    def abandon(self, conn: Any, cursor: Any) -> None:
        """Stop the server's work on ``cursor``; ``conn`` stays usable. Errors are ignored."""


class BatchBound(Protocol):
    """The engine bounds each row's size but not a fetch's (PostgreSQL's row-size check: one
    ``FETCH n`` arrives whole), so the executor asks one ``fetchmany`` for at most ``batch_rows``
    rows, however narrow the rows seen so far: a result whose rows widen after its first batch
    cannot bring more than ``batch_rows`` x the row bound into the client at once."""

    def batch_rows(self, conn: Any) -> int:
        """The most rows one ``fetchmany`` on ``conn`` may ask for (at least 1)."""


class ReadOnlyAttestation(Protocol):
    """The engine attests, statement by statement, whether a statement only read
    (``QueryResult.read_only``; asked only when ``Limits.attest`` is on)."""

    def observe(self, conn: Any, state: Any) -> None:
        """Called before a statement that will be attested runs (SQLite resets its authorizer
        so the statement is compiled afresh under it). Must not change what runs."""

    def read_only(self, conn: Any, state: Any, cursor: Any) -> bool | None:
        """After the statement ran: True (it only read), False (it wrote), None (cannot tell).
        An exception counts as None."""


class AgentLogin(Protocol):
    """Server-clone engines: the scratch manager logs the session's own role in on a clone it
    made (``sqlrl.db.provisioning.scratch``), and closes that login when it drops the clone."""

    def open_agent(self, url: URL, limits: Limits) -> Any:
        """Log in as the session's role on its clone (``url``), limits applied; refuses a
        privileged role (``SessionError``)."""

    def close_agent(self, conn: Any) -> None:
        """Close an agent login for good (its clone is dropped next)."""


class CloneSource(Protocol):
    """Where a server-clone engine's adapter takes a session's connection from: its own clone of
    the base and its own login role (``sqlrl.db.provisioning.scratch.SCRATCH``, registered with
    ``base.use_clone_source`` when that module is imported). The adapter sits below provisioning
    and never imports it: provisioning hands itself down through this Protocol."""

    def take(self, url: URL, limits: Limits, adapter: Any) -> Any:
        """An agent connection, logged in by ``adapter`` (``AgentLogin.open_agent``), on a fresh
        clone of the base ``url`` names (an admin URL). Raises ``SessionError``."""

    def give_back(self, conn: Any) -> bool:
        """Close ``conn`` and drop its clone and role; False when ``conn`` was not taken here."""


# --- the server admin (``Dialect.admin``) ------------------------------------------------------

# Every per-session scratch database and its role/user is named ``SCRATCH_PREFIX`` + random hex
# (``sqlrl.db.provisioning.scratch``); bases may not use it, and MariaDB's sandbox refuses SQL
# naming it.
SCRATCH_PREFIX = "sqlrl_s_"

class ServerAdmin(Protocol):
    """Admin operations of a server-clone engine (``sqlrl.db.provisioning.provision``, ``sqlrl.db.provisioning.scratch``,
    ``sqlrl.db.provisioning.admin``). ``url`` is an admin URL; ``conn`` an admin connection."""

    def connect(self, url: URL, database: str | None = None) -> Any:
        """An admin connection (autocommit) to ``database`` or the server's default one."""

    def prepare_server(self, url: URL) -> None:
        """Check the admin account and the server's settings; create what every base needs."""

    def create_database(self, url: URL, name: str, replace: bool) -> None:
        """Create the base ``name`` (dropping an old one first when ``replace``)."""

    def seal(self, url: URL, name: str) -> None:
        """After loading: no agent account can reach the base ``name``."""

    def drop_database(self, url: URL, name: str) -> None:
        """Drop the base ``name`` if it exists."""

    def base_size(self, conn: Any, base: str) -> int:
        """The base's size in bytes (chooses the cloning strategy)."""

    def hold(self, conn: Any, name: str) -> bool:
        """Take the liveness lock named after scratch database ``name``; False when taken."""

    def unhold(self, conn: Any, name: str) -> None:
        """Release the liveness lock of ``name``."""

    def create_scratch(self, conn: Any, base: str, name: str, password: str,
                       base_bytes: int) -> None:
        """Clone ``base`` into ``name`` and create its login role ``name`` (with ``password``),
        with rights on that clone only."""

    def drop_scratch(self, conn: Any, name: str) -> None:
        """Drop the scratch database and the role ``name`` (if they exist)."""

    def scratch_names(self, conn: Any, prefix: str) -> list[str]:
        """Every scratch database and role on the server whose name starts with ``prefix``."""

    def is_lost(self, conn: Any) -> bool:
        """True when the admin connection ``conn`` is gone."""


class CloneHandOver(Protocol):
    """Optional for a ``ServerAdmin``: a clone is finished on the session's own login. Its
    ``create_scratch`` may leave the role a temporary privilege (PostgreSQL: membership in the
    owner role, so that the login can take ownership of its clone without a second connection);
    ``scratch`` then calls ``hand_over`` with that login before anything else uses it."""

    def hand_over(self, conn: Any, agent: Any, name: str) -> None:
        """Finish clone ``name`` on ``agent`` (the session's login, from ``open_agent``), take
        back on ``conn`` (an admin connection) every temporary privilege ``create_scratch`` gave
        the role, and verify on ``agent`` that none is left; ``SessionError`` otherwise (the
        clone is then dropped, never handed out)."""


def hands_over(admin: Any) -> bool:
    """Whether the admin object (or class) ``admin`` implements ``CloneHandOver`` (whole)."""
    cls = admin if isinstance(admin, type) else type(admin)
    return not _missing(cls, CloneHandOver)


class BulkLoad(Protocol):
    """The loader's target (``Dialect.load``, ``sqlrl.db.provisioning.loader``)."""

    def load_connection(self, url: URL, database: str) -> Any:
        """A connection to ``database`` inside one transaction."""

    def insert_rows(self, conn: Any, table: str, columns: list[str],
                    rows: list[tuple[Any, ...]]) -> None:
        """INSERT ``rows`` into ``table`` (names already quoted)."""


def methods_of(protocol: type) -> tuple[str, ...]:
    """The methods a Protocol declares (its own, in declaration order)."""
    return tuple(n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v))


CAPABILITIES: tuple[type, ...] = (ExactLexer, Cancellable, Abandoning, BatchBound,
                                  ReadOnlyAttestation, AgentLogin)


@dataclass(frozen=True)
class Contract:
    """What one adapter class implements: the optional capabilities, all checked whole."""

    adapter: type
    capabilities: frozenset[type]

    def has(self, capability: type) -> bool:
        return capability in self.capabilities


def _missing(cls: type, protocol: type) -> list[str]:
    return [m for m in methods_of(protocol) if not callable(inspect.getattr_static(cls, m, None))]


def _label(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def check_adapter(cls: type) -> Contract:
    """``cls``'s contract; ``AdapterContractError`` naming what is missing."""
    missing = _missing(cls, DialectAdapter)
    if missing:
        raise AdapterContractError(f"dialect adapter {_label(cls)} lacks required method(s) "
                                   f"{', '.join(missing)} (DialectAdapter, docs/dialects.md)")
    if not isinstance(inspect.getattr_static(cls, "isolation", None), str):
        raise AdapterContractError(f"dialect adapter {_label(cls)} must name its isolation "
                                   "mechanism: a class attribute isolation = '...'")
    found = set()
    for capability in CAPABILITIES:
        missing = _missing(cls, capability)
        if not missing:
            found.add(capability)
        elif len(missing) < len(methods_of(capability)):
            raise AdapterContractError(
                f"dialect adapter {_label(cls)} implements half of the capability "
                f"{capability.__name__}: it lacks {', '.join(missing)} (define all of "
                f"{', '.join(methods_of(capability))}, or none)")
    return Contract(cls, frozenset(found))


_CONTRACTS: dict[type, Contract] = {}


def contract_of(adapter: Any) -> Contract:
    """The contract of ``adapter`` (an instance or a class), checked once per class."""
    cls = adapter if isinstance(adapter, type) else type(adapter)
    contract = _CONTRACTS.get(cls)
    if contract is None:
        contract = _CONTRACTS[cls] = check_adapter(cls)
    return contract


def check_admin(cls: type, *, load: bool) -> None:
    """An admin class implements ``ServerAdmin`` (and ``BulkLoad`` when ``load``)."""
    for protocol in (ServerAdmin, BulkLoad) if load else (ServerAdmin,):
        missing = _missing(cls, protocol)
        if missing:
            raise AdapterContractError(f"admin class {_label(cls)} lacks {', '.join(missing)} "
                                       f"({protocol.__name__}, docs/dialects.md)")


def check_clone_source(source: Any) -> None:
    """``source`` implements ``CloneSource`` (``base.use_clone_source`` refuses it otherwise)."""
    missing = _missing(type(source), CloneSource)
    if missing:
        raise AdapterContractError(f"clone source {_label(type(source))} lacks "
                                   f"{', '.join(missing)} (CloneSource, docs/dialects.md)")


def admin_class(engine: Dialect) -> type:
    """The admin class ``engine.admin`` names (``"module:Class"``; imports the module, so the
    engine's driver), checked against ``ServerAdmin`` (and ``BulkLoad`` when the engine is a
    loader target). ``ValueError`` for an engine without one or a name that is no class."""
    if engine.admin is None:
        raise ValueError(f"dialect {engine.name!r} has no admin class")
    module, name = engine.admin.split(":")
    cls = vars(importlib.import_module(module)).get(name)
    if not isinstance(cls, type):
        raise ValueError(f"dialect {engine.name!r}: admin {engine.admin!r} names no class")
    check_admin(cls, load=engine.load is not None)
    return cls


def check_engine(engine: Dialect, adapter_cls: type) -> Contract:
    """The adapter (and admin) of ``engine`` implement what its storage layout needs, and agree
    with its descriptor: an adapter with ``ExactLexer`` exactly when the descriptor names a
    ``lexer`` (the executor splits with the one, ``statements`` with the other); ``AgentLogin``
    only for a storage whose admin makes the logins (server-clone)."""
    contract = contract_of(adapter_cls)
    if engine.storage.needs_admin:
        if not contract.has(AgentLogin):
            raise AdapterContractError(
                f"{engine.name}: storage {engine.storage.kind} needs its adapter "
                f"{_label(adapter_cls)} to implement AgentLogin "
                f"({', '.join(methods_of(AgentLogin))})")
        admin_class(engine)
    if contract.has(ExactLexer) != (engine.lexer is not None):
        raise AdapterContractError(
            f"{engine.name}: its adapter {_label(adapter_cls)} "
            + ("implements ExactLexer (lex) but its descriptor names no lexer (Dialect.lexer)"
               if engine.lexer is None else
               f"does not implement ExactLexer (lex) but its descriptor names the lexer {engine.lexer!r}"))
    if contract.has(AgentLogin) and not engine.storage.needs_admin:
        raise AdapterContractError(
            f"{engine.name}: its adapter {_label(adapter_cls)} implements AgentLogin, which only a "
            f"server-clone engine's admin logs it into; storage {engine.storage.kind} has none")
    return contract
