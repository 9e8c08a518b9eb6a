"""BIRD loader (dev and mini-dev question files, in any of their SQL flavours).

Reads a JSON list of ``{question_id, db_id, question, evidence, SQL, difficulty}`` records
(``mini_dev_sqlite.json``, ``mini_dev_mysql.json``, ``mini_dev_postgresql.json``, ``dev.json``).

Guarantees:
- ``dialect`` defaults to the one named in the file name (``…_mysql.json`` -> mysql,
  ``…_postgresql.json`` -> postgresql), else SQLite; an unknown dialect raises ``TaskError``.
- ``task_id`` is the record's ``question_id`` (so predictions keyed by it line up), ``source`` is
  ``bird-<file stem>``, ``difficulty`` is BIRD's own (simple / moderate / challenging).
- ``db_root`` is optional: BIRD's databases (``<db_root>/<db_id>/<db_id>.sqlite``) are not always
  at hand. Without it the tasks still load and the catalog is empty -- evaluating them then
  needs ``db_root`` (or server databases the job adds to the catalog). With it, every database
  found is in the catalog under ``sqlite`` (also the source for loading a server flavour), and
  for the SQLite flavour (a file-based engine's) tasks whose file is missing are skipped and
  counted in ``skipped``.
- Schemas come from ``tables`` (default: ``dev_tables.json`` next to the questions, when there).
- Missing files/folders raise ``FileNotFoundError`` naming them; malformed records ``TaskError``
  naming the file and index.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...db.dialects.descriptor import find
from ..types import TaskError, Text2SQLTask, norm_dialect
from .base import (DatabaseFolder, TaskSet, from_files, read_json, read_tables_json, records_of,
                   require_dir, require_file)

__all__ = ["load_bird"]


def _dialect_in_name(stem: str) -> str | None:
    """The engine a file name names by one of its names or aliases, as a ``_``/``-``/``.``
    separated part (``mini_dev_mysql`` -> mysql, ``dev_pg`` -> postgresql); None without one."""
    return next((e.name for part in re.split(r"[_\-.]", stem) if (e := find(part)) is not None),
                None)


def load_bird(questions_json: str | Path, db_root: str | Path | None = None,
              dialect: str | None = None, *, tables: str | Path | None = None) -> TaskSet:
    path = require_file(Path(questions_json), "BIRD questions file")
    if dialect is None:
        dialect = _dialect_in_name(path.stem) or "sqlite"
    dialect = norm_dialect(dialect)
    if tables is not None:
        tables_path: Path | None = require_file(Path(tables), "BIRD tables.json")
    else:
        default = path.parent / "dev_tables.json"
        tables_path = default if default.is_file() else None
    roots = [require_dir(Path(db_root), "BIRD database folder")] if db_root is not None else []
    schemas = read_tables_json(tables_path) if tables_path else {}
    records = records_of(read_json(path, "BIRD questions file"), path)

    source = f"bird-{path.stem}"
    tasks, index = [], DatabaseFolder(roots)
    for i, record in enumerate(records):
        record = dict(record)
        record.setdefault("dialect", dialect)
        record.setdefault("source", source)
        if "task_id" not in record and "question_id" not in record:
            record["task_id"] = f"{source}-{i:04d}"
        try:
            task = Text2SQLTask.from_dict(record)
        except TaskError as exc:
            raise TaskError(f"{path}[{i}]: {exc}") from None
        if roots:
            if index.find(task.db_id) is not None:
                index.attach(task.db_id)  # the dataset's SQLite file (the loader's source)
            if from_files(task.dialect) and not index.attach(task.db_id, task.dialect):
                continue  # counted as skipped
        tasks.append(task)
    used = {t.db_id for t in tasks}
    return TaskSet(tasks=tuple(tasks), catalog=index.catalog,
                   schemas={db: s for db, s in schemas.items() if db in used},
                   source=source, skipped=index.skipped)
