"""The shaped rewards' floor on PostgreSQL and MariaDB: only an answer the server attests was
read-only earns it (``QueryResult.read_only``, docs/rewards.md). The demo "shop" database is
loaded with ``sqlrl.db.provisioning.loader`` and judged through agent-role sessions.

PostgreSQL attests a streamed statement (no xid in its cursor's transaction block); MariaDB
attests nothing, so no answer earns the floor there and a solved task still scores 1."""

import uuid

import pytest

from sqlrl.db import Limits, open_session
from sqlrl.db.provisioning import provision
from sqlrl.db.provisioning.loader import load_sqlite
from sqlrl.rewards import Judge, compute
from sqlrl.tasks.types import CriticTask, Text2SQLTask

GOLD = "SELECT COUNT(*) FROM customers"
WRONG_READS = ["SELECT COUNT(*) FROM products",
               "WITH c AS (SELECT * FROM customers) SELECT city, COUNT(*) FROM c GROUP BY city"]
WRITES = [
    "DELETE FROM orders",
    "DELETE FROM order_items WHERE order_id < 5 RETURNING *",
    "UPDATE customers SET city = 'Oslo'",
    "INSERT INTO customers (customer_id, name, joined) VALUES (9999, 'x', '2024-01-01')",
    "CREATE TABLE t (x INTEGER)",
    "CREATE TEMPORARY TABLE t (x INTEGER)",
    "DROP TABLE order_items",
    "SELECT COUNT(*) FROM products; DELETE FROM order_items",
    "DELETE FROM order_items; SELECT COUNT(*) FROM products",
]
PG_ONLY_WRITES = [
    "WITH gone AS (DELETE FROM order_items RETURNING 1) SELECT COUNT(*) FROM gone",
    "SELECT COUNT(*) INTO TEMP t2 FROM customers",
]


def single(sql):
    return f"<thought>t</thought>\n<solution>{sql}</solution>"


@pytest.fixture
def server(shop_server):
    return shop_server  # tests/dialects/conftest.py


def judge_for(dialect, url):
    return Judge({"shop": {dialect: url}}, limits=Limits(timeout_s=5.0, max_rows=100))


def test_the_floor_needs_the_servers_word(server):
    dialect, url = server
    judge = judge_for(dialect, url)
    task = Text2SQLTask(task_id="ro", db_id="shop", question="q?", gold_sql=GOLD, dialect=dialect)
    attested = dialect == "postgresql"
    for sql in WRONG_READS:
        b = compute("hybrid_single_shaped", task, single(sql), judge)
        assert b.read_only is (True if attested else None), sql
        assert b.score == pytest.approx(0.1 if attested else 0.0), sql
        assert b.parts == compute("hybrid_single", task, single(sql), judge).parts
    right = compute("hybrid_single_shaped", task, single("SELECT COUNT(customer_id) FROM customers"),
                    judge)
    assert (right.score, right.reason) == (1.0, "ok")
    for sql in WRITES + (PG_ONLY_WRITES if attested else []):
        b = compute("hybrid_single_shaped", task, single(sql), judge)
        assert b.score == 0.0 and b.read_only is not True and not b.excluded, (sql, b)
        assert b.parts["executed"] == 1.0, (sql, b.reason)  # it ran: only the floor is withheld


def test_a_dml_fix_of_a_debugging_task_scores_one(server):
    dialect, url = server
    judge = judge_for(dialect, url)
    preprocess = ["CREATE TABLE stock_log AS SELECT product_id, stock FROM products"]
    task = CriticTask(instance_id="ro-dml", db_id="shop", query="fill the missing stock",
                      issue_sql=["SELECT * FROM stock_log"], preprocess_sql=preprocess,
                      sol_sql=["UPDATE stock_log SET stock = 0 WHERE stock IS NULL",
                               "SELECT product_id, stock FROM stock_log"], dialect=dialect)
    fix = "UPDATE stock_log SET stock = COALESCE(stock, 0); SELECT product_id, stock FROM stock_log"
    assert compute("hybrid_single_shaped", task, single(fix), judge).score == 1.0
    bad = compute("hybrid_single_shaped", task,
                  single("UPDATE stock_log SET stock = 1; SELECT * FROM stock_log"), judge)
    assert bad.score == 0.0 and bad.parts["executed"] == 1.0


def _spy(inner: object, asked: list[object]) -> object:
    """The session's adapter, noting every ``read_only`` question put to it (a subclass, so it
    declares the same capabilities: ``dialects/contract.py``)."""

    class Spy(type(inner)):  # type: ignore[misc]
        def read_only(self, *args: object) -> object:
            asked.append(args)
            return super().read_only(*args)

    return Spy()


@pytest.mark.postgres
def test_postgresql_sees_a_write_inside_a_select(pg_admin_url, demo_db_path):
    """A plain SELECT that writes through a function it calls: PostgreSQL gave its block an xid.
    A function that ends up changing no row assigns no xid: it wrote nothing. A session that does
    not ask (``Limits.attest`` off, as in rollouts) gets None and pays no extra round trip."""
    name = f"t_ro_{uuid.uuid4().hex[:8]}"
    report = load_sqlite(demo_db_path, pg_admin_url, name, replace=True)
    try:
        with open_session(report.session_url, limits=Limits(attest=True)) as s:
            made = s.execute("CREATE FUNCTION bump() RETURNS bigint LANGUAGE sql AS $$ UPDATE "
                             "products SET stock = stock WHERE product_id = 1 RETURNING 1 $$")
            assert made.ok and made.read_only is None, made.error  # not streamed: not attested
            wrote = s.execute("SELECT bump()")
            assert wrote.ok and wrote.read_only is False, wrote.error
            assert s.execute("SELECT COUNT(*) FROM products").read_only is True
            calls = s.execute("SELECT 1; SELECT bump(); SELECT 2")
            assert calls.ok and calls.read_only is False
            assert s.execute("SHOW application_name").read_only is None  # not streamed
            made = s.execute("CREATE FUNCTION nothing() RETURNS bigint LANGUAGE sql AS "
                             "$$ DELETE FROM products WHERE false RETURNING 1 $$")
            assert made.ok, made.error
            assert s.execute("SELECT nothing()").read_only is True
        with open_session(report.session_url) as s:
            asked: list[object] = []
            s.adapter = _spy(s.adapter, asked)
            for sql in ("CREATE FUNCTION bump() RETURNS bigint LANGUAGE sql AS $$ UPDATE products "
                        "SET stock = stock WHERE product_id = 1 RETURNING 1 $$", "SELECT bump()",
                        "SELECT COUNT(*) FROM products"):
                r = s.execute(sql)
                assert r.ok and r.read_only is None, (sql, r.error)
            assert asked == []
    finally:
        provision.drop_database(pg_admin_url, name)


@pytest.mark.mysql
def test_mariadb_attests_nothing(mysql_admin_url, demo_db_path):
    name = f"t_ro_{uuid.uuid4().hex[:8]}"
    report = load_sqlite(demo_db_path, mysql_admin_url, name, replace=True)
    try:
        with open_session(report.session_url, limits=Limits(attest=True)) as s:
            for sql in ("SELECT COUNT(*) FROM customers", "DELETE FROM order_items"):
                r = s.execute(sql)
                assert r.ok and r.read_only is None, (sql, r.error)
    finally:
        provision.drop_database(mysql_admin_url, name)
