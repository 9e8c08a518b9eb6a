"""The BIRD-CRITIC runner's default test case (and one sandboxed custom test case) on PostgreSQL and
MariaDB: the demo "shop" database loaded with ``sqlrl.db.provisioning.loader``, run through agent-role sessions."""

import hashlib

import pytest

from sqlrl.db import open_session
from sqlrl.eval.critic import OutcomeKind, SolCache, run_critic
from sqlrl.tasks.types import CriticTask

OSLO = "SELECT name FROM customers WHERE city = 'Oslo'"
TABLES = ("customers", "products", "orders", "order_items")


def make_task(sol=OSLO, *, test_cases=(), conditions=None, preprocess=(), iid="s1"):
    return CriticTask(instance_id=iid, db_id="shop", query="fix my query", issue_sql=["SELECT 1"],
                      sol_sql=sol, test_cases=test_cases, conditions=conditions or {},
                      preprocess_sql=preprocess)


@pytest.fixture
def server_url(shop_server):
    return shop_server[1]  # tests/dialects/conftest.py


def checksum(url):
    digest = hashlib.sha256()
    with open_session(url) as s:
        for table in TABLES:
            result = s.execute(f"SELECT * FROM {table}")
            assert result.ok, result.error
            digest.update(repr(sorted(map(repr, result.rows))).encode())
    return digest.hexdigest()


def test_default_test_case_on_servers(server_url):
    before = checksum(server_url)
    cache = SolCache()
    task = make_task()
    assert run_critic(task, [OSLO + " -- fixed"], server_url, sol_cache=cache).solved
    wrong = run_critic(task, ["SELECT name FROM customers WHERE city = 'Lima'"], server_url,
                       sol_cache=cache)
    assert wrong.outcomes[0].kind is OutcomeKind.FAILED
    assert cache.misses == 1 and cache.hits == 1

    sol = "SELECT product_id FROM products ORDER BY price DESC, product_id"
    pred = "SELECT product_id FROM products ORDER BY price ASC, product_id"
    assert run_critic(make_task(sol), [pred], server_url).solved
    assert not run_critic(make_task(sol, conditions={"order": True}), [pred], server_url).solved

    # DISTINCT and ROUND stripped (PostgreSQL has no round(double precision, int): stripping
    # removes the call before it runs, on both sides)
    rounded = make_task("SELECT product_id, price FROM products ORDER BY product_id",
                        conditions={"order": True})
    assert run_critic(rounded, ["SELECT DISTINCT product_id, ROUND(price, 1) FROM products "
                                "/* c */ ORDER BY product_id"], server_url).solved

    syntax = run_critic(task, ["SELEC name FROM customers"], server_url)
    assert syntax.outcomes[0].kind is OutcomeKind.PRED_ERROR and syntax.sol_error is None
    forever = ("WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) "
               "SELECT count(*) FROM c")
    slow = run_critic(task, [forever], server_url, timeout_s=0.5)
    assert slow.outcomes[0].kind is OutcomeKind.PRED_TIMEOUT

    broken = run_critic(make_task("SELECT nope FROM customers"), [OSLO], server_url)
    assert broken.sol_error is not None and broken.score == 0.0
    assert checksum(server_url) == before


def test_management_task_and_custom_test_case_on_servers(server_url):
    before = checksum(server_url)
    preprocess = ["CREATE TABLE stock_log AS SELECT product_id, stock FROM products"]
    sol = ["UPDATE stock_log SET stock = 0 WHERE stock IS NULL",
           "SELECT product_id, stock FROM stock_log"]
    good = ["UPDATE stock_log SET stock = COALESCE(stock, 0)", "SELECT * FROM stock_log"]
    assert run_critic(make_task(sol, preprocess=preprocess), good, server_url).solved
    assert not run_critic(make_task(sol, preprocess=preprocess), ["SELECT * FROM stock_log"],
                          server_url).solved
    state_test = """
def test_case(pred_sqls, sol_sqls, db_path, conn, conditions):
    cur = conn.cursor()
    cur.execute("SELECT count(*) FROM stock_log WHERE stock IS NULL")
    assert cur.fetchone()[0] == 0, "NULL stock left"
    assert ex_base(pred_sqls[-1:], sol_sqls[-1:], db_path, conn, conditions) == 1
"""
    custom = make_task(sol, preprocess=preprocess, test_cases=[state_test])
    assert run_critic(custom, good, server_url).solved
    assert run_critic(custom, ["SELECT 1"], server_url).outcomes[0].kind is OutcomeKind.FAILED
    assert checksum(server_url) == before


def test_plan_cost_helper_on_servers(server_url):
    qep = """
def test_case(pred_sqls, sol_sqls, db_path, conn, conditions):
    slow = ["SELECT count(*) FROM orders o JOIN order_items i ON i.order_id = o.order_id "
            "JOIN customers c ON c.customer_id = o.customer_id"]
    assert performance_compare_by_qep(slow, ["SELECT 1"], db_path, conn) == 1
    assert performance_compare_by_qep(["SELECT 1"], slow, db_path, conn) == 0
"""
    verdict = run_critic(make_task(test_cases=[qep]), [OSLO], server_url)
    if server_url.startswith("postgresql"):  # EXPLAIN (FORMAT JSON) total cost, as BIRD-CRITIC
        assert verdict.solved, verdict
    else:  # not implemented for MariaDB/MySQL: a clear error, never a pass
        assert verdict.outcomes[0].kind is OutcomeKind.TEST_ERROR
        assert "NotImplementedError" in verdict.outcomes[0].message
