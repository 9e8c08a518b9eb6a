"""Adding an engine is one adapter + one descriptor: a test-only engine, "fakeduck", exists only
inside this module (its adapter class below, its ``Dialect`` registered by a fixture) and every
layer that names dialects takes it with no other edit: URLs, task records, sessions, statement
splitting, schema introspection and rendering, prompts, result comparison, the judge, BIRD
labelling, bug injection, BIRD-CRITIC test cases, loaders' database folders and file names,
solution fences, the serve command and the pool's parallel calls.

It is **not SQLite underneath**: its databases are DuckDB files (``<db_id>/<db_id>.duckdb``, a
``FileCopy`` storage layout of their own), its SQL is DuckDB's (sqlglot's ``duckdb``), its
sandbox is DuckDB's own configuration (no file system, configuration locked) and its time limit
is the watchdog's interrupt alone (``Cancellable``: DuckDB has no statement timeout). So a layer
that took "file-based" to mean "a ``.sqlite`` file" fails here.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot

from sqlrl.agent.prompts import build_messages
from sqlrl.db import ErrorKind, Limits, SessionError, open_session
from sqlrl.db.dialects import get_dialect, register_dialect
from sqlrl.db.dialects.contract import Cancellable, contract_of
from sqlrl.db.dialects.descriptor import (Dialect, FileCopy, dialect_of, find, names, registered)
from sqlrl.db.dialects.engines import SQLITE
from sqlrl.db.statements import split_statements
from sqlrl.db.url import dialect_name, parse_url
from sqlrl.eval.bird import database_url, label_bird, statement_rule
from sqlrl.eval.compare import outer_order_by
from sqlrl.eval.critic import run_critic
from sqlrl.rewards.judge import Judge
from sqlrl.synth.bugs import BUGS, applicable, parse_sql, schema_from_url, sqlglot_dialect
from sqlrl.tasks.schema import ColumnSchema, DatabaseSchema, TableSchema, quote_identifier
from sqlrl.tasks.types import CriticTask, TaskError, Text2SQLTask, norm_dialect


@dataclass
class _Conn:
    db: Any  # the DuckDB connection on this session's private copy
    path: str  # the copy's folder (removed at close)


class _Result:
    """The statement's result on the session's connection (closing it keeps the connection)."""

    def __init__(self, db: Any) -> None:
        self._db, self.description, self.rowcount = db, db.description, db.rowcount

    def fetchmany(self, size: int) -> list[tuple[Any, ...]]:
        return self._db.fetchmany(size)

    def close(self) -> None:
        pass


@register_dialect("fakeduck")
class FakeDuckDialect:
    """The test engine's adapter: a private copy of the DuckDB file per session."""

    isolation = "file-copy"

    def connect(self, url: Any, limits: Limits) -> _Conn:
        base = Path(url.database or "")
        if not base.is_file():
            raise SessionError(f"DuckDB database file not found: {base}")
        folder = tempfile.mkdtemp(prefix="sqlrl-duck-")
        copy = Path(folder) / base.name
        shutil.copyfile(base, copy)
        db = duckdb.connect(str(copy), config={"enable_external_access": False, "threads": 1,
                                               "lock_configuration": True})
        return _Conn(db, folder)

    def begin(self, conn: _Conn, url: Any) -> None:
        return None

    def end(self, conn: _Conn, state: Any) -> bool:
        return False  # the copy goes with the connection

    def run(self, conn: _Conn, state: Any, statement: str, deadline: float) -> _Result:
        conn.db.execute(statement)
        return _Result(conn.db)

    def canceller(self, conn: _Conn) -> Any:
        return conn.db.interrupt  # the only time limit: DuckDB has no statement timeout

    def ping(self, conn: _Conn) -> bool:
        try:
            return conn.db.execute("SELECT 1").fetchone() == (1,)
        except duckdb.Error:
            return False

    def classify(self, exc: BaseException) -> ErrorKind:
        if isinstance(exc, duckdb.InterruptException):
            return ErrorKind.TIMEOUT
        if isinstance(exc, duckdb.ParserException):
            return ErrorKind.SYNTAX
        if isinstance(exc, (duckdb.PermissionException, duckdb.InvalidInputException)):
            return ErrorKind.PERMISSION
        if isinstance(exc, duckdb.ConnectionException):
            return ErrorKind.SESSION_LOST
        return ErrorKind.RUNTIME

    def denied(self, statement: Any) -> str | None:
        return None  # the engine's configuration is the sandbox (no files, settings locked)

    def close(self, conn: _Conn) -> None:
        try:
            conn.db.close()
        finally:
            shutil.rmtree(conn.path, ignore_errors=True)


