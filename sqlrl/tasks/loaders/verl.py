"""verl's RL dataset format (parquet): export tasks for verl, and load them back.

One row per task, with verl's columns:
``data_source`` (str), ``prompt`` (chat messages ``[{role, content}]``), ``ability`` (str),
``reward_model`` (``{"style": "rule", "ground_truth": str}``: the kind's
``TaskKind.ground_truth`` -- the gold SQL, or for a BIRD-CRITIC task the JSON list of ``sol_sql``)
and ``extra_info``: ``index``, ``split``, ``task_kind``, ``task_id``, ``task`` (the full
``Task.to_dict()`` as JSON text), and, as verl's multi-turn tool rollouts expect, ``need_tools_kwargs: true`` and ``tools_kwargs = {tool name: {"create_kwargs":
{task_id, db_id, dialect, preprocess_sql}}}`` for each tool in ``sqlrl.tools.schemas.TOOLS``.

Guarantees:
- The parquet schema is fixed (explicit pyarrow types), whatever the tasks hold; the task rides
  as JSON text so heterogeneous ``meta`` never breaks the file.
- ``load_verl(export_verl(tasks))`` gives tasks equal to ``tasks`` (``to_dict`` round-trips).
- Writing is atomic (temp file + rename). Reading errors name the file and the row: a missing
  file raises ``FileNotFoundError``, a non-parquet file or a row without ``extra_info.task``
  raises ``TaskError``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ...tools.schemas import TOOLS
from ..schema import DatabaseSchema
from ..kinds import kind_of, task_from_dict
from ..types import Task, TaskError
from .base import TaskSet, require_file

__all__ = ["export_verl", "load_verl", "default_prompt", "verl_row"]

PromptFn = Callable[[Task], list[dict[str, str]]]


def default_prompt(task: Task, schema: DatabaseSchema | None = None) -> list[dict[str, str]]:
    """A plain two-message prompt: instructions, then the problem (and the schema when given)."""
    system = ("You are an expert SQL assistant working on a live database through tools: "
              "`execute_sql` runs SQL in your own private session and shows the result; "
              "`submit_solution` submits your final SQL and ends the episode.")
    parts = [f"Database: {task.db_id} ({task.dialect})"]
    if schema is not None:
        parts.append("Schema:\n" + schema.to_create_sql(task.dialect))
    parts += kind_of(task).verl_prompt(task)
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is a declared dependency
        raise ImportError("the verl format needs pyarrow (pip install 'pyarrow>=14')") from exc
    return pa, pq


# verl's name of sqlrl's agent loop (actors/verl/agent_loop.py registers it; one database session
# per trajectory). verl's own "tool_agent" would create and release a tool per call.
AGENT_NAME = "sqlrl_agent"


def _schema(agent_name: bool = False):
    pa, _ = _pa()
    create = pa.struct([("task_id", pa.string()), ("db_id", pa.string()),
                        ("dialect", pa.string()), ("preprocess_sql", pa.list_(pa.string()))])
    tools = pa.struct([(name, pa.struct([("create_kwargs", create)])) for name in TOOLS])
    return pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string()),
                                  ("task_kind", pa.string()), ("task_id", pa.string()),
                                  ("task", pa.string()), ("need_tools_kwargs", pa.bool_()),
                                  ("tools_kwargs", tools)])),
    ] + ([("agent_name", pa.string())] if agent_name else []))


def verl_row(task: Task, index: int, *, prompt: list[dict[str, str]], ability: str = "sql",
             split: str = "train", data_source: str | None = None) -> dict[str, Any]:
    """One verl row for ``task`` (see the module doc for the layout)."""
    if (not isinstance(prompt, list) or not prompt or any(
            not isinstance(m, dict) or set(m) != {"role", "content"}
            or not all(isinstance(v, str) for v in m.values()) for m in prompt)):
        raise TaskError(f"task {task.task_id!r}: the prompt must be a non-empty list of "
                        "{'role': str, 'content': str} messages")
    ground_truth = kind_of(task).ground_truth(task)
    create = {"task_id": task.task_id, "db_id": task.db_id, "dialect": task.dialect,
              "preprocess_sql": list(kind_of(task).scene_sql(task))}
    return {
        "data_source": data_source or task.source or f"sqlrl-{task.kind}",
        "prompt": prompt,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index, "split": split, "task_kind": task.kind,
                       "task_id": task.task_id,
                       "task": json.dumps(task.to_dict(), ensure_ascii=False, allow_nan=False),
                       "need_tools_kwargs": True,
                       "tools_kwargs": {name: {"create_kwargs": dict(create)} for name in TOOLS}},
    }


def export_verl(tasks: Iterable[Task], path: str | Path, *, prompt_fn: PromptFn | None = None,
                ability: str = "sql", split: str = "train", data_source: str | None = None,
                schemas: Mapping[str, DatabaseSchema] | None = None,
                agent_name: str | None = None) -> int:
    """Write ``tasks`` as a verl parquet file (atomically); returns the number of rows.

    ``prompt_fn(task)`` gives the chat messages; by default ``default_prompt`` with the task's
    schema from ``schemas`` (e.g. ``TaskSet.schemas``) when there is one. ``agent_name`` adds
    verl's optional ``agent_name`` column (``AGENT_NAME``: sqlrl's agent loop, actors/verl, one
    session per trajectory).
    """
    pa, pq = _pa()
    schemas = schemas or {}
    make = prompt_fn or (lambda t: default_prompt(t, schemas.get(t.db_id)))
    rows = [verl_row(t, i, prompt=make(t), ability=ability, split=split, data_source=data_source)
            for i, t in enumerate(tasks)]
    if agent_name is not None:
        for row in rows:
            row["agent_name"] = agent_name
    table = pa.Table.from_pylist(rows, schema=_schema(agent_name is not None))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(rows)


def load_verl(parquet_path: str | Path) -> TaskSet:
    """Tasks from a verl parquet file written by ``export_verl`` (catalog left empty)."""
    pa, pq = _pa()
    path = require_file(Path(parquet_path), "verl parquet file")
    try:
        table = pq.read_table(path, columns=["extra_info"])
    except (pa.ArrowInvalid, KeyError, OSError) as exc:
        raise TaskError(f"{path}: not a verl parquet file with an 'extra_info' column ({exc})") from None
    column = table.column("extra_info")
    if not pa.types.is_struct(column.type) or column.type.get_field_index("task") < 0:
        raise TaskError(f"{path}: 'extra_info' has no 'task' field (not written by export_verl?)")
    tasks = []
    for i, text in enumerate(column.combine_chunks().field("task").to_pylist()):
        try:
            if text is None:
                raise TaskError("extra_info.task is empty")
            record = json.loads(text) if isinstance(text, str) else text
            tasks.append(task_from_dict(record))
        except json.JSONDecodeError as exc:
            raise TaskError(f"{path} row {i}: extra_info.task is not valid JSON ({exc.msg})") from None
        except (TaskError, TypeError) as exc:
            raise TaskError(f"{path} row {i}: {exc}") from None
    return TaskSet(tasks=tuple(tasks), source=f"verl-{path.stem}")
