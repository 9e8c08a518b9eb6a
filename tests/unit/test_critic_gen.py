"""Debugging-task generation (sqlrl.synth.critic_gen) on the demo shop database: every kept
instance is verified by re-running run_critic, rejections are counted, output is deterministic."""

from __future__ import annotations

import random

import pytest

from sqlrl.db import open_session
from sqlrl.eval.critic import run_critic
from sqlrl.synth.bugs import BUGS, Mutation, SchemaInfo, parse_sql
from sqlrl.synth.critic_gen import GenReport, compose_query, make_critic_tasks
from sqlrl.tasks.types import CriticTask, Text2SQLTask

GOLDS = [
    ("How many orders were delivered?", "SELECT count(*) FROM orders WHERE status = 'delivered'",
     "simple"),
    ("List the names and prices of products costing at least 100, cheapest first.",
     "SELECT name, price FROM products WHERE price >= 100 ORDER BY price, name", "simple"),
    ("For each category, what is the total quantity sold?",
     "SELECT p.category, SUM(oi.quantity) FROM products p JOIN order_items oi "
     "ON oi.product_id = p.product_id GROUP BY p.category", "moderate"),
    ("Which cities have customers without an email?",
     "SELECT DISTINCT city FROM customers WHERE email IS NULL AND city IS NOT NULL", "simple"),
    ("Who are the 3 customers with the most orders?",
     "SELECT c.name, COUNT(*) AS n FROM customers c JOIN orders o ON o.customer_id = c.customer_id "
     "GROUP BY c.customer_id, c.name ORDER BY n DESC, c.customer_id LIMIT 3", "challenging"),
    ("Show the ids of orders placed in 2022 that were cancelled.",
     "SELECT order_id FROM orders WHERE order_date >= '2022-01-01' AND order_date < '2023-01-01' "
     "AND status = 'cancelled'", "moderate"),
]


def shop_tasks() -> list[Text2SQLTask]:
    return [Text2SQLTask(task_id=f"shop-{i}", db_id="shop", question=q, gold_sql=g,
                         difficulty=d, source="synthetic/shop") for i, (q, g, d) in enumerate(GOLDS)]


@pytest.fixture(scope="module")
def catalog(demo_db_path: str) -> dict[str, dict[str, str]]:
    return {"shop": {"sqlite": f"sqlite:///{demo_db_path}"}}


@pytest.fixture(scope="module")
def generated(catalog: dict) -> tuple[list[CriticTask], GenReport]:
    return make_critic_tasks(shop_tasks(), catalog, seed=0, per_task=len(BUGS))


def test_every_kept_instance_is_verified(generated: tuple, catalog: dict) -> None:
    tasks, report = generated
    url = catalog["shop"]["sqlite"]
    assert len(tasks) >= 20 and report.kept == len(tasks)
    assert len({t.meta["bug_category"] for t in tasks}) >= 8
    for t in tasks:
        sol = run_critic(t, t.sol_sql, url, timeout_s=5.0)
        assert sol.solved and sol.sol_error is None, t.instance_id
        issue = run_critic(t, t.issue_sql, url, timeout_s=5.0)
        assert not issue.solved and issue.sol_error is None, t.instance_id


def test_instances_have_the_bird_critic_shape(generated: tuple) -> None:
    tasks, _ = generated
    by_id = {t.task_id: t for t in shop_tasks()}
    ids = [t.instance_id for t in tasks]
    assert len(set(ids)) == len(ids)
    for t in tasks:
        origin = by_id[t.meta["origin_task_id"]]
        assert t.instance_id == f"{origin.task_id}/bug/{t.meta['bug']}"
        assert t.source == "synthetic/shop/critic" and t.difficulty == origin.difficulty
        assert t.sol_sql == (origin.gold_sql,) and t.test_cases == () and t.preprocess_sql == ()
        assert t.conditions == {"order": "ORDER BY" in origin.gold_sql}
        assert BUGS[t.meta["bug"]].category == t.meta["bug_category"]
        # the user's statement never contains the SQL itself (neither the bug nor the fix)
        assert t.issue_sql[0] not in t.query and origin.gold_sql not in t.query
        assert CriticTask.from_dict(t.to_dict()) == t
    # one instance per category per source task
    pairs = [(t.meta["origin_task_id"], t.meta["bug_category"]) for t in tasks]
    assert len(set(pairs)) == len(pairs)


