"""``TaskSet``: what every benchmark loader returns, and the helpers loaders share.

Guarantees:
- ``TaskSet`` is a frozen dataclass of plain values (tasks, a catalog of database URLs in the shape
  ``sqlrl.db.leases.protocol.Catalog`` takes, schemas, skip counts): picklable, safe across Ray boundaries.
- ``skipped`` counts, per database id, the tasks a loader left out because their database file
  is missing; nothing is dropped silently.
- ``require_file`` / ``require_dir`` raise ``FileNotFoundError`` that names what was expected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ...db.dialects.descriptor import FileCopy, dialect_of
from ..schema import DatabaseSchema, schemas_from_tables_json
from ..types import Task, TaskError

__all__ = ["DatabaseFolder", "TaskSet", "db_file", "from_files", "read_json", "read_tables_json",
           "require_dir", "require_file"]


@dataclass(frozen=True)
class TaskSet:
    """Tasks plus where their databases live. ``catalog``: ``{db_id: {dialect: url}}``."""

    tasks: tuple[Task, ...]
    catalog: dict[str, dict[str, str]] = field(default_factory=dict)
    schemas: dict[str, DatabaseSchema] = field(default_factory=dict)
    source: str = ""
    skipped: dict[str, int] = field(default_factory=dict)  # db_id -> tasks left out (no db file)

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    @property
    def db_ids(self) -> tuple[str, ...]:
        return tuple(sorted({t.db_id for t in self.tasks}))

    def to_catalog(self):
        """The ``sqlrl.db.leases.protocol.Catalog`` of this set's databases (checks each URL's dialect)."""
        from ...db.leases.protocol import Catalog

        return Catalog(self.catalog)


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: expected a file at {path}")
    return path


def require_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise FileNotFoundError(f"{what} not found: expected a folder at {path}")
    return path


def read_json(path: Path, what: str) -> Any:
    require_file(path, what)
    try:
        with path.open("r", encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise TaskError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column "
                        f"{exc.colno})") from None


def read_tables_json(path: Path) -> dict[str, DatabaseSchema]:
    entries = read_json(path, "tables.json")
    if not isinstance(entries, list):
        raise TaskError(f"{path}: expected a JSON list of database schemas")
    return schemas_from_tables_json(entries, origin=str(path))


def db_file(db_id: str, roots: Iterable[Path], dialect: str = "sqlite") -> Path | None:
    """The file of database ``db_id`` in a database folder, by ``dialect``'s storage layout
    (``Dialect.storage``, a ``FileCopy``: SQLite's is ``<root>/<db_id>/<db_id>.sqlite`` or
    BIRD-CRITIC's ``…_template.sqlite``), or None. ``TaskError`` for an engine without files."""
    engine = dialect_of(dialect)
    if not isinstance(engine.storage, FileCopy):
        raise TaskError(f"{engine.display_name} databases are not files "
                        f"(storage {engine.storage.kind}): give a catalog entry")
    return engine.storage.find(db_id, roots)


def from_files(dialect: str) -> bool:
    """Whether a task in ``dialect`` takes its database from a loader's database folder: the
    engine's storage is a file copied per session (``Dialect.storage`` is a ``FileCopy``); a
    server engine's databases come from a catalog."""
    return isinstance(dialect_of(dialect).storage, FileCopy)


class DatabaseFolder:
    """What every loader does with a database folder: find each database's file once under
    ``roots`` (``db_file``, by the storage layout of the engine asked for: the datasets ship
    SQLite files, a file-based engine's tasks need its own), build the TaskSet's ``catalog``
    (``{db_id: {dialect: url}}``; and ``schemas`` read from the files when ``read_schemas``: with
    sqlite3 for an SQLite file, else through a session, ``DatabaseSchema.from_url``), and count
    the tasks whose file is missing in ``skipped``."""

    def __init__(self, roots: Iterable[Path], *, read_schemas: bool = False) -> None:
        self.roots = list(roots)
        self.read_schemas = read_schemas
        self.catalog: dict[str, dict[str, str]] = {}
        self.schemas: dict[str, DatabaseSchema] = {}
        self.skipped: dict[str, int] = {}
        self._found: dict[tuple[str, str], Path | None] = {}

    def find(self, db_id: str, dialect: str = "sqlite") -> Path | None:
        key = (db_id, dialect)
        if key not in self._found:
            self._found[key] = db_file(db_id, self.roots, dialect)
        return self._found[key]

    def skip(self, db_id: str) -> None:
        self.skipped[db_id] = self.skipped.get(db_id, 0) + 1

    def attach(self, db_id: str, dialect: str = "sqlite") -> bool:
        """Give ``db_id`` its catalog entry for ``dialect``; False (the task is counted as
        skipped) without a file."""
        path = self.find(db_id, dialect)
        if path is None:
            self.skip(db_id)
            return False
        engine = dialect_of(dialect)
        entry = self.catalog.setdefault(db_id, {})
        if engine.name not in entry:
            entry[engine.name] = url = engine.file_url(path)
            if self.read_schemas and db_id not in self.schemas:
                self.schemas[db_id] = (
                    DatabaseSchema.from_sqlite(path, db_id)
                    if isinstance(engine.storage, FileCopy) and engine.storage.sqlite_file
                    else DatabaseSchema.from_url(url))
        return True


def records_of(data: Any, path: Path) -> list[dict[str, Any]]:
    """A JSON list of objects, or ``TaskError`` naming the file and the bad index."""
    if not isinstance(data, list):
        raise TaskError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    for i, r in enumerate(data):
        if not isinstance(r, dict):
            raise TaskError(f"{path}[{i}]: a record must be a JSON object, got {type(r).__name__}")
    return data
