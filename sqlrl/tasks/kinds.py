"""Task kinds: everything sqlrl does differently per kind of task, as one frozen value per kind,
and the registry every layer reads it from.

    from sqlrl.tasks.kinds import kind_of
    k = kind_of(task)                   # a task or a request -> TaskKind(name="critic", ...)
    k.user_prompt(task), k.reference(task), k.judge(judge, task, sql), k.rewards["agentic"]

The built-in kinds (``text2sql``, ``critic``) are declared at the end of this module. **Adding a
kind** = its task class (a frozen dataclass with ``kind``, ``task_id``, ``db_id``, ``dialect``,
``source``, ``to_dict``/``from_dict``), its unlabelled request
class (``from_task``; the agent loop and serve take it) and one ``register(TaskKind(...))``.
Task records (``task_from_dict``, so every loader and JSONL file), prompts (``agent.prompts``),
unlabelled requests (``agent.request``), rewards (``rewards.registry``: what judges it, which
rewards score it, where a hybrid reward routes it), verl parquet (``tasks.loaders.verl``), the
programmatic teacher and the curriculum's data checks read it; tests/unit/test_fake_task_kind.py
registers a test-only kind and runs those paths with nothing else edited, and
tests/unit/test_task_kind_registry.py fails on an ``isinstance`` test of a built-in task class
outside this module.

**The public payload** (``TaskKind.payload``: ``PayloadField``s) is what a client that fetches its
own work is shown of a task -- the training gateway's claim (``sqlrl.gateway.contract.task_payload``,
docs/gateway.md): each field is read from the kind's *unlabelled request* (``TaskKind.request``),
never from the task, so no gold answer, test case or ``meta`` can reach a client; the gateway adds
the fields every kind shares (``PAYLOAD_COMMON``). A new kind declares its payload here and needs no
gateway edit.

Guarantees:
- Importing this module imports nothing of sqlrl but ``sqlrl.tasks.types``; the callables here
  reach judges and requests only through their arguments (duck typing) or by module name.
- Names are unique (``register`` replaces a kind of the same name); ``kinds()`` keeps
  registration order (the built-ins first).
- ``register`` refuses (``TaskKindError``, naming each gap) a kind whose task class lacks what the
  layers read of it (``check_kind``): never an ``AttributeError`` in a loader or a rollout.
- ``kind_of`` raises ``TypeError`` for anything that is not a task or request of a registered
  kind; ``kind_of_record`` raises ``TaskError`` naming what each kind's records must hold.
"""

from __future__ import annotations

import importlib
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from .types import CriticTask, TaskError, Text2SQLTask

__all__ = ["PAYLOAD_COMMON", "PayloadField", "TaskKind", "TaskKindError", "check_kind", "kind_of", "kind_of_record", "kinds", "get_kind", "register",
           "registered", "unregister", "task_from_dict", "joined_sql"]


def _nothing(task: Any) -> tuple[str, ...]:
    return ()


# The claim payload's fields every kind has (sqlrl.gateway.contract.task_payload): a kind's own
# ``PayloadField`` names must differ from these.
PAYLOAD_COMMON = ("kind", "task_id", "database", "dialect", "schema", "job", "prompt")
PAYLOAD_TYPES = (str, list)  # a payload value's JSON type: a string, or a list of strings


@dataclass(frozen=True)
class PayloadField:
    """One field of a kind's public payload: ``name`` as JSON shows it, its JSON ``type`` (``str``,
    or ``list``: a list of strings), what it means (``doc``, for the docs), and ``read``: the value
    from the kind's unlabelled request (a tuple for a list)."""

    name: str
    type: type
    doc: str
    read: Callable[[Any], Any]

    def __post_init__(self) -> None:
        if not self.name or self.name in PAYLOAD_COMMON:
            raise ValueError(f"payload field {self.name!r}: a name, not one of {', '.join(PAYLOAD_COMMON)}")
        if self.type not in PAYLOAD_TYPES:
            raise ValueError(f"payload field {self.name!r}: type must be str or list, got {self.type!r}")

    def value(self, request: Any) -> Any:
        """The field's JSON value for ``request``; ``TypeError`` when ``read`` gives another type."""
        v = self.read(request)
        if self.type is list and isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
            return list(v)
        if self.type is str and isinstance(v, str):
            return v
        raise TypeError(f"payload field {self.name!r} must be a {'list of strings' if self.type is list else 'string'}, "
                        f"got {type(v).__name__}")


