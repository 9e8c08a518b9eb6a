"""Debugging-task generation on PostgreSQL and MariaDB: the demo shop database is loaded into the
server, tasks are generated in that dialect and every kept instance is re-verified there."""

from __future__ import annotations

import uuid

import pytest

from sqlrl.db.provisioning import provision
from sqlrl.db.provisioning.loader import load_sqlite
from sqlrl.eval.critic import run_critic
from sqlrl.synth.bugs import schema_from_url
from sqlrl.synth.critic_gen import make_critic_tasks
from sqlrl.tasks.types import Text2SQLTask

GOLDS = [
    "SELECT count(*) FROM orders WHERE status = 'delivered'",
    "SELECT name, price FROM products WHERE price >= 100 ORDER BY price, name LIMIT 5",
    "SELECT p.category, SUM(oi.quantity) FROM products p JOIN order_items oi "
    "ON oi.product_id = p.product_id GROUP BY p.category",
    "SELECT COALESCE(city, 'unknown'), count(*) FROM customers GROUP BY COALESCE(city, 'unknown')",
]


@pytest.fixture(scope="module", params=["postgresql", "mysql"])
def loaded(request, demo_db_path):
    dialect = request.param
    admin = request.getfixturevalue("pg_admin_url" if dialect == "postgresql" else "mysql_admin_url")
    name = f"t_critic_{uuid.uuid4().hex[:6]}"
    report = load_sqlite(demo_db_path, admin, name, replace=True)
    yield dialect, report.session_url
    provision.drop_database(admin, name)


@pytest.mark.slow
def test_generation_verifies_on_the_server(loaded) -> None:
    dialect, url = loaded
    info = schema_from_url(url)
    assert {"customers", "products", "orders", "order_items"} <= set(info.tables)
    assert info.dialect == dialect
    tasks = [Text2SQLTask(task_id=f"srv-{i}", db_id="shop", question=f"Question {i}?", gold_sql=g,
                          dialect=dialect, source="synthetic/shop") for i, g in enumerate(GOLDS)]
    out, report = make_critic_tasks(tasks, {"shop": {dialect: url}}, seed=0, per_task=20)
    assert report.rejected["error"] == 0 and report.rejected["sol_fails"] == 0, report.messages
    assert len(out) >= 12 and "wrong_dialect" in {t.meta["bug_category"] for t in out}
    for t in out:
        assert t.dialect == dialect
        assert run_critic(t, t.sol_sql, url, timeout_s=5.0).solved, t.instance_id
        assert not run_critic(t, t.issue_sql, url, timeout_s=5.0).solved, t.instance_id
