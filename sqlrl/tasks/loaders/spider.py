"""Spider-family loader: Spider 1.0, Spider-Syn and Spider-DK folders, as given by the user.

Layout read: ``<root>/<split file>`` (see ``SPLITS``), ``<root>/tables.json`` and
``<root>/database/<db_id>/<db_id>.sqlite``; ``db_dirs`` adds folders searched after
``<root>/database`` (Spider-DK ships only its 3 modified databases: pass Spider's ``database``).

Guarantees:
- Task ids are ``spider-<split>-<index in the file>`` (stable whatever is skipped); ``source`` is
  ``spider-<split>``; the dialect is SQLite; ``gold_sql`` is the record's ``query``.
- Tasks whose database file is absent are left out and counted per db id in ``TaskSet.skipped``.
- ``difficulty``: Spider's hardness is not stored in the files; when a record carries Spider's
  parsed ``sql`` (``dev.json``, ``train_spider.json``) it is computed with the rule of Spider's
  official ``evaluation.py`` (``eval_hardness``, quirks included), kept as ``meta["hardness"]``
  (easy / medium / hard / extra) and mapped to ``difficulty`` (simple / moderate / challenging
  for both hard and extra). Records without ``sql`` (Spider-Syn, Spider-DK) get None. On Spider
  dev this gives 248 easy / 446 medium / 174 hard / 166 extra, the published split (tested).
- Spider's derived fields (``query_toks``, ``query_toks_no_value``, ``question_toks``, the parsed
  ``sql``) are dropped; every other field of a record is kept in ``meta`` (Spider-Syn's other
  question, Spider-DK's ``type``).
- A missing folder or file raises ``FileNotFoundError`` naming it; a malformed record raises
  ``TaskError`` naming the file and the record's index.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..types import TaskError, Text2SQLTask
from .base import (DatabaseFolder, TaskSet, read_json, read_tables_json, records_of, require_dir,
                   require_file)

__all__ = ["SPLITS", "SplitSpec", "load_spider", "spider_hardness"]

_DERIVED = ("query_toks", "query_toks_no_value", "question_toks", "sql")


@dataclass(frozen=True)
class SplitSpec:
    files: tuple[str, ...]  # the first that exists is read
    question_fields: tuple[str, ...]  # the first present in a record is the question


SPLITS: dict[str, SplitSpec] = {
    "dev": SplitSpec(("dev.json",), ("question",)),
    # Spider's train_spider.json, or Spider-Syn's copy whose SpiderQuestion is the original.
    "train": SplitSpec(("train_spider.json", "train_spider_syn.json"), ("question", "SpiderQuestion")),
    "train_others": SplitSpec(("train_others.json",), ("question",)),
    "dev_syn": SplitSpec(("dev_syn.json",), ("SpiderSynQuestion",)),
    "train_syn": SplitSpec(("train_spider_syn.json",), ("SpiderSynQuestion",)),
    "dk": SplitSpec(("Spider-DK.json",), ("question",)),
}


def load_spider(root: str | Path, split: str = "dev", *, db_dirs: Sequence[str | Path] = (),
                tables: str | Path | None = None) -> TaskSet:
    """Load one split of a Spider-layout folder. ``tables`` overrides ``<root>/tables.json``."""
    root = require_dir(Path(root), "Spider folder")
    spec = SPLITS.get(split)
    if spec is None:
        raise ValueError(f"unknown Spider split {split!r}; known: {', '.join(SPLITS)}")
    data_file = next((root / f for f in spec.files if (root / f).is_file()), None)
    if data_file is None:
        raise FileNotFoundError(f"Spider split {split!r} not found: expected "
                                f"{' or '.join(str(root / f) for f in spec.files)}")
    tables_path = require_file(Path(tables) if tables else root / "tables.json", "Spider tables.json")
    roots = [root / "database", *(Path(d) for d in db_dirs)]
    if not any(r.is_dir() for r in roots):
        require_dir(roots[0], "Spider database folder")
    for extra in roots[1:]:
        require_dir(extra, "database folder (db_dirs)")
    schemas = read_tables_json(tables_path)
    records = records_of(read_json(data_file, f"Spider {split} file"), data_file)

    source = f"spider-{split}"
    tasks, index = [], DatabaseFolder(roots)
    for i, record in enumerate(records):
        rest = {k: v for k, v in record.items() if k not in _DERIVED}
        difficulty = None
        if isinstance(record.get("sql"), dict):
            try:
                rest["hardness"] = difficulty = spider_hardness(record["sql"])
            except (KeyError, IndexError, TypeError) as exc:
                raise TaskError(f"{data_file}[{i}]: malformed parsed 'sql' ({exc!r})") from None
        qfield = next((f for f in spec.question_fields if f in rest), spec.question_fields[0])
        try:
            task = Text2SQLTask(task_id=f"{source}-{i:04d}", db_id=rest.pop("db_id", None),
                                question=rest.pop(qfield, None), gold_sql=rest.pop("query", None),
                                dialect="sqlite", difficulty=difficulty, source=source,
                                meta=rest)
        except TaskError as exc:
            raise TaskError(f"{data_file}[{i}]: {exc}") from None
        if index.attach(task.db_id):
            tasks.append(task)
    used = {t.db_id for t in tasks}
    return TaskSet(tasks=tuple(tasks), catalog=index.catalog,
                   schemas={db: s for db, s in schemas.items() if db in used},
                   source=source, skipped=index.skipped)


# -- Spider's hardness rule (evaluation.py: count_component1/2, count_others, eval_hardness) ------
# Parsed-SQL layout: cond_unit = [not_op, op_id, val_unit, val1, val2]; select = [distinct,
# [[agg_id, val_unit], ...]]; conditions alternate cond_units and "and"/"or". Like the original,
# aggregates are counted as "unit[0] != 0" on whatever the list holds.
_LIKE_OP = 9  # WHERE_OPS.index("like")


def _count_agg(units: list) -> int:
    return sum(1 for u in units if u[0] != 0)


def _component1(sql: dict) -> int:
    count = sum(1 for k in ("where", "groupBy", "orderBy") if len(sql[k]) > 0)
    count += sql["limit"] is not None
    if len(sql["from"]["table_units"]) > 0:
        count += len(sql["from"]["table_units"]) - 1
    conns = sql["from"]["conds"][1::2] + sql["where"][1::2] + sql["having"][1::2]
    count += sum(1 for tok in conns if tok == "or")
    conds = sql["from"]["conds"][::2] + sql["where"][::2] + sql["having"][::2]
    count += sum(1 for c in conds if c[1] == _LIKE_OP)
    return count


def _component2(sql: dict) -> int:
    conds = sql["from"]["conds"][::2] + sql["where"][::2] + sql["having"][::2]
    nested = sum(isinstance(c[3], dict) + isinstance(c[4], dict) for c in conds)
    return nested + sum(sql[k] is not None for k in ("intersect", "except", "union"))


def _others(sql: dict) -> int:
    agg = _count_agg(sql["select"][1]) + _count_agg(sql["where"][::2]) + _count_agg(sql["groupBy"])
    if len(sql["orderBy"]) > 0:
        agg += _count_agg([u[1] for u in sql["orderBy"][1] if u[1]] +
                          [u[2] for u in sql["orderBy"][1] if u[2]])
    agg += _count_agg(sql["having"])
    return ((agg > 1) + (len(sql["select"][1]) > 1) + (len(sql["where"]) > 1)
            + (len(sql["groupBy"]) > 1))


def spider_hardness(sql: dict) -> str:
    """Spider's official hardness (easy / medium / hard / extra) of a parsed ``sql`` record."""
    c1, c2, others = _component1(sql), _component2(sql), _others(sql)
    if c1 <= 1 and others == 0 and c2 == 0:
        return "easy"
    if (others <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and others < 2 and c2 == 0):
        return "medium"
    if ((others > 2 and c1 <= 2 and c2 == 0) or (2 < c1 <= 3 and others <= 2 and c2 == 0)
            or (c1 <= 1 and others == 0 and c2 <= 1)):
        return "hard"
    return "extra"