@dataclass(frozen=True, eq=False)
class TaskKind:
    """One kind of task. Every callable takes the task (or, for the prompt parts, a request of
    the kind: the same user-visible fields) and is pure."""

    name: str  # ``Task.kind``: task records, verl's ``extra_info.task_kind``, task mixtures
    title: str  # how an error names a record of the kind ("a BIRD-CRITIC instance")
    task_type: type  # the labelled task class
    marks: tuple[str, ...]  # a raw record holding any of these keys is of this kind
    request: str  # "module:Class" of the unlabelled request (``Class.from_task(task)``)
    job: str  # the system prompt's "Your job: ..." (agent.prompts)
    user_prompt: Callable[[Any], str]  # the user message of the agent's prompt
    verl_prompt: Callable[[Any], list[str]]  # the problem paragraphs of verl's plain prompt
    problem: Callable[[Any], str]  # what the user asks, as text (the teacher's thoughts)
    reference: Callable[[Any], str]  # the reference answer as one SQL text
    ground_truth: Callable[[Any], str]  # verl's ``reward_model.ground_truth``
    judge: Callable[[Any, Any, Any], Any]  # (Judge, task, predicted SQL) -> verdict
    check_reference: Callable[[Any, Any], tuple[bool, str, str]]  # (Judge, task) -> (ok, reason,
    #                                    detail): does the task's own reference pass its check
    rewards: Mapping[str, str]  # response shape ("single", "agentic") -> the reward a hybrid
    #                             reward routes the kind to (rewards.registry.REWARDS)
    scored_as: str = ""  # the ``RewardSpec.task_kind`` of the rewards that score it (default: name)
    given_sql: Callable[[Any], tuple[str, ...]] = field(default=_nothing)  # SQL the user hands
    #                                    over to be fixed (none: the answer is written from scratch)
    scene_sql: Callable[[Any], tuple[str, ...]] = field(default=_nothing)  # SQL run in a trajectory's
    #                                    own session before its first turn (a debugging task's scene)
    payload: tuple[PayloadField, ...] = ()  # what a client fetching its own work is shown (module docstring)

    def __post_init__(self) -> None:
        if not self.scored_as:
            object.__setattr__(self, "scored_as", self.name)
        names = [f.name for f in self.payload]
        if len(set(names)) != len(names):
            raise ValueError(f"task kind {self.name!r}: payload field names repeat: {names}")

    def request_type(self) -> type:
        """The unlabelled request class (imported on first use: requests live in sqlrl.agent)."""
        module, cls = self.request.split(":")
        return getattr(importlib.import_module(module), cls)

    def is_record(self, record: Mapping[str, Any]) -> bool:
        return any(key in record for key in self.marks)


_REGISTRY: dict[str, TaskKind] = {}

# What every layer reads off a kind's task class (module docstring: "Adding a kind").
TASK_MEMBERS = ("task_id", "db_id", "dialect", "source")
TASK_METHODS = ("to_dict", "from_dict")
RESPONSE_SHAPES = ("single", "agentic")  # the keys of ``TaskKind.rewards``


class TaskKindError(TypeError):
    """A task kind that lacks what every layer reads of it (raised at registration, naming it)."""


def _has_member(cls: type, name: str) -> bool:
    """``cls`` has ``name`` as a dataclass field, a class attribute or a property."""
    fields = getattr(cls, "__dataclass_fields__", {})
    return name in fields or hasattr(cls, name)


