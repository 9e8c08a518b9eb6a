"""Task types: the two built-in kinds of work an SQL agent is trained and evaluated on (what
each kind means to prompts, rewards, verl and the teacher: ``sqlrl.tasks.kinds``).

- ``Text2SQLTask``: a natural-language question (+ optional evidence) over one database; the
  answer is judged by execution against ``gold_sql`` (Spider / BIRD semantics).
- ``CriticTask``: a SQL-debugging instance in the **BIRD-CRITIC instance format** (field names as
  in BIRD-CRITIC's JSONL): the user's problem, the buggy ``issue_sql``, ``preprocess_sql`` that sets
  the scene, ``clean_up_sql`` run afterwards, reference ``sol_sql``, and ``test_cases`` -- Python
  source of ``test_case(pred_sqls, sol_sqls, db_path, conn, conditions)``; an empty list means "the
  default test case" (compare results as a set, or in order when ``conditions["order"]``).

Guarantees:
- Both are frozen dataclasses of plain values (str, int, tuple, a dict of JSON values for
  ``conditions``/``meta``): picklable, safe across Ray actor boundaries.
- ``to_dict``/``from_dict`` round-trip exactly; ``CriticTask.to_dict`` writes BIRD-CRITIC's own
  keys, so files we write are read by BIRD-CRITIC tooling and theirs by us. Unknown keys in an
  input record are kept in ``meta`` rather than dropped.
- Construction validates: empty ids, unknown dialects or difficulties raise ``TaskError`` naming
  the field, so a bad record fails at load time with its line number, not mid-training.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar, Union

DIFFICULTIES = ("simple", "moderate", "challenging")
# Names other datasets use for the same difficulty levels (Spider hardness, BIRD-CRITIC levels).
_DIFFICULTY_ALIASES = {"easy": "simple", "medium": "moderate", "hard": "challenging",
                       "extra": "challenging", "extra hard": "challenging"}


class TaskError(ValueError):
    """A task record is malformed; the message names the field (and the line, from the loaders)."""


@lru_cache(maxsize=None)
def _engines() -> Any:
    """The dialect registry (``sqlrl.db.dialects.descriptor``), imported on first use: importing
    ``sqlrl.db`` costs more than these types need until a dialect is named."""
    return importlib.import_module("sqlrl.db.dialects.descriptor")


def norm_dialect(value: str) -> str:
    """The registered engine named or aliased ``value`` (``sqlrl.db.dialects.engines``), by its
    name; ``TaskError`` for any other text."""
    engine = _engines().find(value)
    if engine is None:
        raise TaskError(f"dialect {value!r} is not one of {', '.join(_engines().names())}")
    return engine.name


def __getattr__(name: str) -> Any:  # ``DIALECTS``: the registered engines' names, read live
    if name == "DIALECTS":
        return _engines().names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def norm_difficulty(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    d = _DIFFICULTY_ALIASES.get(str(value).strip().lower(), str(value).strip().lower())
    if d not in DIFFICULTIES:
        raise TaskError(f"difficulty {value!r} is not one of {', '.join(DIFFICULTIES)} "
                        f"(or {', '.join(_DIFFICULTY_ALIASES)})")
    return d


def str_tuple(name: str, value: Any) -> tuple[str, ...]:
    """``value`` (None, a string or a list of strings) as a tuple; else ``TaskError``."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TaskError(f"{name} must be a string or a list of strings, got {type(value).__name__}")
    return tuple(value)


def require_text(name: str, value: Any) -> None:
    """``TaskError`` unless ``value`` is a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True)
class Text2SQLTask:
    """Answer ``question`` with one SQL query on database ``db_id`` in ``dialect``."""

    kind: ClassVar[str] = "text2sql"
    task_id: str
    db_id: str
    question: str
    gold_sql: str
    dialect: str = "sqlite"
    evidence: str = ""
    difficulty: str | None = None
    source: str = ""  # "spider-dev", "bird-minidev", "synthetic/shop", ...
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("task_id", "db_id", "question", "gold_sql"):
            require_text(name, getattr(self, name))
        object.__setattr__(self, "dialect", norm_dialect(self.dialect))
        object.__setattr__(self, "difficulty", norm_difficulty(self.difficulty))

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "db_id": self.db_id, "dialect": self.dialect,
                "question": self.question, "evidence": self.evidence, "SQL": self.gold_sql,
                "difficulty": self.difficulty, "source": self.source, **self.meta}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Text2SQLTask":
        d = dict(d)
        gold = d.pop("SQL", None) or d.pop("gold_sql", None) or d.pop("query", None)
        known = {k: d.pop(k) for k in ("task_id", "db_id", "question", "dialect", "evidence",
                                       "difficulty", "source") if k in d}
        if "task_id" not in known and "question_id" in d:
            known["task_id"] = str(d["question_id"])
        if "task_id" in known:
            known["task_id"] = str(known["task_id"])
        return cls(gold_sql=gold, meta=d, **known)


@dataclass(frozen=True)
class CriticTask:
    """A BIRD-CRITIC-format debugging instance. ``query`` is the user's problem statement."""

    kind: ClassVar[str] = "critic"
    instance_id: str
    db_id: str
    query: str
    issue_sql: tuple[str, ...]
    sol_sql: tuple[str, ...]
    dialect: str = "sqlite"
    preprocess_sql: tuple[str, ...] = ()
    clean_up_sql: tuple[str, ...] = ()
    test_cases: tuple[str, ...] = ()  # Python sources; () = the default test case
    conditions: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    difficulty: str | None = None
    category: str = "Query"  # BIRD-CRITIC: Query / Management / Personalization / Efficiency
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("instance_id", "db_id", "query"):
            require_text(name, getattr(self, name))
        for name in ("issue_sql", "sol_sql", "preprocess_sql", "clean_up_sql", "test_cases"):
            object.__setattr__(self, name, str_tuple(name, getattr(self, name)))
        if not self.issue_sql:
            raise TaskError("issue_sql must hold at least one statement")
        if not self.sol_sql:
            raise TaskError("sol_sql must hold at least one statement")
        if not isinstance(self.conditions, dict):
            raise TaskError(f"conditions must be an object, got {type(self.conditions).__name__}")
        object.__setattr__(self, "dialect", norm_dialect(self.dialect))
        object.__setattr__(self, "difficulty", norm_difficulty(self.difficulty))

    @property
    def task_id(self) -> str:
        return self.instance_id

    @property
    def order_matters(self) -> bool:
        return bool(self.conditions.get("order", False))

    def to_dict(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "db_id": self.db_id, "dialect": self.dialect,
                "query": self.query, "issue_sql": list(self.issue_sql),
                "preprocess_sql": list(self.preprocess_sql), "clean_up_sql": list(self.clean_up_sql),
                "sol_sql": list(self.sol_sql), "test_cases": list(self.test_cases),
                "conditions": dict(self.conditions), "difficulty": self.difficulty,
                "category": self.category, "source": self.source, **self.meta}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CriticTask":
        d = dict(d)
        known = {k: d.pop(k) for k in ("instance_id", "db_id", "query", "issue_sql", "sol_sql",
                                       "dialect", "preprocess_sql", "clean_up_sql", "test_cases",
                                       "conditions", "difficulty", "category", "source") if k in d}
        if "instance_id" in known:
            known["instance_id"] = str(known["instance_id"])
        if known.get("conditions") is None:
            known.pop("conditions", None)
        if known.get("difficulty") is None:
            known.pop("difficulty", None)
        return cls(meta=d, **known)


Task = Union[Text2SQLTask, CriticTask]

