"""Prompts: role, dialect, schema, tools or answer format; the user message never leaks answers."""

from __future__ import annotations

import pytest

from sqlrl.agent import build_messages, tools_for
from sqlrl.agent.prompts import PROMPT_RECORD, checkpoint_schema_style, record_schema_style
from sqlrl.agent.parsers import HermesParser
from sqlrl.rewards.parse import extract_single
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tasks.types import CriticTask, Text2SQLTask
from sqlrl.tools import tool_schemas

CRITIC = CriticTask(
    instance_id="c1", db_id="shop", dialect="postgresql",
    query="I want each city's number of customers, but cities without customers vanish.",
    issue_sql=("SELECT city, count(*) FROM customers GROUP BY city",),
    sol_sql=("SELECT SOLUTION_MARKER FROM customers",),
    test_cases=("def test_case(pred_sqls, sol_sqls, db_path, conn, conditions): TESTCASE_MARKER",),
    meta={"bug_description": "BUG_MARKER: the join should be a LEFT JOIN"})
T2S = Text2SQLTask(task_id="t1", db_id="shop", question="How many orders were delivered?",
                   gold_sql="SELECT GOLD_MARKER FROM orders", evidence="delivered means status = 'delivered'")


@pytest.fixture(scope="module")
def shop(demo_db_path) -> DatabaseSchema:
    return DatabaseSchema.from_sqlite(demo_db_path)


def test_agentic_critic_prompt(shop):
    system, user = build_messages(CRITIC, shop, "agentic")
    assert system["role"] == "system" and user["role"] == "user"
    s = system["content"]
    assert "PostgreSQL" in s and "SQLite" not in s
    assert shop.to_create_sql("postgresql") in s and "CREATE TABLE order_items" in s
    assert "execute_sql" in s and "submit_solution" in s and HermesParser.example in s
    assert "exactly ONE tool call" in s
    u = user["content"]
    assert CRITIC.query in u and CRITIC.issue_sql[0] in u
    for secret in ("SOLUTION_MARKER", "TESTCASE_MARKER", "BUG_MARKER", "LEFT JOIN"):
        assert secret not in s + u


def test_text2sql_prompt_has_question_and_evidence_not_gold(shop):
    system, user = build_messages(T2S, shop, "agentic")
    assert "SQLite" in system["content"] and shop.to_create_sql("sqlite") in system["content"]
    assert T2S.question in user["content"] and T2S.evidence in user["content"]
    assert "GOLD_MARKER" not in system["content"] + user["content"]
    no_evidence = Text2SQLTask(task_id="t2", db_id="shop", question="Q?", gold_sql="SELECT 1")
    assert "Evidence" not in build_messages(no_evidence, shop)[1]["content"]


def test_single_turn_prompt_asks_for_the_checked_format(shop):
    system, _ = build_messages(T2S, shop, "single")
    s = system["content"]
    assert "<thought>" in s and "<solution>" in s and "execute_sql" not in s
    # An answer written exactly as the prompt shows passes the strict format check.
    assert extract_single("<thought>count them</thought>\n<solution>SELECT 1</solution>").format_ok


def test_dialect_override_and_missing_schema(shop):
    system, _ = build_messages(T2S, shop, "agentic", dialect="mysql")
    assert "MySQL" in system["content"] and shop.to_create_sql("mysql") in system["content"]
    system, _ = build_messages(T2S, None, "agentic")
    assert "schema is not given; explore it with execute_sql" in system["content"]
    assert "CREATE TABLE" not in system["content"] and "PK" not in system["content"]


def test_compact_schema_keeps_every_table_column_type_and_key(shop):
    text = shop.to_compact("sqlite")
    assert len(text.splitlines()) == len(shop.tables)
    for table, line in zip(shop.tables, text.splitlines()):
        assert line.startswith(f"{table.name}(") and line.endswith(")")
        for col in table.columns:
            assert f"{col.name} {col.type}" in line
        for c in table.primary_key:
            assert f"{c} " in line and "PK" in line
        for fk in table.foreign_keys:
            for c, rc in zip(fk.columns, fk.ref_columns):
                assert f"-> {fk.ref_table}.{rc}" in line
    assert len(text) < 0.75 * len(shop.to_create_sql("sqlite"))


def test_schema_style_is_chosen_by_the_environment_and_checked(shop, monkeypatch):
    monkeypatch.setenv("SQLRL_SCHEMA_STYLE", "compact")
    system = build_messages(T2S, shop, "single")[0]["content"]
    assert shop.to_compact("sqlite") in system and "CREATE TABLE" not in system
    monkeypatch.setenv("SQLRL_SCHEMA_STYLE", "prose")
    with pytest.raises(ValueError, match="SQLRL_SCHEMA_STYLE='prose' is not a schema style; known: compact, create"):
        build_messages(T2S, shop, "single")
    monkeypatch.delenv("SQLRL_SCHEMA_STYLE")
    assert shop.to_create_sql("sqlite") in build_messages(T2S, shop, "single")[0]["content"]


def test_an_explicit_style_wins_over_the_environment(shop, monkeypatch):
    monkeypatch.setenv("SQLRL_SCHEMA_STYLE", "create")
    system = build_messages(T2S, shop, "single", style="compact")[0]["content"]
    assert shop.to_compact("sqlite") in system and "CREATE TABLE" not in system
    with pytest.raises(ValueError, match="schema_style='prose' is not a schema style; known: compact, create"):
        build_messages(T2S, shop, "single", style="prose")


def test_a_checkpoint_records_its_style_and_a_bad_record_is_named(tmp_path):
    assert checkpoint_schema_style(tmp_path) is None  # made before the record existed
    assert checkpoint_schema_style("smollm2-135m") is None  # a model name, not a folder
    record_schema_style(tmp_path, "compact")
    assert checkpoint_schema_style(tmp_path) == "compact"
    with pytest.raises(ValueError, match="not a schema style"):
        record_schema_style(tmp_path, "prose")
    (tmp_path / PROMPT_RECORD).write_text('{"schema_style": "prose"}')
    with pytest.raises(ValueError, match=r"sqlrl_prompt.json: schema_style 'prose' is not a schema style"):
        checkpoint_schema_style(tmp_path)
    (tmp_path / PROMPT_RECORD).write_text("not json")
    with pytest.raises(ValueError, match="not a prompt record"):
        checkpoint_schema_style(tmp_path)


def test_multi_statement_issue_sql_is_shown_whole(shop):
    task = CriticTask(instance_id="c2", db_id="shop", query="Fix it.",
                      issue_sql=("CREATE TEMP TABLE x AS SELECT 1;", "SELECT * FROM x"),
                      sol_sql=("SELECT 1",))
    u = build_messages(task, shop)[1]["content"]
    assert "CREATE TEMP TABLE x AS SELECT 1;\n\nSELECT * FROM x" in u


def test_modes_and_tools():
    assert tools_for("agentic") == tool_schemas() and tools_for("single") is None
    with pytest.raises(ValueError, match="unknown mode 'multi'"):
        build_messages(T2S, None, "multi")
    with pytest.raises(ValueError, match="unknown mode"):
        tools_for("chat")
    assert build_messages(T2S, None) == build_messages(T2S, None)  # deterministic