FAKEDUCK = Dialect(
    name="fakeduck", display_name="FakeDuck", sqlglot="duckdb", adapter=__name__,
    aliases=("fake", "fake-duck"), storage=FileCopy(suffixes=(".duckdb",)),
    reserved_words=frozenset({"WIDGET"}),
    columns_sql=("SELECT table_name, column_name, data_type, is_nullable = 'NO' "
                 "FROM information_schema.columns WHERE table_schema = current_schema() "
                 "ORDER BY table_name, ordinal_position"))


def duckdb_copy(sqlite_path: str, target: Path) -> Path:
    """The SQLite database at ``sqlite_path`` as a DuckDB file at ``target`` (schema transpiled by
    sqlglot, rows copied)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    db = duckdb.connect(str(target))
    try:
        objects = source.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL "
                                 "AND type IN ('table', 'view') ORDER BY rowid").fetchall()
        for kind, name, sql in objects:
            db.execute(sqlglot.transpile(sql, read="sqlite", write="duckdb")[0])
            if kind == "table":
                rows = source.execute(f'SELECT * FROM "{name}"').fetchall()
                if rows:
                    marks = ", ".join("?" * len(rows[0]))
                    db.executemany(f'INSERT INTO "{name}" VALUES ({marks})', rows)
    finally:
        db.close()
        source.close()
    return target


@pytest.fixture
def fakeduck():
    with registered(FAKEDUCK) as engine:
        yield engine
    assert find("fakeduck") is None and "fakeduck" not in names()


@pytest.fixture(scope="module")
def duck_root(demo_db_path: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database folder in the engine's layout: ``<root>/shop/shop.duckdb`` (no .sqlite file)."""
    root = tmp_path_factory.mktemp("duck")
    duckdb_copy(demo_db_path, root / "shop" / "shop.duckdb")
    return root


@pytest.fixture
def fake_url(duck_root: Path) -> str:
    return f"fakeduck:///{duck_root / 'shop' / 'shop.duckdb'}"


def test_the_engine_exists_only_while_registered(fakeduck) -> None:
    assert names()[-1] == "fakeduck" and dialect_of("FAKE") is fakeduck
    assert norm_dialect(" Fake-Duck ") == "fakeduck"
    assert dialect_name(parse_url("fake:///x.duckdb")) == "fakeduck"
    assert isinstance(get_dialect("fakeduck"), FakeDuckDialect)
    assert contract_of(FakeDuckDialect).capabilities == {Cancellable}


def test_unregistered_it_is_an_unknown_dialect() -> None:
    with pytest.raises(TaskError, match="fakeduck"):
        norm_dialect("fakeduck")
    with pytest.raises(ValueError, match="unknown dialect"):
        sqlglot_dialect("fakeduck")


def test_registering_a_name_or_alias_twice_is_refused(fakeduck) -> None:
    with pytest.raises(ValueError, match="clashes"):
        with registered(Dialect(name="other", display_name="O", sqlglot="sqlite", adapter="x",
                                aliases=("fake",), storage=SQLITE.storage)):
            pass


