"""Task files: JSON Lines, one task record (``Task.to_dict()``) per line.

Guarantees:
- ``read_tasks`` / ``iter_tasks`` accept tasks of every registered kind in one file
  (``sqlrl.tasks.kinds.task_from_dict`` decides per record); blank lines are ignored; a line
  that is not JSON, not an object, or not a valid task raises ``TaskError`` naming the file and
  the 1-based line number. A missing file raises ``FileNotFoundError`` naming it.
- ``write_tasks`` is atomic: it writes a temporary file in the target's folder, fsyncs it and
  renames it over the target, so a crash or a bad task midway leaves any existing file untouched
  and never leaves a half-written one. What it writes ``read_tasks`` reads back equal.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from .kinds import task_from_dict
from .types import Task, TaskError

__all__ = ["read_tasks", "iter_tasks", "write_tasks", "iter_jsonl", "write_jsonl_atomic"]


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """``(line_number, parsed value)`` per non-blank line; bad JSON raises ``TaskError``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"JSONL file not found: {path}")
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column "
                                f"{exc.colno})") from None


def iter_tasks(path: str | Path) -> Iterator[Task]:
    for lineno, record in iter_jsonl(path):
        try:
            yield task_from_dict(record)
        except TaskError as exc:
            raise TaskError(f"{path}:{lineno}: {exc}") from None
        except TypeError as exc:  # e.g. a record with a field of the wrong shape
            raise TaskError(f"{path}:{lineno}: {exc}") from None


def read_tasks(path: str | Path) -> list[Task]:
    return list(iter_tasks(path))


def write_jsonl_atomic(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write ``records`` as JSON Lines via temp file + fsync + rename; returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return n


def write_tasks(path: str | Path, tasks: Iterable[Task]) -> int:
    """Write ``tasks`` to ``path`` atomically (see module doc); returns how many were written."""
    def records() -> Iterator[dict[str, Any]]:
        for i, task in enumerate(tasks):
            if not hasattr(task, "to_dict"):
                raise TaskError(f"item {i} is not a task: {type(task).__name__}")
            yield task.to_dict()
    return write_jsonl_atomic(path, records())
