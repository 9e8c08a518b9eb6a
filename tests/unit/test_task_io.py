"""sqlrl.tasks.io: JSONL task files -- round trips, line-numbered errors, atomic writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sqlrl.tasks.io import iter_tasks, read_tasks, write_tasks
from sqlrl.tasks.types import CriticTask, TaskError, Text2SQLTask


def t2s(i: int = 0, **kw) -> Text2SQLTask:
    base = dict(task_id=f"q{i}", db_id="shop", question=f"How many orders? ({i})",
                gold_sql="SELECT count(*) FROM orders", evidence="orders = rows of orders",
                difficulty="moderate", source="unit", meta={"question_id": i, "tags": ["a", "b"]})
    base.update(kw)
    return Text2SQLTask(**base)


def critic(i: int = 0, **kw) -> CriticTask:
    base = dict(instance_id=f"c{i}", db_id="shop", query="My query returns duplicates.",
                issue_sql=("SELECT city FROM customers",), sol_sql=("SELECT DISTINCT city FROM customers",),
                dialect="postgresql", preprocess_sql=("CREATE TEMP TABLE t AS SELECT 1 AS x",),
                clean_up_sql=("DROP TABLE t",), test_cases=("def test_case(p, s, d, c, k):\n    return 1",),
                conditions={"order": True, "distinct": False}, difficulty="challenging",
                category="Query", source="unit", meta={"efficiency": False, "original_schema": "CREATE …"})
    base.update(kw)
    return CriticTask(**base)


def test_both_task_types_round_trip_through_jsonl(tmp_path: Path) -> None:
    tasks = [t2s(0), critic(0), t2s(1, dialect="mysql", difficulty=None), critic(1, conditions={})]
    path = tmp_path / "sub" / "tasks.jsonl"
    assert write_tasks(path, tasks) == 4
    back = read_tasks(path)
    assert back == tasks
    # meta and conditions are not part of ==; compare the full records too
    assert [t.to_dict() for t in back] == [t.to_dict() for t in tasks]
    assert [type(t) for t in back] == [Text2SQLTask, CriticTask, Text2SQLTask, CriticTask]
    assert back[1].order_matters and back[1].preprocess_sql == tasks[1].preprocess_sql
    assert len(path.read_text().splitlines()) == 4


def test_blank_lines_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [json.dumps(t2s(0).to_dict()), "", "   ", json.dumps(critic(0).to_dict()), ""]
    path.write_text("\n".join(lines) + "\n")
    assert [t.task_id for t in iter_tasks(path)] == ["q0", "c0"]


@pytest.mark.parametrize("bad_line, words", [
    ('{"task_id": "x", "db_id": "d", "question": "q", ', ["not valid JSON"]),
    ('[1, 2, 3]', ["JSON object"]),
    ('{"task_id": "x", "db_id": "d", "question": "q"}', ["gold_sql"]),  # no SQL
    ('{"task_id": "x", "db_id": "d", "question": "q", "SQL": "SELECT 1", "dialect": "db2"}',
     ["dialect", "db2"]),
    ('{"task_id": "x", "db_id": "d", "question": "q", "SQL": "SELECT 1", "difficulty": "huge"}',
     ["difficulty"]),
    ('{"instance_id": "c", "db_id": "d", "query": "q", "issue_sql": ["SELECT 1"]}', ["sol_sql"]),
    ('{"instance_id": "c", "db_id": "d", "query": "q", "issue_sql": [1], "sol_sql": ["x"]}',
     ["issue_sql"]),
    ('{"neither": 1}', ["neither a text-to-SQL task"]),
])
def test_a_malformed_line_names_file_and_line(tmp_path: Path, bad_line: str, words: list[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(t2s(0).to_dict()) + "\n\n" + bad_line + "\n")
    with pytest.raises(TaskError) as info:
        read_tasks(path)
    message = str(info.value)
    assert f"{path}:3:" in message
    for w in words:
        assert w in message


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_tasks(tmp_path / "nope.jsonl")


def test_a_failing_write_leaves_the_existing_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    write_tasks(path, [t2s(0), t2s(1)])
    before = path.read_bytes()

    def tasks():
        yield t2s(2)
        yield t2s(3, meta={"score": math.nan})  # not representable in JSON -> ValueError

    with pytest.raises(ValueError):
        write_tasks(path, tasks())
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl"]  # no temp file left

    with pytest.raises(TaskError, match="item 1 is not a task"):
        write_tasks(path, [t2s(4), {"task_id": "raw dict"}])
    assert path.read_bytes() == before


def test_writing_replaces_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    write_tasks(path, [t2s(i) for i in range(5)])
    write_tasks(path, [critic(9)])
    assert read_tasks(path) == [critic(9)]
