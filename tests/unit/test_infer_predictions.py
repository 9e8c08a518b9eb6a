"""jobs.infer.write_predictions: every task's answer is written whatever its kind (a kind with no
evaluator format of its own loses nothing), and each kind with one gets its evaluator's files."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

from jobs.infer import InferConfig, TaskSource, write_predictions


def test_every_kind_keeps_its_answers_and_known_kinds_get_their_evaluator_files(tmp_path):
    tasks = [NS(task_id="q1", kind="text2sql", gold_sql="SELECT 1", db_id="shop"),
             NS(task_id="e1", kind="explain", db_id="shop"),  # a kind no evaluator format knows
             NS(task_id="q2", kind="text2sql", gold_sql="SELECT  2", db_id="zoo")]
    cfg = InferConfig(tasks=TaskSource(db_root="DBS"))
    commands = write_predictions(tmp_path, tasks, ["SELECT 1", "SELECT 'why'", None], cfg)
    rows = [json.loads(x) for x in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert rows == [{"task_id": "q1", "kind": "text2sql", "sql": "SELECT 1"},
                    {"task_id": "e1", "kind": "explain", "sql": "SELECT 'why'"},
                    {"task_id": "q2", "kind": "text2sql", "sql": None}]
    assert (tmp_path / "gold.sql").read_text() == "SELECT 1\tshop\nSELECT 2\tzoo\n"
    assert len((tmp_path / "pred.sql").read_text().splitlines()) == 2  # the text-to-SQL tasks only
    assert commands == [f"python -m jobs.evaluate spider --gold {tmp_path}/gold.sql --pred {tmp_path}/pred.sql --db DBS"]
    assert not (tmp_path / "pred_critic.jsonl").exists()
