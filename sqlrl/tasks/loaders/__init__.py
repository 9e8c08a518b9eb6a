"""Benchmark loaders: user-given paths -> ``TaskSet`` (tasks + database catalog + schemas).

``LOADERS`` is the registry (``spider``, ``bird``, ``critic``, ``verl``, ``jsonl``) and
``load(kind, path, **kw)`` dispatches on it. Each loader's module states its own guarantees; all
share these: a missing folder or file raises ``FileNotFoundError`` naming what was expected; a
malformed record raises ``TaskError`` naming the file and the line or index; tasks whose database
file is missing are counted in ``TaskSet.skipped``, never dropped silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..io import read_tasks
from .base import DatabaseFolder, TaskSet, from_files, require_dir
from .bird import load_bird
from .critic import load_critic
from .spider import SPLITS as SPIDER_SPLITS
from .spider import load_spider
from .verl import default_prompt, export_verl, load_verl

__all__ = ["TaskSet", "LOADERS", "load", "load_spider", "load_bird", "load_critic", "load_verl",
           "load_jsonl", "export_verl", "default_prompt", "SPIDER_SPLITS"]


def load_jsonl(path: str | Path, db_root: str | Path | None = None) -> TaskSet:
    """Tasks from a sqlrl JSONL file (``sqlrl.tasks.io``). With ``db_root``, the tasks of a
    file-based engine (``base.from_files``: SQLite's) get catalog entries (and schemas, read from
    the files) from ``<db_root>/<db_id>/<db_id><suffix>`` (the engine's ``FileCopy`` layout:
    ``.sqlite`` for SQLite) and are skipped (counted) without."""
    path = Path(path)
    tasks = read_tasks(path)
    if db_root is None:
        return TaskSet(tasks=tuple(tasks), source=f"jsonl-{path.stem}")
    index = DatabaseFolder([require_dir(Path(db_root), "database folder")], read_schemas=True)
    kept = [t for t in tasks if not from_files(t.dialect) or index.attach(t.db_id, t.dialect)]
    return TaskSet(tasks=tuple(kept), catalog=index.catalog, schemas=index.schemas,
                   source=f"jsonl-{path.stem}", skipped=index.skipped)


LOADERS: dict[str, Callable[..., TaskSet]] = {
    "spider": load_spider,
    "bird": load_bird,
    "critic": load_critic,
    "verl": load_verl,
    "jsonl": load_jsonl,
}


def load(kind: str, path: str | Path, **kw: Any) -> TaskSet:
    """``LOADERS[kind](path, **kw)``; an unknown kind raises ``ValueError`` listing the known."""
    loader = LOADERS.get(kind)
    if loader is None:
        raise ValueError(f"unknown task source {kind!r}; known: {', '.join(LOADERS)}")
    return loader(path, **kw)