def test_sessions_work_on_a_private_copy(fakeduck, fake_url: str, duck_root: Path) -> None:
    base = duck_root / "shop" / "shop.duckdb"
    before = base.read_bytes()
    with open_session(fake_url) as s:
        r = s.execute("CREATE TEMP TABLE t(x INT); INSERT INTO t VALUES (1), (2); SELECT sum(x) FROM t")
        assert r.ok and r.rows == ((3,),), r.error
        assert s.execute("DELETE FROM order_items").ok
        assert s.execute("SELECT count(*) FROM order_items").rows == ((0,),)
        assert s.execute("SELECT list_value(1, 2)").rows  # DuckDB's SQL, not SQLite's
    with open_session(fake_url) as s:  # the next session sees the base, untouched
        assert s.execute("SELECT count(*) FROM order_items").rows[0][0] > 0
    assert base.read_bytes() == before
    assert split_statements("SELECT ';'; SELECT 2", fakeduck.sqlglot) == ["SELECT ';'", "SELECT 2"]


def test_its_sandbox_and_time_limit_are_the_engines(fakeduck, fake_url: str) -> None:
    with open_session(fake_url, limits=Limits(timeout_s=0.5)) as s:
        for sql in ("SELECT * FROM read_csv('/etc/passwd')", "ATTACH '/tmp/x.duckdb' AS x",
                    "COPY products TO '/tmp/p.csv'", "SET enable_external_access = true"):
            r = s.execute(sql)
            assert r.error is not None and r.error.kind is ErrorKind.PERMISSION, (sql, r.error)
        assert s.execute("BEGIN").error.kind is ErrorKind.PERMISSION  # the common rules
        # no statement timeout in DuckDB: only the watchdog's interrupt stops this
        r = s.execute("SELECT sum(a.range * b.range) FROM range(100000000) a, range(100000000) b")
        assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT, r.error
        assert s.execute("SELECT 1").rows == ((1,),)  # the session goes on
        assert s.execute("SELEC 1").error.kind is ErrorKind.SYNTAX


def test_schema_introspection_and_rendering(fakeduck, fake_url: str) -> None:
    schema = DatabaseSchema.from_url(fake_url)
    assert schema.db_id == "shop" and "delivered_orders" in schema.table_names
    assert schema.table("products").column("price") == ColumnSchema("price", "DOUBLE", not_null=True)
    odd = TableSchema("order", (ColumnSchema("widget", "INTEGER"), ColumnSchema('a"b', "TEXT")))
    assert odd.to_create_sql("fake") == 'CREATE TABLE "order" (\n  "widget" INT,\n  "a""b" TEXT\n);'
    assert quote_identifier("widget", "sqlite") == "widget"  # the built-ins are untouched


def test_prompts_name_the_engine_and_render_its_schema(fakeduck, fake_url: str) -> None:
    task = Text2SQLTask(task_id="q1", db_id="shop", question="How many products?",
                        gold_sql="SELECT count(*) FROM products", dialect="fake")
    assert task.dialect == "fakeduck"
    schema = DatabaseSchema.from_url(fake_url)
    system = build_messages(task, schema)[0]["content"]
    assert "You are an expert FakeDuck database engineer" in system
    assert "Write SQL for FakeDuck only." in system
    assert "CREATE TABLE order_items (" in system


def test_judging_and_comparison(fakeduck, fake_url: str) -> None:
    assert outer_order_by("SELECT name FROM products ORDER BY name", "fakeduck")
    task = Text2SQLTask(task_id="q1", db_id="shop", question="Names of products?",
                        gold_sql="SELECT name FROM products ORDER BY name", dialect="fakeduck")
    judge = Judge({"shop": {"fakeduck": fake_url}})
    right = judge.text2sql(task, "SELECT name FROM products ORDER BY 1")
    wrong = judge.text2sql(task, "SELECT name FROM products ORDER BY name DESC")
    assert right.spider_match and right.bird_match
    assert not wrong.spider_match and wrong.bird_match  # same set, wrong order


