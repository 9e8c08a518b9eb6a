"""BIRD-CRITIC loader: SQL-debugging instances (JSONL) plus, optionally, their schema file.

Instance records use BIRD-CRITIC's keys (``instance_id``, ``db_id``, ``query``, ``issue_sql``,
``sol_sql``, ``preprocess_sql``, ``clean_up_sql``, ``test_cases``, ``conditions``, ``dialect``,
``category``, ``efficiency``, …). The first release's spellings ``selected_database`` (for
``db_id``) and ``error_sql`` (for ``issue_sql``) are accepted too.

Schema files, as BIRD-CRITIC ships them: a JSONL of records keyed by ``instance_id`` holding
``original_schema`` / ``preprocess_schema`` text (merged into the instance like BIRD-CRITIC's
``pull_data.py`` does: the instance's own fields win), records keyed by ``db_id`` instead, or a
``.json`` object ``{db_id: schema text}`` (``dev_schema.json``; stored as ``original_schema``).
Merged fields land in the task's ``meta`` and are written back by ``to_dict``.

Guarantees:
- ``dialect``: the record's own (``PostgreSQL``, ``SQLServer``, … normalised), else the
  ``dialect`` argument (default SQLite); an unknown one raises ``TaskError``.
- ``db_root`` (SQLite instances): ``<db_root>/<db_id>/<db_id>.sqlite`` or BIRD-CRITIC's
  ``<db_id>_template.sqlite`` becomes the catalog entry and its introspected schema goes to
  ``schemas``; instances whose file is missing are skipped and counted. Server-dialect instances
  are never skipped: their databases are the job's to provide.
- Instances without ``sol_sql`` (BIRD-CRITIC's public releases withhold solutions and test cases)
  fail with ``TaskError`` naming the line: they cannot be graded.
- Missing files raise ``FileNotFoundError``; malformed lines ``TaskError`` with file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..io import iter_jsonl
from ..types import CriticTask, TaskError, norm_dialect
from .base import DatabaseFolder, TaskSet, from_files, read_json, require_dir, require_file

__all__ = ["load_critic", "read_critic_schemas"]

_ALIASES = {"selected_database": "db_id", "error_sql": "issue_sql"}


def read_critic_schemas(path: str | Path) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """``(by_instance_id, by_db_id)``: the extra fields each schema record adds."""
    path = require_file(Path(path), "BIRD-CRITIC schema file")
    by_instance: dict[str, dict[str, Any]] = {}
    by_db: dict[str, dict[str, Any]] = {}
    if path.suffix == ".json":
        data = read_json(path, "BIRD-CRITIC schema file")
        if isinstance(data, dict):
            for db_id, text in data.items():
                if not isinstance(text, str):
                    raise TaskError(f"{path}: schema of {db_id!r} must be text, "
                                    f"got {type(text).__name__}")
                by_db[db_id] = {"original_schema": text}
            return by_instance, by_db
        rows = list(enumerate(data if isinstance(data, list) else [data]))
    else:
        rows = list(iter_jsonl(path))
    for where, record in rows:
        if not isinstance(record, dict):
            raise TaskError(f"{path}:{where}: a schema record must be a JSON object")
        record = dict(record)
        if "instance_id" in record:
            by_instance[str(record.pop("instance_id"))] = record
        else:
            db_id = record.pop("db_id", None) or record.pop("selected_database", None)
            if not db_id:
                raise TaskError(f"{path}:{where}: a schema record needs 'instance_id' or 'db_id'")
            by_db[str(db_id)] = record
    return by_instance, by_db


def load_critic(jsonl_path: str | Path, schema_jsonl: str | Path | None = None,
                db_root: str | Path | None = None, *, dialect: str | None = None) -> TaskSet:
    path = Path(jsonl_path)
    require_file(path, "BIRD-CRITIC instances file")
    default_dialect = norm_dialect(dialect or "sqlite")
    by_instance, by_db = read_critic_schemas(schema_jsonl) if schema_jsonl is not None else ({}, {})
    roots = [require_dir(Path(db_root), "BIRD-CRITIC database folder")] if db_root is not None else []

    source = f"bird-critic-{path.stem}"
    tasks, index = [], DatabaseFolder(roots, read_schemas=True)
    for lineno, record in iter_jsonl(path):
        try:
            task = _task(record, by_instance, by_db, default_dialect, source)
        except (TaskError, TypeError) as exc:
            raise TaskError(f"{path}:{lineno}: {exc}") from None
        if roots and from_files(task.dialect) and not index.attach(task.db_id, task.dialect):
            continue
        tasks.append(task)
    return TaskSet(tasks=tuple(tasks), catalog=index.catalog, schemas=index.schemas, source=source,
                   skipped=index.skipped)


def _task(record: Any, by_instance: dict, by_db: dict, dialect: str, source: str) -> CriticTask:
    if not isinstance(record, dict):
        raise TaskError(f"an instance must be a JSON object, got {type(record).__name__}")
    record = dict(record)
    for alias, key in _ALIASES.items():
        if alias in record and key not in record:
            record[key] = record.pop(alias)
    if "instance_id" not in record:
        raise TaskError("instance_id is missing")
    if "sol_sql" not in record:
        raise TaskError("sol_sql is missing (BIRD-CRITIC's public files withhold solutions; "
                        "an instance without one cannot be graded)")
    extra = {**by_db.get(str(record.get("db_id")), {}), **by_instance.get(str(record["instance_id"]), {})}
    record = {**extra, **record}
    record.setdefault("dialect", dialect)
    record.setdefault("source", source)
    return CriticTask.from_dict(record)
