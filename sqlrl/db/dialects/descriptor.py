"""The dialect descriptor: everything sqlrl knows about one database engine, as one frozen value,
and the registry every module reads it from.

    from sqlrl.db.dialects.descriptor import dialect_of
    d = dialect_of("postgres")          # a name or an alias -> Dialect(name="postgresql", ...)
    d.display_name, d.sqlglot, d.identifier("order")   # 'PostgreSQL', 'postgres', '"order"'

The built-in engines are declared in ``engines.py``, registered when the package
``sqlrl.db.dialects`` is imported (its ``__init__`` imports ``engines``); a test or a plug-in adds
one with ``register(Dialect(...))`` and nothing else: sessions (the adapter module is imported by
``base.get_dialect``), URLs, task records, schema rendering and introspection, prompts, result
comparison, the BIRD and BIRD-CRITIC evaluators, the lexer choice, provisioning and the loader all
look the engine up here. tests/unit/test_dialect_registry.py fails when a module outside
``sqlrl/db/dialects/`` keeps a per-dialect map or branch of its own.

Guarantees:
- Importing this module imports no database driver and nothing else of sqlrl (it is the bottom
  of ``sqlrl.db.dialects``: ``contract``, ``base``, ``statements`` and ``url`` read it, it reads
  none of them; tests/unit/test_layers.py fails on an import cycle in ``sqlrl/db``).
- Lookups accept a name or an alias in any case (``"MariaDB"`` -> mysql); names and aliases are
  unique across the registry (``register`` refuses a clash). ``names()`` keeps registration order
  (the built-ins first).
- A ``Dialect`` is immutable; what is derived from it (``keywords``) is computed once.
- A ``Dialect`` declares its storage layout (``storage``: ``FileCopy``, ``ServerClone``,
  ``ServerTransaction``) and is refused at construction when the layout lacks its parts (a
  server clone without an admin class); ``file_based`` means ``storage`` is a ``FileCopy`` and
  nothing else. What the adapter and the admin must implement for the layout is checked by
  ``contract.check_engine`` before the engine's first session (``base.get_dialect``); the admin
  class ``admin`` names is imported and checked by ``contract.admin_class``.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping

from sqlglot.dialects import Dialect as SqlglotDialect

__all__ = ["COMMON_RESERVED", "Dialect", "FileCopy", "LoadTypes", "ServerClone", "ServerTransaction",
           "Storage", "by_sqlglot", "dialect_of", "dialects", "find", "names", "register",
           "registered", "sqlglot_name", "unregister"]

# Words quoted when used as names in every dialect: PostgreSQL's reserved words and SQLite's
# keywords (so a name like ``order`` or ``key`` is always quoted); engines add their own.
COMMON_RESERVED = frozenset("""
ABORT ACTION ADD AFTER ALL ALTER ANALYSE ANALYZE AND ANY ARRAY AS ASC ASYMMETRIC ATTACH
AUTHORIZATION AUTOINCREMENT BEFORE BEGIN BETWEEN BINARY BOTH BY CASCADE CASE CAST CHECK COLLATE
COLLATION COLUMN COMMIT CONCURRENTLY CONFLICT CONSTRAINT CREATE CROSS CURRENT_CATALOG CURRENT_DATE
CURRENT_ROLE CURRENT_SCHEMA CURRENT_TIME CURRENT_TIMESTAMP CURRENT_USER DATABASE DEFAULT DEFERRABLE
DEFERRED DELETE DESC DETACH DISTINCT DO DROP EACH ELSE END ESCAPE EXCEPT EXCLUSIVE EXISTS EXPLAIN
FAIL FALSE FETCH FOR FOREIGN FREEZE FROM FULL GLOB GRANT GROUP HAVING IF IGNORE ILIKE IMMEDIATE IN
INDEX INDEXED INITIALLY INNER INSERT INSTEAD INTERSECT INTO IS ISNULL JOIN KEY LATERAL LEADING LEFT
LIKE LIMIT LOCALTIME LOCALTIMESTAMP MATCH NATURAL NO NOT NOTHING NOTNULL NULL OF OFFSET ON ONLY OR
ORDER OUTER OVERLAPS PLACING PLAN PRAGMA PRIMARY QUERY RAISE RECURSIVE REFERENCES REGEXP REINDEX
RELEASE RENAME REPLACE RESTRICT RETURNING RIGHT ROLLBACK ROW ROWS SAVEPOINT SELECT SESSION_USER SET
SIMILAR SOME SYMMETRIC TABLE TABLESAMPLE TEMP TEMPORARY THEN TO TRAILING TRANSACTION TRIGGER TRUE
UNION UNIQUE UPDATE USER USING VACUUM VALUES VARIADIC VERBOSE VIEW VIRTUAL WHEN WHERE WINDOW WITH
""".split())
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class LoadTypes:
    """How ``sqlrl.db.provisioning.loader`` creates a copied SQLite table on this engine (docs/loader.md)."""

    types: Mapping[str, str]  # portable kind (integer real text blob date timestamp) -> column type
    table_suffix: str = ""  # appended to CREATE TABLE (MariaDB: charset and binary collation)
    key_varchar_max: int | None = None  # text key columns: None = the text type; n = VARCHAR(len) up to n

    def key_text_type(self, longest: int) -> str | None:
        """The type of a text primary-key column whose longest value has ``longest`` characters,
        or None when the engine cannot index it (the table then gets no primary key)."""
        if self.key_varchar_max is None:
            return self.types["text"]
        return f"VARCHAR({max(longest, 1)})" if longest <= self.key_varchar_max else None


@dataclass(frozen=True)
class FileCopy:
    """Storage "file-copy": a database is one local file (the session URL's path); every session
    works on a private copy of it (SQLite: deserialized into memory, or a temp file), never on
    the file. In a database folder, database ``db_id`` is ``<root>/<db_id>/<db_id><suffix>``, the
    first of ``suffixes`` that exists (``path_in`` names the first)."""

    suffixes: tuple[str, ...]  # file name endings after the db_id, the canonical one first
    sqlite_file: bool = False  # the file is an SQLite database (its schema is read with sqlite3)
    kind: ClassVar[str] = "file-copy"
    needs_admin: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not self.suffixes or not all(isinstance(s, str) and s for s in self.suffixes):
            raise ValueError("FileCopy needs at least one file name suffix (e.g. '.sqlite')")

    def path_in(self, root: str | Path, db_id: str) -> Path:
        """Where database ``db_id`` lives in the folder ``root`` (the canonical file name)."""
        return Path(root) / db_id / f"{db_id}{self.suffixes[0]}"

    def find(self, db_id: str, roots: Iterable[str | Path]) -> Path | None:
        """The first existing ``<root>/<db_id>/<db_id><suffix>`` (resolved), or None."""
        for root in roots:
            for suffix in self.suffixes:
                candidate = Path(root) / db_id / f"{db_id}{suffix}"
                if candidate.is_file():
                    return candidate.resolve()
        return None


@dataclass(frozen=True)
class ServerClone:
    """Storage "server-clone": a database is a base on a server (the URL names it); every
    session gets its own clone and login role, made by the engine's admin (``Dialect.admin``:
    ``contract.ServerAdmin``) and logged into by its adapter (``contract.AgentLogin``)."""

    kind: ClassVar[str] = "server-clone"
    needs_admin: ClassVar[bool] = True


@dataclass(frozen=True)
class ServerTransaction:
    """Storage "server-transaction": a database on a server, shared by sessions; each session
    works inside one transaction that is rolled back at its end (SQL Server, Oracle: unverified)."""

    kind: ClassVar[str] = "server-transaction"
    needs_admin: ClassVar[bool] = False


Storage = FileCopy | ServerClone | ServerTransaction
_STORAGES = (FileCopy, ServerClone, ServerTransaction)


@dataclass(frozen=True, eq=False)
class Dialect:
    """One engine. Only ``name``, ``display_name``, ``sqlglot``, ``adapter`` and ``storage`` are
    required; the optional parts switch features on (no ``admin``: no provisioning; no
    ``columns_sql``: no introspection through a session; no ``plan_cost``: no BIRD-CRITIC plan
    comparison)."""

    name: str  # the registry key, as task records, URLs and catalogs spell it
    display_name: str  # how prompts name the engine
    sqlglot: str  # sqlglot's name for the engine (parsing, transpiling, tokenizing)
    adapter: str  # the module whose import registers the session adapter (``@register_dialect``)
    storage: Storage  # where a database lives, how a session gets its own (FileCopy, ServerClone, ..)
    aliases: tuple[str, ...] = ()  # other spellings accepted anywhere a dialect is named
    quotes: tuple[str, str] = ('"', '"')  # identifier quote characters (open, close)
    reserved_words: frozenset[str] = frozenset()  # quoted as names, beyond COMMON_RESERVED
    sqlglot_reserved: bool = False  # also quote sqlglot's reserved keywords for the engine
    declared_types: bool = False  # column types are free text (SQLite): shown as declared
    one_statement_per_call: bool = False  # its official driver runs one statement per call (BIRD)
    lexer: str | None = None  # "module" or "module:object" with split()/lex(): the engine's exact
    #                           lexer (statements.py); its adapter then has ExactLexer (contract.py)
    admin: str | None = None  # "module:Class" of the admin operations (sqlrl.db.provisioning)
    admin_url_env: str | None = None  # environment variable naming a test server's admin URL
    load: LoadTypes | None = None  # the loader can copy SQLite databases into this engine
    columns_sql: str | None = None  # (table, column, type, not null) rows of every table and view,
    #                                 ordered by table name, then column position
    plan_cost: Callable[[Callable[[str], Any], str], float] | None = field(default=None, repr=False)
    #   (run, sql) -> the plan cost of one DML statement; ``run(sql)`` returns its rows
    verified: bool = True  # tested against a real server (docs/unverified_dialects.md otherwise)

    def __post_init__(self) -> None:
        if not isinstance(self.storage, _STORAGES):
            raise ValueError(f"dialect {self.name!r}: storage must be one of "
                             f"{', '.join(c.__name__ for c in _STORAGES)}, got {self.storage!r}")
        if self.storage.needs_admin and self.admin is None:
            raise ValueError(f"dialect {self.name!r}: storage {self.storage.kind} needs an admin "
                             "class (admin='module:Class', contract.ServerAdmin)")
        if self.load is not None and self.admin is None:
            raise ValueError(f"dialect {self.name!r}: a loader target (load=...) needs an admin "
                             "class (contract.BulkLoad)")

    @property
    def file_based(self) -> bool:
        """A database is a local file copied per session (``storage`` is ``FileCopy``)."""
        return isinstance(self.storage, FileCopy)

    def file_url(self, path: str | Path) -> str:
        """The session URL of the database file at ``path`` (a file-based engine)."""
        if not isinstance(self.storage, FileCopy):
            raise ValueError(f"{self.display_name} databases are not files "
                             f"(storage {self.storage.kind})")
        return f"{self.name}:///{path}"

    @cached_property
    def keywords(self) -> frozenset[str]:
        """Upper-case words that must be quoted when used as names."""
        words = set(COMMON_RESERVED) | set(self.reserved_words)
        if self.sqlglot_reserved:
            generator = SqlglotDialect.get_or_raise(self.sqlglot).generator_class
            words |= {k.upper() for k in generator.RESERVED_KEYWORDS}
        return frozenset(words)

    def quote(self, name: str) -> str:
        """``name`` quoted (the closing quote character doubled inside)."""
        left, right = self.quotes
        return f"{left}{name.replace(right, right + right)}{right}"

    def identifier(self, name: str) -> str:
        """``name`` bare when it is a plain word and no keyword, else quoted."""
        if _PLAIN.match(name) and name.upper() not in self.keywords:
            return name
        return self.quote(name)


_REGISTRY: dict[str, Dialect] = {}  # the built-ins are added by engines.py (package import)
_SPELLED: dict[str, Dialect] = {}  # every name and alias, lower-cased -> its dialect


def _spellings(d: Dialect) -> set[str]:
    return {d.name.lower(), *(a.lower() for a in d.aliases)}


def _respell() -> None:
    _SPELLED.clear()
    _SPELLED.update({s: d for d in _REGISTRY.values() for s in _spellings(d)})


def register(dialect: Dialect) -> Dialect:
    """Add ``dialect`` (replacing one of the same name); refuses a name or alias already taken."""
    registry = _REGISTRY
    for other in registry.values():
        if other.name != dialect.name and _spellings(other) & _spellings(dialect):
            raise ValueError(f"dialect {dialect.name!r} clashes with {other.name!r} on "
                             f"{sorted(_spellings(other) & _spellings(dialect))}")
    registry[dialect.name] = dialect
    _respell()
    return dialect


def unregister(name: str) -> None:
    """Remove the dialect ``name`` (tests). ``base.get_dialect`` caches adapters by descriptor, so
    an adapter made for the removed descriptor is never handed out again."""
    _REGISTRY.pop(name, None)
    _respell()


@contextmanager
def registered(dialect: Dialect) -> Iterator[Dialect]:
    """``with registered(Dialect(...)):`` the engine exists inside the block only (one it
    replaced by name is put back after it)."""
    previous = _REGISTRY.get(dialect.name)
    register(dialect)
    try:
        yield dialect
    finally:
        unregister(dialect.name)
        if previous is not None:
            register(previous)


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def dialects() -> tuple[Dialect, ...]:
    return tuple(_REGISTRY.values())


def find(name: str) -> Dialect | None:
    """The dialect named or aliased ``name`` (any case, surrounding space ignored), or None."""
    found = _SPELLED.get(name) if isinstance(name, str) else None
    return found if found is not None else _SPELLED.get(str(name).strip().lower())


def dialect_of(name: str) -> Dialect:
    """Like ``find``; raises ``ValueError`` naming the known dialects for an unknown name."""
    d = find(name)
    if d is None:
        raise ValueError(f"unknown dialect {name!r}; known: {', '.join(names())}")
    return d


def by_sqlglot(sqlglot: str) -> Dialect | None:
    """The first registered dialect whose sqlglot name is ``sqlglot``, or None."""
    return next((d for d in _REGISTRY.values() if d.sqlglot == sqlglot), None)


def sqlglot_name(name: str) -> str:
    """sqlglot's name for a dialect named (or aliased) ``name``; other text is taken to be a
    sqlglot name already and returned as given."""
    d = find(name)
    return d.sqlglot if d is not None else name
