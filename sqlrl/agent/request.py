"""Unlabelled agent requests: what a user gives an SQL agent, with no gold answer.

The agent loop needs, of the work it runs, only ``task_id``, ``db_id``, ``dialect``, ``kind`` and
the user-visible fields the prompt shows (``sqlrl.agent.prompts``). Labelled tasks
(``sqlrl.tasks.types``) carry those *and* a gold answer; the requests here carry only those, so a
served model (``serve/``) runs the very same loop without inventing a gold SQL.

- ``GenerateRequest`` (kind ``"text2sql"``, Zeno): a question (+ optional evidence).
- ``DebugRequest`` (kind ``"critic"``, Talon): a problem statement and the issue SQL.
- ``request_from_task(task)``: the unlabelled view of a labelled task (gold, tests, meta dropped),
  made by the request class its kind names (``sqlrl.tasks.kinds.TaskKind.request``: a new task
  kind brings its own request class with ``from_task``).

Guarantees:
- Frozen dataclasses of plain values (picklable, safe across Ray boundaries).
- Construction validates like the tasks do: empty ids/question/issue SQL and unknown dialects
  raise ``TaskError`` naming the field; ``dialect`` is normalised (``postgres`` -> ``postgresql``).
- ``schema`` (optional ``DatabaseSchema``) overrides the schema the agent would otherwise show for
  ``db_id``; ``preprocess_sql`` runs inside the request's own session before the first turn.
- A request's prompt is exactly the prompt of the corresponding task (``build_messages``), so a
  model trained on tasks sees the same text when served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Union

from sqlrl.tasks.kinds import kind_of
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tasks.types import (CriticTask, Task, TaskError, Text2SQLTask, norm_dialect,
                               require_text, str_tuple)


def _sql_tuple(name: str, value: Any) -> tuple[str, ...]:
    return tuple(v for v in str_tuple(name, value) if v.strip())


class _Request:
    """What every request shares: its task id is its request id; ids and the given texts must be
    non-empty, ``dialect`` is normalised, ``preprocess_sql`` becomes a tuple of statements."""

    @property
    def task_id(self) -> str:
        return self.request_id  # type: ignore[attr-defined]

    def _check(self, *texts: str) -> None:
        for name in ("request_id", "db_id", *texts):
            require_text(name, getattr(self, name))
        object.__setattr__(self, "dialect", norm_dialect(self.dialect))  # type: ignore[attr-defined]
        object.__setattr__(self, "preprocess_sql",
                           _sql_tuple("preprocess_sql", self.preprocess_sql))  # type: ignore[attr-defined]


@dataclass(frozen=True)
class GenerateRequest(_Request):
    """Write SQL that answers ``question`` on database ``db_id`` (no gold answer)."""

    kind: ClassVar[str] = "text2sql"
    request_id: str
    db_id: str
    question: str
    dialect: str = "sqlite"
    evidence: str = ""
    preprocess_sql: tuple[str, ...] = ()
    schema: DatabaseSchema | None = None

    def __post_init__(self) -> None:
        self._check("question")
        if not isinstance(self.evidence, str):
            raise TaskError("evidence must be a string")

    @classmethod
    def from_task(cls, task: Text2SQLTask) -> "GenerateRequest":
        return cls(request_id=task.task_id, db_id=task.db_id, question=task.question,
                   dialect=task.dialect, evidence=task.evidence)


@dataclass(frozen=True)
class DebugRequest(_Request):
    """Fix ``issue_sql`` so that it does what ``query`` (the problem statement) asks."""

    kind: ClassVar[str] = "critic"
    request_id: str
    db_id: str
    query: str
    issue_sql: tuple[str, ...]
    dialect: str = "sqlite"
    preprocess_sql: tuple[str, ...] = ()
    schema: DatabaseSchema | None = None

    def __post_init__(self) -> None:
        self._check("query")
        object.__setattr__(self, "issue_sql", _sql_tuple("issue_sql", self.issue_sql))
        if not self.issue_sql:
            raise TaskError("issue_sql must hold at least one statement")

    @classmethod
    def from_task(cls, task: CriticTask) -> "DebugRequest":
        return cls(request_id=task.instance_id, db_id=task.db_id, query=task.query,
                   issue_sql=task.issue_sql, dialect=task.dialect,
                   preprocess_sql=task.preprocess_sql)


AgentRequest = Union[GenerateRequest, DebugRequest]


def request_from_task(task: Task) -> AgentRequest:
    """The unlabelled request a labelled task poses (its gold answer and tests are left out):
    ``from_task`` of its kind's request class (``TaskKind.request``)."""
    kind = kind_of(task)
    if not isinstance(task, kind.task_type):  # a request, or another object that says its kind
        raise TypeError(f"not a task: {type(task).__name__}")
    return kind.request_type().from_task(task)
