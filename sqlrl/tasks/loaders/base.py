"""``TaskSet``: what every benchmark loader returns, and the helpers loaders share.

Guarantees:
- ``TaskSet`` is a frozen dataclass of plain values (tasks, a catalog of database URLs in the shape
  ``sqlrl.db.lease.Catalog`` takes, schemas, skip counts): picklable, safe across Ray boundaries.
- ``skipped`` counts, per database id, the tasks a loader left out because their database file
  is missing; nothing is dropped silently.
- ``require_file`` / ``require_dir`` raise ``FileNotFoundError`` that names what was expected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ...db.dialects.descriptor import dialect_of
from ...db.url import sqlite_url
from ..schema import DatabaseSchema, schemas_from_tables_json
from ..types import Task, TaskError

__all__ = ["TaskSet", "require_file", "require_dir", "read_json", "sqlite_db_file",
           "sqlite_catalog_entry", "read_tables_json", "from_files"]


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
        """The ``sqlrl.db.lease.Catalog`` of this set's databases (checks each URL's dialect)."""
        from ...db.lease import Catalog

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


def sqlite_db_file(db_id: str, roots: Iterable[Path]) -> Path | None:
    """The first ``<root>/<db_id>/<db_id>.sqlite`` (or BIRD-CRITIC's ``…_template.sqlite``)."""
    for root in roots:
        for name in (f"{db_id}.sqlite", f"{db_id}_template.sqlite"):
            candidate = root / db_id / name
            if candidate.is_file():
                return candidate.resolve()
    return None


def from_files(dialect: str) -> bool:
    """Whether a task in ``dialect`` takes its database from a loader's database folder: the
    engine's databases are files (``Dialect.file_based``); a server engine's come from a catalog."""
    return dialect_of(dialect).file_based


def sqlite_catalog_entry(path: Path) -> dict[str, str]:
    return {"sqlite": sqlite_url(str(path.resolve()))}


class SqliteIndex:
    """What every loader does with a database folder: find each database's SQLite file once under
    ``roots`` (``sqlite_db_file``), build the TaskSet's ``catalog`` (and ``schemas`` read from the
    files when ``read_schemas``), and count the tasks whose file is missing in ``skipped``."""

    def __init__(self, roots: Iterable[Path], *, read_schemas: bool = False) -> None:
        self.roots = list(roots)
        self.read_schemas = read_schemas
        self.catalog: dict[str, dict[str, str]] = {}
        self.schemas: dict[str, DatabaseSchema] = {}
        self.skipped: dict[str, int] = {}
        self._found: dict[str, Path | None] = {}

    def find(self, db_id: str) -> Path | None:
        if db_id not in self._found:
            self._found[db_id] = sqlite_db_file(db_id, self.roots)
        return self._found[db_id]

    def skip(self, db_id: str) -> None:
        self.skipped[db_id] = self.skipped.get(db_id, 0) + 1

    def attach(self, db_id: str) -> bool:
        """Give ``db_id`` its catalog entry; False (the task is counted as skipped) without a file."""
        path = self.find(db_id)
        if path is None:
            self.skip(db_id)
            return False
        if db_id not in self.catalog:
            self.catalog[db_id] = sqlite_catalog_entry(path)
            if self.read_schemas:
                self.schemas[db_id] = DatabaseSchema.from_sqlite(path, db_id)
        return True


def records_of(data: Any, path: Path) -> list[dict[str, Any]]:
    """A JSON list of objects, or ``TaskError`` naming the file and the bad index."""
    if not isinstance(data, list):
        raise TaskError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    for i, r in enumerate(data):
        if not isinstance(r, dict):
            raise TaskError(f"{path}[{i}]: a record must be a JSON object, got {type(r).__name__}")
    return data
