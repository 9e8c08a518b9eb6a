"""Adding an engine is one adapter + one descriptor: a test-only engine, "fakesql", exists only
inside this module (its adapter class below, its ``Dialect`` registered by a fixture) and every
layer that names dialects takes it with no other edit: URLs, task records, sessions, statement
splitting, schema introspection and rendering, prompts, result comparison, the judge, BIRD
labelling, bug injection, BIRD-CRITIC test cases, loaders' database folders and file names,
solution fences, the serve command and the pool's parallel calls. (Its storage is SQLite's, so
it runs here; what is tested is that nothing outside ``sqlrl/db/dialects/`` had to learn its
name.)"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from sqlrl.agent.prompts import build_messages
from sqlrl.db import open_session
from sqlrl.db.dialects import get_dialect, register_dialect
from sqlrl.db.dialects.descriptor import dialect_of, find, names, registered
from sqlrl.db.dialects.engines import SQLITE
from sqlrl.db.dialects.sqlite import SQLiteDialect
from sqlrl.db.statements import split_statements
from sqlrl.db.url import dialect_name, parse_url
from sqlrl.eval.bird import label_bird, statement_rule
from sqlrl.eval.compare import outer_order_by
from sqlrl.eval.critic import run_critic
from sqlrl.rewards.judge import Judge
from sqlrl.tasks.schema import ColumnSchema, DatabaseSchema, TableSchema, quote_identifier
from sqlrl.synth.bugs import BUGS, applicable, parse_sql, schema_from_url, sqlglot_dialect
from sqlrl.tasks.types import CriticTask, TaskError, Text2SQLTask, norm_dialect


@register_dialect("fakesql")
class FakeSQLDialect(SQLiteDialect):
    """The test engine's adapter: SQLite's behaviour under another name."""

    name = "fakesql"


FAKESQL = replace(SQLITE, name="fakesql", display_name="FakeSQL", aliases=("fake", "fake-sql"),
                  adapter=__name__, quotes=("[", "]"), reserved_words=frozenset({"WIDGET"}))


@pytest.fixture
def fakesql():
    with registered(FAKESQL) as engine:
        yield engine
    assert find("fakesql") is None and "fakesql" not in names()


@pytest.fixture
def fake_url(demo_db_path: str) -> str:
    return f"fakesql:///{demo_db_path}"


def test_the_engine_exists_only_while_registered(fakesql) -> None:
    assert names()[-1] == "fakesql" and dialect_of("FAKE") is fakesql
    assert norm_dialect(" Fake-SQL ") == "fakesql"
    assert dialect_name(parse_url("fake:///x.db")) == "fakesql"
    assert isinstance(get_dialect("fakesql"), FakeSQLDialect)


def test_unregistered_it_is_an_unknown_dialect() -> None:
    with pytest.raises(TaskError, match="fakesql"):
        norm_dialect("fakesql")
    with pytest.raises(ValueError, match="unknown dialect"):
        sqlglot_dialect("fakesql")


def test_registering_a_name_or_alias_twice_is_refused(fakesql) -> None:
    with pytest.raises(ValueError, match="clashes"):
        with registered(replace(SQLITE, name="other", aliases=("fake",))):
            pass


def test_sessions_and_statements(fakesql, fake_url: str) -> None:
    with open_session(fake_url) as s:
        r = s.execute("CREATE TEMP TABLE t(x); INSERT INTO t VALUES (1), (2); SELECT sum(x) FROM t")
        assert r.ok and r.rows == ((3,),)
        assert s.execute("SELECT count(*) FROM products").rows[0][0] > 0
    assert split_statements("SELECT ';'; SELECT 2", fakesql.sqlglot) == ["SELECT ';'", "SELECT 2"]


def test_schema_introspection_and_rendering(fakesql, fake_url: str) -> None:
    schema = DatabaseSchema.from_url(fake_url)
    assert schema.db_id == "shop" and "delivered_orders" in schema.table_names
    assert schema.table("products").column("price") == ColumnSchema("price", "REAL", not_null=True)
    odd = TableSchema("order", (ColumnSchema("widget", "INTEGER"), ColumnSchema("a]b", "TEXT")))
    assert odd.to_create_sql("fake") == "CREATE TABLE [order] (\n  [widget] INTEGER,\n  [a]]b] TEXT\n);"
    assert quote_identifier("widget", "sqlite") == "widget"  # the built-ins are untouched


def test_prompts_name_the_engine_and_render_its_schema(fakesql, fake_url: str) -> None:
    task = Text2SQLTask(task_id="q1", db_id="shop", question="How many products?",
                        gold_sql="SELECT count(*) FROM products", dialect="fake")
    assert task.dialect == "fakesql"
    schema = DatabaseSchema.from_url(fake_url)
    schema = replace(schema, tables=(*schema.tables, TableSchema("order", (ColumnSchema("id"),))))
    system = build_messages(task, schema)[0]["content"]
    assert "You are an expert FakeSQL database engineer" in system
    assert "Write SQL for FakeSQL only." in system
    assert "CREATE TABLE order_items (" in system and "CREATE TABLE [order] (" in system
    compact = schema.to_compact("fakesql")
    assert "\norder_items(" in compact and "\n[order](id)" in compact  # reserved word quoted the engine's way


def test_judging_and_comparison(fakesql, fake_url: str) -> None:
    assert outer_order_by("SELECT name FROM products ORDER BY name", "fakesql")
    task = Text2SQLTask(task_id="q1", db_id="shop", question="Names of products?",
                        gold_sql="SELECT name FROM products ORDER BY name", dialect="fakesql")
    judge = Judge({"shop": {"fakesql": fake_url}})
    right = judge.text2sql(task, "SELECT name FROM products ORDER BY 1")
    wrong = judge.text2sql(task, "SELECT name FROM products ORDER BY name DESC")
    assert right.spider_match and right.bird_match
    assert not wrong.spider_match and wrong.bird_match  # same set, wrong order


def test_bird_labelling_on_its_files(fakesql, demo_db_path: str, tmp_path: Path) -> None:
    (tmp_path / "shop").mkdir()
    shutil.copyfile(demo_db_path, tmp_path / "shop" / "shop.sqlite")
    assert statement_rule("fakesql")("SELECT 1; SELECT 2") is not None  # SQLite's driver rule
    verdicts = label_bird([("shop", "SELECT count(*) FROM orders", "SELECT count(order_id) FROM orders"),
                           ("shop", "SELECT count(*) FROM orders", "SELECT 0")], tmp_path, "fake")
    assert [v.match for v in verdicts] == [True, False]


def test_bug_injection(fakesql, fake_url: str) -> None:
    assert sqlglot_dialect("fakesql") == "sqlite"
    info = schema_from_url(fake_url)
    assert info.dialect == "fakesql" and info.table("PRODUCTS") == "products"
    expr = parse_sql("SELECT name FROM products WHERE price > 10 ORDER BY name", "fakesql")
    mutations = applicable(expr, info, random.Random(0), [n for n in BUGS if n != "wrong_dialect"])
    assert mutations and all(m.issue_sql for m in mutations.values())


def test_critic_test_cases(fakesql, fake_url: str) -> None:
    task = CriticTask(instance_id="c1", db_id="shop", query="Count the products.",
                      issue_sql=("SELECT count(*) FROM product",),
                      sol_sql=("SELECT count(*) FROM products",), dialect="fakesql")
    assert run_critic(task, ["SELECT count(product_id) FROM products"], fake_url).solved
    assert not run_critic(task, ["SELECT 0"], fake_url).solved


def test_its_files_names_and_fences(fakesql, demo_db_path: str, tmp_path: Path) -> None:
    from jobs.main import serve_command
    from sqlrl.db.lease import Lease
    from sqlrl.db.shard import _on_server
    from sqlrl.eval.critic_eval import resolve_url
    from sqlrl.rewards.parse import extract_single
    from sqlrl.tasks.loaders import load_bird, load_critic

    (tmp_path / "db" / "shop").mkdir(parents=True)
    shutil.copyfile(demo_db_path, tmp_path / "db" / "shop" / "shop.sqlite")
    questions = tmp_path / "mini_dev_fake.json"  # the engine named by an alias in the file name
    questions.write_text('[{"question_id": 1, "db_id": "shop", "question": "Q?", "SQL": "SELECT 1"},'
                         ' {"question_id": 2, "db_id": "gone", "question": "Q?", "SQL": "SELECT 1"}]')
    bird = load_bird(questions, tmp_path / "db")
    assert [t.dialect for t in bird.tasks] == ["fakesql"] and bird.skipped == {"gone": 1}
    task = CriticTask(instance_id="c1", db_id="shop", query="Count.", issue_sql=("SELECT 0",),
                      sol_sql=("SELECT count(*) FROM products",), dialect="fake")
    (tmp_path / "c.jsonl").write_text(json.dumps(task.to_dict()) + "\n")
    assert load_critic(tmp_path / "c.jsonl", db_root=tmp_path / "db").tasks == (task,)  # a file db
    url = resolve_url(task, None, tmp_path / "db")
    assert url.startswith("fakesql:///") and url.endswith("shop.sqlite")
    assert serve_command(Path("m"), {"shop": {"postgresql": "postgresql://h/shop", "fakesql": url}}
                         ).endswith(f"--database shop={url}")
    lease = Lease("l", "s", "i", "w", "shop", "fakesql", 0.0, 1.0)
    assert not _on_server(lease) and _on_server(replace(lease, dialect="postgresql"))  # file: CPU here
    fenced = extract_single("<thought>t</thought><solution>```FakeSQL\nSELECT 1\n```</solution>")
    assert fenced.sql == "SELECT 1"