def check_kind(kind: TaskKind) -> TaskKind:
    """``kind`` when its task class and settings hold the contract; else ``TaskKindError`` naming
    every gap: the task class's ``kind`` (a class attribute equal to the kind's name), its
    ``task_id``/``db_id``/``dialect``/``source``, its ``to_dict``/``from_dict``; marks to
    recognise its records; ``request`` as ``"module:Class"``; ``rewards`` for both response shapes.
    The request class is not imported here (it lives in a higher layer): the conformance suite
    (tests/conformance/test_task_kinds.py) holds it and the rewards' names to the registries."""
    cls, problems = kind.task_type, []
    if not isinstance(cls, type):
        raise TaskKindError(f"task kind {kind.name!r}: task_type must be a class, got {cls!r}")
    if getattr(cls, "kind", None) != kind.name:
        problems.append(f"{cls.__name__}.kind must be the class attribute {kind.name!r} "
                        f"(got {getattr(cls, 'kind', None)!r})")
    missing = [m for m in TASK_MEMBERS if not _has_member(cls, m)]
    if missing:
        problems.append(f"{cls.__name__} lacks {', '.join(missing)}")
    missing = [m for m in TASK_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        problems.append(f"{cls.__name__} lacks {', '.join(m + '()' for m in missing)}")
    if not kind.marks or not all(isinstance(m, str) and m for m in kind.marks):
        problems.append("marks must name the record keys that make a record of the kind")
    if kind.request.count(":") != 1 or not all(kind.request.split(":")):
        problems.append(f"request must be 'module:Class' (the unlabelled request class), got {kind.request!r}")
    if set(kind.rewards) != set(RESPONSE_SHAPES) or not all(isinstance(v, str) and v for v in kind.rewards.values()):
        problems.append(f"rewards must name a reward for each response shape {list(RESPONSE_SHAPES)}, "
                        f"got {dict(kind.rewards)!r}")
    if problems:
        raise TaskKindError(f"task kind {kind.name!r} cannot register: " + "; ".join(problems))
    return kind


def register(kind: TaskKind) -> TaskKind:
    """Add ``kind`` (replacing one of the same name) once ``check_kind`` passes it."""
    _REGISTRY[check_kind(kind).name] = kind
    return kind


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


@contextmanager
def registered(kind: TaskKind) -> Iterator[TaskKind]:
    """``with registered(TaskKind(...)):`` the kind exists inside the block only; the registry
    is as it was after it (a kind it replaced by name back in its place)."""
    saved = dict(_REGISTRY)
    try:
        yield register(kind)
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(saved)


def kinds() -> tuple[TaskKind, ...]:
    return tuple(_REGISTRY.values())


def get_kind(name: str) -> TaskKind:
    """The kind named ``name``; ``KeyError`` naming the known kinds otherwise."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown task kind {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def kind_of(item: Any) -> TaskKind:
    """The kind of a task or request (by its ``kind``); ``TypeError`` for anything else."""
    kind = _REGISTRY.get(getattr(item, "kind", None))  # type: ignore[arg-type]
    if kind is None:
        raise TypeError(f"not a task: {type(item).__name__}")
    return kind


def kind_of_record(record: Mapping[str, Any]) -> TaskKind:
    """The kind a raw record is: the most recently registered kind whose marks it holds (so a new
    kind can claim records that carry its own keys besides a built-in kind's)."""
    for kind in reversed(_REGISTRY.values()):
        if kind.is_record(record):
            return kind
    raise TaskError("record is neither " + " nor ".join(
        f"{k.title} (no {'/'.join(repr(m) for m in k.marks)})" for k in _REGISTRY.values()))


def task_from_dict(record: Mapping[str, Any]) -> Any:
    """The task a raw record holds, of the kind ``kind_of_record`` finds."""
    if not isinstance(record, dict):
        raise TaskError(f"a task record must be a JSON object, got {type(record).__name__}")
    return kind_of_record(record).task_type.from_dict(record)


def joined_sql(statements: Sequence[str]) -> str:
    """Statements as one SQL text: each stripped of its trailing ``;``, joined by ``;\\n``."""
    parts = [s.strip().rstrip(";").strip() for s in statements]
    return ";\n".join(p for p in parts if p)


# -- the built-in kinds ----------------------------------------------------------------------------

def _text2sql_user(task: Any) -> str:
    text = f"Question: {task.question.strip()}"
    if task.evidence.strip():
        text += f"\nEvidence (external knowledge): {task.evidence.strip()}"
    return text + "\n\nWrite one SQL query that answers the question."


def _text2sql_verl(task: Any) -> list[str]:
    parts = ["Question: " + task.question]
    if task.evidence:
        parts.append("Evidence: " + task.evidence)
    return parts + ["Write one SQL query that answers the question."]


def _text2sql_check(judge: Any, task: Text2SQLTask) -> tuple[bool, str, str]:
    v = judge.text2sql(task, task.gold_sql)
    if v.gold_error is not None:
        return False, "gold-error", v.gold_error
    return (True, "ok", "") if v.bird_match else (False, "gold-fails", "gold does not match itself")


TEXT2SQL = register(TaskKind(
    name=Text2SQLTask.kind, title="a text-to-SQL task", task_type=Text2SQLTask,
    marks=("question",), request="sqlrl.agent.request:GenerateRequest",
    job="answer questions with SQL queries", user_prompt=_text2sql_user,
    verl_prompt=_text2sql_verl, problem=lambda t: t.question,
    reference=lambda t: t.gold_sql.strip(), ground_truth=lambda t: t.gold_sql,
    judge=lambda judge, task, sql: judge.text2sql(task, sql), check_reference=_text2sql_check,
    rewards={"single": "bird_ex_single", "agentic": "bird_ex_agentic"},
    payload=(PayloadField("question", str, "the question to answer with SQL", lambda r: r.question),
             PayloadField("evidence", str, "external knowledge the question needs (may be empty)",
                          lambda r: r.evidence))))


def _critic_user(task: Any) -> str:
    issue = "\n\n".join(s.strip() for s in task.issue_sql)
    return (f"{task.query.strip()}\n\nHere is the SQL I have, which does not do what I need:\n"
            f"```sql\n{issue}\n```\n\nGive me SQL that solves my problem.")


def _critic_verl(task: Any) -> list[str]:
    return ["User issue:\n" + task.query,
            "Problematic SQL:\n" + "\n".join(f"```sql\n{s}\n```" for s in task.issue_sql),
            "Fix the SQL so that it solves the user's issue."]


def _critic_check(judge: Any, task: CriticTask) -> tuple[bool, str, str]:
    v = judge.critic(task, list(task.sol_sql))
    if v.sol_error is not None:
        return False, "gold-error", v.sol_error
    return (True, "ok", "") if v.solved else (False, "gold-fails", "sol_sql fails its tests")


CRITIC = register(TaskKind(
    name=CriticTask.kind, title="a BIRD-CRITIC instance", task_type=CriticTask,
    marks=("instance_id", "issue_sql"), request="sqlrl.agent.request:DebugRequest",
    job="fix a user's SQL so that it does what they need", user_prompt=_critic_user,
    verl_prompt=_critic_verl, problem=lambda t: t.query, reference=lambda t: joined_sql(t.sol_sql),
    ground_truth=lambda t: json.dumps(list(t.sol_sql), ensure_ascii=False),
    judge=lambda judge, task, sql: judge.critic(task, sql), check_reference=_critic_check,
    rewards={"single": "critic_single", "agentic": "critic_agentic"},
    given_sql=lambda t: t.issue_sql, scene_sql=lambda t: tuple(t.preprocess_sql),
    payload=(PayloadField("problem", str, "the user's problem statement: what the SQL must do",
                          lambda r: r.query),
             PayloadField("issue_sql", list, "the user's SQL that does not do it, one statement an item "
                          "(the SQL to fix)", lambda r: r.issue_sql))))
