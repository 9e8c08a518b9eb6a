"""Adding a task kind is one task class, one request class and one ``TaskKind``: a test-only kind,
"rewrite" (make a working query simpler without changing its result; judged by execution against
a gold query, like text-to-SQL), exists only inside this module (its classes below, its
``TaskKind`` registered by a fixture), and every layer that handles tasks takes it with no other
edit: task records and JSONL loading, prompts and unlabelled requests, rewards (its judge, the
rewards that score it, the hybrid route), the programmatic teacher, the agent loop on real
sessions (stage-2 data), and verl parquet with its reference check (stage-4 data)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from curriculum.builders import build_stage1, build_stage2, build_stage4
from curriculum.teachers import ProgrammaticTeacher, reference_sql
from sqlrl.agent.prompts import build_messages
from sqlrl.agent.request import request_from_task
from sqlrl.rewards import Judge
from sqlrl.rewards.registry import compute
from sqlrl.tasks.io import read_tasks, write_tasks
from sqlrl.tasks.kinds import TaskKind, kind_of, kinds, registered
from sqlrl.tasks.loaders import default_prompt, load_jsonl, load_verl
from sqlrl.tasks.types import TaskError, Text2SQLTask, require_text


@dataclass(frozen=True)
class RewriteRequest:
    """What a user of a served model sends: a working query and how to rewrite it (no answer).
    The kind runs on SQLite only, so ``dialect`` is a class attribute, like ``kind``."""

    kind = "rewrite"
    dialect = "sqlite"
    request_id: str
    db_id: str
    ask: str
    original_sql: str

    @property
    def task_id(self) -> str:
        return self.request_id

    @classmethod
    def from_task(cls, task: "RewriteTask") -> "RewriteRequest":
        return RewriteRequest(task.request_id, task.db_id, task.ask, task.original_sql)


@dataclass(frozen=True)
class RewriteTask(RewriteRequest):
    """The labelled task: the request, and ``gold_sql`` whose result the rewrite must give."""

    gold_sql: str = ""
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("request_id", "db_id", "ask", "original_sql", "gold_sql"):
            require_text(name, getattr(self, name))

    def to_dict(self) -> dict[str, Any]:
        return {"rewrite_id": self.request_id, "db_id": self.db_id, "ask": self.ask,
                "original_sql": self.original_sql, "gold_sql": self.gold_sql,
                "dialect": self.dialect, "source": self.source, **self.meta}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RewriteTask":
        d = dict(d)
        if d.pop("dialect", cls.dialect) != cls.dialect:
            raise TaskError("a rewrite task runs on SQLite")
        known = {k: d.pop(k) for k in ("db_id", "ask", "original_sql", "gold_sql", "source") if k in d}
        return cls(request_id=d.pop("rewrite_id", None), meta=d, **known)


def _user(item: Any) -> str:
    return f"{item.ask}\n\n```sql\n{item.original_sql}\n```\n\nGive me the simpler query."


def _check(judge: Any, task: RewriteTask) -> tuple[bool, str, str]:
    v = judge.text2sql(task, task.gold_sql)
    if v.gold_error is not None:
        return False, "gold-error", v.gold_error
    return (True, "ok", "") if v.bird_match else (False, "gold-fails", "gold does not match itself")


REWRITE = TaskKind(
    name="rewrite", title="a rewrite task", task_type=RewriteTask, marks=("rewrite_id",),
    request=f"{__name__}:RewriteRequest", job="simplify SQL without changing its result",
    user_prompt=_user, verl_prompt=lambda t: ["Simplify:\n" + t.original_sql], problem=lambda t: t.ask,
    reference=lambda t: t.gold_sql.strip(), ground_truth=lambda t: t.gold_sql,
    judge=lambda judge, task, sql: judge.text2sql(task, sql), check_reference=_check,
    rewards={"single": "bird_ex_single", "agentic": "bird_ex_agentic"}, scored_as="text2sql",
    given_sql=lambda t: (t.original_sql,))

ORIGINAL = ("SELECT name FROM customers WHERE customer_id IN "
            "(SELECT customer_id FROM customers WHERE city = 'Lima')")
GOLD = "SELECT name FROM customers WHERE city = 'Lima'"


def rewrite(i: int = 0, gold: str = GOLD) -> RewriteTask:
    return RewriteTask(f"rw{i}", "shop", "This query is needlessly nested. Simplify it.",
                       ORIGINAL, gold_sql=gold, source="test/rewrite")


@pytest.fixture
def kind():
    with registered(REWRITE) as k:
        yield k
    assert "rewrite" not in [k.name for k in kinds()]


@pytest.fixture
def db_root(demo_db_path: str, tmp_path: Path) -> Path:
    root = tmp_path / "databases"
    (root / "shop").mkdir(parents=True)
    shutil.copy(demo_db_path, root / "shop" / "shop.sqlite")
    return root


@pytest.fixture
def judge(db_root: Path) -> Judge:
    return Judge({"shop": {"sqlite": f"sqlite:///{db_root / 'shop' / 'shop.sqlite'}"}})


def test_unregistered_the_kind_is_unknown() -> None:
    with pytest.raises(TaskError, match="neither a text-to-SQL task"):
        read_tasks_from([rewrite().to_dict()])
    with pytest.raises(TypeError, match="not a task: RewriteTask"):
        kind_of(rewrite())


def read_tasks_from(records: list[dict]) -> list[Any]:
    from sqlrl.tasks.kinds import task_from_dict

    return [task_from_dict(r) for r in records]


def test_records_files_and_loaders(kind, db_root: Path, tmp_path: Path) -> None:
    t2s = Text2SQLTask("q1", "shop", "How many customers?", "SELECT count(*) FROM customers")
    write_tasks(tmp_path / "mixed.jsonl", [rewrite(0), t2s, rewrite(1)])
    assert read_tasks(tmp_path / "mixed.jsonl") == [rewrite(0), t2s, rewrite(1)]
    loaded = load_jsonl(tmp_path / "mixed.jsonl", db_root=db_root)
    assert [t.kind for t in loaded.tasks] == ["rewrite", "text2sql", "rewrite"]
    assert set(loaded.catalog) == {"shop"} and "customers" in loaded.schemas["shop"].table_names


def test_prompts_and_requests(kind) -> None:
    task = rewrite()
    system, user = build_messages(task, None, mode="agentic")
    assert "Your job: simplify SQL without changing its result." in system["content"]
    assert user["content"] == _user(task) and GOLD not in user["content"]
    request = request_from_task(task)
    assert request == RewriteRequest("rw0", "shop", task.ask, ORIGINAL)
    assert build_messages(request, None, mode="single") == build_messages(task, None, mode="single")
    assert default_prompt(task)[1]["content"].endswith("Simplify:\n" + ORIGINAL)


def test_rewards_judge_and_route_by_the_kind(kind, judge: Judge) -> None:
    good = f"<thought>the subquery reads the same table</thought><solution>{GOLD}</solution>"
    b = compute("hybrid_single", rewrite(), good, judge)
    assert (b.score, b.parts["is_critic"], b.reason) == (1.0, 0.0, "ok")
    wrong = compute("bird_ex_single", rewrite(), "<thought>t</thought><solution>SELECT 1</solution>", judge)
    assert (wrong.score, wrong.reason) == (0.0, "wrong-result")
    calls = [{"name": "submit_solution", "arguments": {"sql": GOLD}}]
    assert compute("hybrid_agentic", rewrite(), calls, judge).score == 1.0
    with pytest.raises(ValueError, match="scores critic tasks, got a rewrite task"):
        compute("critic_single", rewrite(), good, judge)


def test_the_teacher_and_the_agent_loop_on_real_sessions(kind, judge: Judge, tmp_path: Path) -> None:
    teacher = ProgrammaticTeacher(0)
    assert reference_sql(rewrite()) == GOLD
    plan = teacher.plan(rewrite())  # the debugging flow: the task hands over SQL
    assert plan[0].sql == ORIGINAL and plan[-1].tool == "submit_solution" and plan[-1].sql == GOLD
    rows, report = build_stage1([rewrite()], teacher, tmp_path / "s1.jsonl", judge=judge)
    assert report.kept == 1 and rows[0]["messages"][:2] == build_messages(rewrite(), None, mode="single")
    broken = rewrite(1, gold="SELECT nope FROM nowhere")
    rows, report = build_stage2([rewrite(), broken], teacher, tmp_path / "s2.jsonl", judge=judge)
    assert report.kept == 1 and report.dropped == {"gold-error": 1}
    messages = rows[0]["messages"]
    calls = [c["function"] for m in messages for c in m.get("tool_calls", ())]
    assert calls[0]["arguments"]["sql"] == ORIGINAL and calls[-1]["name"] == "submit_solution"
    observed = [m["content"] for m in messages if m["role"] == "tool"]  # executed on the database
    assert observed[0] == observed[-1] and observed[0].endswith("(8 rows)")  # original == gold


def test_rl_data_checks_the_reference_and_round_trips_through_verl(kind, judge: Judge,
                                                                     tmp_path: Path) -> None:
    broken = rewrite(1, gold="SELECT name FROM customers WHERE city = ")
    kept, report = build_stage4([rewrite(0), broken], tmp_path, judge=judge)
    assert kept == [rewrite(0)] and report.dropped == {"gold-error": 1}
    back = load_verl(tmp_path / "stage4.parquet").tasks
    assert back == (rewrite(0),)
    import pyarrow.parquet as pq

    row = pq.read_table(tmp_path / "stage4.parquet").to_pylist()[0]
    assert row["reward_model"] == {"style": "rule", "ground_truth": GOLD}
    assert row["data_source"] == "test/rewrite" and row["extra_info"]["task_kind"] == "rewrite"
    assert row["prompt"] == build_messages(rewrite(0), None, mode="agentic")
    assert json.loads(row["extra_info"]["task"]) == rewrite(0).to_dict()