def test_symptom_comes_from_executing_the_issue(generated: tuple, catalog: dict) -> None:
    tasks, _ = generated
    with open_session(catalog["shop"]["sqlite"]) as s:
        for t in tasks:
            issue = s.execute(t.issue_sql[0])
            gold = s.execute(t.sol_sql[0])
            if issue.error is not None and issue.error.kind.value != "timeout":
                assert issue.error.message.split()[0] in t.query, (t.query, issue.error)
            elif issue.error is None and issue.row_count != gold.row_count and issue.row_count:
                assert str(issue.row_count) in t.query, t.query


def test_report_accounts_for_every_attempt(generated: tuple) -> None:
    tasks, report = generated
    assert report.tasks == len(GOLDS)
    per_attempt = sum(sum(c.get(r, 0) for r in ("not_applicable", "issue_passes", "sol_fails",
                                                "error")) for c in report.by_category.values())
    assert report.attempts == report.kept + per_attempt
    assert sum(c["kept"] for c in report.by_category.values() if "kept" in c) == len(tasks)
    assert report.rejected["sol_fails"] == 0 and report.rejected["error"] == 0
    assert 0 < report.kept_rate() <= 1 and "attempts" in report.summary()


def test_generation_is_deterministic_per_seed(catalog: dict) -> None:
    a, _ = make_critic_tasks(shop_tasks(), catalog, seed=3)
    b, _ = make_critic_tasks(shop_tasks(), catalog, seed=3)
    c, _ = make_critic_tasks(shop_tasks(), catalog, seed=4)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert len(a) == len(GOLDS)  # per_task=1: one verified instance from each gold
    assert [t.to_dict() for t in a] != [t.to_dict() for t in c]


def test_verification_rejects_a_mutation_that_does_not_change_the_result(catalog: dict) -> None:
    # customer_id is the primary key: DISTINCT cannot change the result, so the "bug" is no bug.
    gold = Text2SQLTask(task_id="uniq", db_id="shop", question="List the customer ids in Oslo.",
                        gold_sql="SELECT customer_id FROM customers WHERE city = 'Oslo'")
    m = BUGS["distinct_add"].inject(parse_sql(gold.gold_sql, "sqlite"),
                                    SchemaInfo.from_mapping({"customers": ["customer_id", "city"]}),
                                    random.Random(0))
    assert m is not None and m.issue_sql.startswith("SELECT DISTINCT customer_id")
    tasks, report = make_critic_tasks([gold], catalog, bugs=["distinct_add"])
    assert tasks == [] and report.rejected["issue_passes"] == 1
    # ... while on a non-unique column the same bug would be caught by the row comparison only
    # if the test case kept DISTINCT; BIRD-CRITIC's default test case strips it, so also rejected:
    dup = Text2SQLTask(task_id="dup", db_id="shop", question="List the cities.",
                       gold_sql="SELECT city FROM customers")
    tasks, report = make_critic_tasks([dup], catalog, bugs=["distinct_add"])
    assert tasks == [] and report.rejected["issue_passes"] == 1
    # a boundary no row sits near: >, >=, 99 or 101 all select the same products, so every
    # off_by_one draw is rejected; on a boundary where stocks X and X+1 both occur, every draw
    # (>= X, > X-1, > X+1) changes the result and is kept (ids, not names: the default test
    # case compares sets of rows, so an extra row repeating a name would not count)
    with open_session(catalog["shop"]["sqlite"]) as s:
        assert s.execute("SELECT count(*) FROM products WHERE price BETWEEN 99 AND 101").rows == ((0,),)
        x = s.execute("SELECT a.stock FROM products a JOIN products b ON b.stock = a.stock + 1 "
                      "ORDER BY 1 LIMIT 1").rows[0][0]
    flip = Text2SQLTask(task_id="flip", db_id="shop", question="Products of at least 100?",
                        gold_sql="SELECT name FROM products WHERE price >= 100")
    stock = Text2SQLTask(task_id="stock", db_id="shop", question=f"Products with stock over {x}?",
                         gold_sql=f"SELECT product_id FROM products WHERE stock > {x}")
    for seed in range(4):
        tasks, report = make_critic_tasks([flip], catalog, bugs=["off_by_one"], seed=seed)
        assert tasks == [] and report.rejected["issue_passes"] == 1
        tasks, report = make_critic_tasks([stock], catalog, bugs=["off_by_one"], seed=seed)
        assert len(tasks) == 1, report
        assert tasks[0].issue_sql[0] in {
            f"SELECT product_id FROM products WHERE stock >= {x}",
            f"SELECT product_id FROM products WHERE stock > {x - 1}",
            f"SELECT product_id FROM products WHERE stock > {x + 1}"}


