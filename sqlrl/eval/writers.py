"""Writing predictions in the formats the official evaluators (and ``jobs.evaluate``) read.

- Spider: one SQL per line (newlines inside a query collapsed to spaces), in question order.
- BIRD: a JSON object ``{"0": "SQL\\t----- bird -----\\tdb_id", ...}``.
- BIRD-CRITIC: JSONL, ``{"instance_id": ..., "pred_sqls": [...]}`` per line.

Writes are atomic (temp file + rename). A missing prediction is written as ``SELECT 1`` for Spider
and BIRD (the evaluators need one line per question; it scores 0 unless the gold is ``SELECT 1``)
and as an empty ``pred_sqls`` list for BIRD-CRITIC.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Sequence

from .bird import SEPARATOR

PLACEHOLDER = "SELECT 1"


def _one_line(sql: str | None) -> str:
    text = " ".join((sql or "").split())
    return text or PLACEHOLDER


def _atomic(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_spider(path: str | Path, sqls: Sequence[str | None]) -> Path:
    return _atomic(path, "".join(_one_line(s) + "\n" for s in sqls))


def write_bird(path: str | Path, sqls: Sequence[str | None], db_ids: Sequence[str]) -> Path:
    if len(sqls) != len(db_ids):
        raise ValueError(f"{len(sqls)} predictions but {len(db_ids)} database ids")
    data = {str(i): f"{_one_line(s)}{SEPARATOR}{db}" for i, (s, db) in enumerate(zip(sqls, db_ids))}
    return _atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_critic(path: str | Path, items: Iterable[tuple[str, Sequence[str] | str | None]]) -> Path:
    lines = []
    for instance_id, sqls in items:
        if sqls is None:
            sqls = []
        elif isinstance(sqls, str):
            sqls = [sqls]
        lines.append(json.dumps({"instance_id": instance_id, "pred_sqls": list(sqls)},
                                ensure_ascii=False))
    return _atomic(path, "".join(l + "\n" for l in lines))