def test_bird_labelling_on_its_files(fakeduck, duck_root: Path) -> None:
    assert database_url("fake", str(duck_root), "shop").endswith("/shop/shop.duckdb")
    assert statement_rule("fakeduck")("SELECT 1; SELECT 2") is None  # no one-statement driver rule
    verdicts = label_bird([("shop", "SELECT count(*) FROM orders", "SELECT count(order_id) FROM orders"),
                           ("shop", "SELECT count(*) FROM orders", "SELECT 0")], duck_root, "fake")
    assert [v.match for v in verdicts] == [True, False], verdicts


def test_bug_injection(fakeduck, fake_url: str) -> None:
    assert sqlglot_dialect("fakeduck") == "duckdb"
    info = schema_from_url(fake_url)
    assert info.dialect == "fakeduck" and info.table("PRODUCTS") == "products"
    expr = parse_sql("SELECT name FROM products WHERE price > 10 ORDER BY name", "fakeduck")
    mutations = applicable(expr, info, random.Random(0), [n for n in BUGS if n != "wrong_dialect"])
    assert mutations and all(m.issue_sql for m in mutations.values())


def test_critic_test_cases(fakeduck, fake_url: str) -> None:
    task = CriticTask(instance_id="c1", db_id="shop", query="Count the products.",
                      issue_sql=("SELECT count(*) FROM product",),
                      sol_sql=("SELECT count(*) FROM products",), dialect="fakeduck")
    assert run_critic(task, ["SELECT count(product_id) FROM products"], fake_url).solved
    assert not run_critic(task, ["SELECT 0"], fake_url).solved


def test_its_files_names_and_fences(fakeduck, duck_root: Path, tmp_path: Path) -> None:
    from jobs.main import serve_command
    from sqlrl.db.leases.protocol import Lease
    from sqlrl.db.leases.shard import _on_server
    from sqlrl.eval.critic_eval import resolve_url
    from sqlrl.rewards.parse import extract_single
    from sqlrl.tasks.loaders import load_bird, load_critic, load_jsonl

    questions = tmp_path / "mini_dev_fake.json"  # the engine named by an alias in the file name
    questions.write_text('[{"question_id": 1, "db_id": "shop", "question": "Q?", "SQL": "SELECT 1"},'
                         ' {"question_id": 2, "db_id": "gone", "question": "Q?", "SQL": "SELECT 1"}]')
    bird = load_bird(questions, duck_root)
    assert [t.dialect for t in bird.tasks] == ["fakeduck"] and bird.skipped == {"gone": 1}
    url = bird.catalog["shop"]["fakeduck"]
    assert url.startswith("fakeduck:///") and url.endswith("shop.duckdb")
    assert "sqlite" not in bird.catalog["shop"]  # the folder holds no SQLite file
    task = CriticTask(instance_id="c1", db_id="shop", query="Count.", issue_sql=("SELECT 0",),
                      sol_sql=("SELECT count(*) FROM products",), dialect="fake")
    (tmp_path / "c.jsonl").write_text(json.dumps(task.to_dict()) + "\n")
    critic = load_critic(tmp_path / "c.jsonl", db_root=duck_root)  # a file db
    assert critic.tasks == (task,) and critic.catalog == {"shop": {"fakeduck": url}}
    assert "products" in critic.schemas["shop"].table_names  # read through a session
    assert load_jsonl(tmp_path / "c.jsonl", db_root=duck_root).catalog == critic.catalog
    assert resolve_url(task, None, duck_root) == url
    assert serve_command(Path("m"), {"shop": {"postgresql": "postgresql://h/shop", "fakeduck": url}}
                         ).endswith(f"--database shop={url}")
    lease = Lease("l", "s", "i", "w", "shop", "fakeduck", 0.0, 1.0)
    assert not _on_server(lease) and _on_server(Lease("l", "s", "i", "w", "shop", "postgresql",
                                                      0.0, 1.0))  # a file: CPU here
    fenced = extract_single("<thought>t</thought><solution>```FakeDuck\nSELECT 1\n```</solution>")
    assert fenced.sql == "SELECT 1"