def test_gold_that_fails_its_own_test_case_is_skipped(catalog: dict) -> None:
    empty = Text2SQLTask(task_id="empty", db_id="shop", question="Orders from the year 1900?",
                         gold_sql="SELECT order_id FROM orders WHERE order_date < '1900-01-01'")
    broken = Text2SQLTask(task_id="broken", db_id="shop", question="Broken?",
                          gold_sql="SELECT nope FROM orders")
    tasks, report = make_critic_tasks([empty, broken], catalog)
    assert tasks == [] and report.rejected["sol_fails"] == 2 and report.attempts == 0
    assert any("no rows" in m for m in report.messages)


def test_missing_database_and_unparsable_gold_are_errors(catalog: dict) -> None:
    other = Text2SQLTask(task_id="x", db_id="nowhere", question="q?", gold_sql="SELECT 1")
    pg = Text2SQLTask(task_id="y", db_id="shop", question="q?", gold_sql="SELECT 1",
                      dialect="postgresql")
    bad = Text2SQLTask(task_id="z", db_id="shop", question="q?", gold_sql="SELEC name FROM t")
    tasks, report = make_critic_tasks([other, pg, bad], catalog)
    assert tasks == [] and report.rejected["error"] == 3 and report.tasks == 3
    assert any("nowhere" in m for m in report.messages)
    assert any("postgresql URL" in m for m in report.messages)
    assert any("cannot parse" in m for m in report.messages)


@pytest.mark.parametrize("kwargs,match", [
    ({"per_task": 0}, "per_task"), ({"bugs": ["no_such_bug"]}, "unknown bug"),
    ({"bugs": []}, "bugs is empty"), ({"timeout_s": 0}, "timeout_s"),
])
def test_bad_arguments_raise(catalog: dict, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_critic_tasks(shop_tasks(), catalog, **kwargs)


def test_non_text2sql_items_raise(catalog: dict) -> None:
    with pytest.raises(ValueError, match="Text2SQLTask"):
        make_critic_tasks([{"question": "q"}], catalog)  # type: ignore[list-item]


def test_compose_query_reports_the_symptom_not_the_fix() -> None:
    from sqlrl.db import ErrorKind, QueryResult

    m = Mutation("x", "wrong_column", "SELECT b FROM t", "a replaced by b", "Values look wrong.",
                 "sqlite")
    gold = QueryResult(columns=("a",), rows=((1,), (2,)), row_count=2)
    rng = random.Random(0)
    err = QueryResult.failure(ErrorKind.RUNTIME, "no such column: b")
    text = compose_query("How many things?", "db", err, gold, m, rng)
    assert "no such column: b" in text and "how many things" in text.lower()
    more = QueryResult(columns=("a",), rows=((1,), (2,), (3,)), row_count=3)
    assert "3 rows" in compose_query("List things.", "db", more, gold, m, rng)
    empty = QueryResult(columns=("a",), rows=(), row_count=0)
    assert "no rows" in compose_query("List things.", "db", empty, gold, m, rng).lower() or \
        "empty" in compose_query("List things.", "db", empty, gold, m, random.Random(0))
    swapped = QueryResult(columns=("a",), rows=((2,), (1,)), row_count=2)
    assert "order" in compose_query("List things.", "db", swapped, gold, m, rng)
    timeout = QueryResult.failure(ErrorKind.TIMEOUT, "interrupted")
    assert "time" in compose_query("List things.", "db", timeout, gold, m, rng)
    for text in (compose_query("List things.", "db", r, gold, m, random.Random(s))
                 for s in range(10) for r in (err, more, swapped)):
        assert "a replaced by b" not in text and "SELECT" not in text


def test_spider_critic_tasks_names_a_missing_folder(tmp_path) -> None:
    from sqlrl.synth.critic_gen import spider_critic_tasks

    with pytest.raises(FileNotFoundError, match="Spider"):
        spider_critic_tasks(tmp_path / "nope")


def test_a_raising_injector_is_counted_not_fatal(catalog: dict, monkeypatch) -> None:
    from sqlrl.synth.bugs import BugInjector

    def boom(ctx):
        raise KeyError("unexpected AST shape")

    monkeypatch.setitem(BUGS, "boom", BugInjector("boom", "boom", boom, "?"))
    tasks, report = make_critic_tasks(shop_tasks()[:2], catalog, bugs=["boom", "wrong_column"],
                                      per_task=2)
    assert report.by_category["boom"] == {"attempts": 2, "error": 2}
    assert any("injector boom raised KeyError" in m for m in report.messages)
    assert tasks and all(t.meta["bug"] == "wrong_column" for t in tasks)
