"""BIRD-CRITIC test-case runner on SQLite (the demo "shop" database): the default test case, custom
test-case code in the killable sandbox, the sol cache, fail-closed verdicts, and the base database
left untouched."""

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sqlrl.db import source
from sqlrl.eval.critic import OutcomeKind, SolCache, run_critic
from sqlrl.eval.critic_sql import (preprocess_results, remove_distinct_sql, remove_round_sql,
                                   results_match, strip_sql, strip_sql_fallback)
from sqlrl.tasks.types import CriticTask

OSLO = "SELECT name FROM customers WHERE city = 'Oslo'"
STOCK_TABLE = "CREATE TABLE stock_log AS SELECT product_id, stock FROM products"
STOCK_SOL = ["UPDATE stock_log SET stock = 0 WHERE stock IS NULL",
             "SELECT product_id, stock FROM stock_log"]


def make_task(sol=OSLO, *, test_cases=(), conditions=None, preprocess=(), clean_up=(), iid="t1"):
    return CriticTask(instance_id=iid, db_id="shop", query="fix my query", issue_sql=["SELECT 1"],
                      sol_sql=sol, test_cases=test_cases, conditions=conditions or {},
                      preprocess_sql=preprocess, clean_up_sql=clean_up)


@pytest.fixture(scope="module")
def url(demo_db_path):
    return "sqlite:///" + demo_db_path


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def executed(monkeypatch):
    """Every statement run through sessions opened by the runner, per session."""
    log = []
    real = source.open_session  # what the runner's default LocalSessions opens with

    def counting(url, **kw):
        session = real(url, **kw)
        mine = []
        log.append(mine)
        orig = session.execute

        def execute(sql):
            mine.append(sql)
            return orig(sql)

        session.execute = execute
        return session

    monkeypatch.setattr(source, "open_session", counting)
    return log


# ------------------------------------------------------------------ SQL rewriting (default test case)

def test_strip_removes_comments_distinct_round_and_keeps_literals():
    sql = ("SELECT DISTINCT ROUND(price, 1) AS p, 'a -- b', 'ROUND(x, 2)', ' distinct ' -- note\n"
           "FROM products /* DISTINCT ROUND( */ WHERE name <> 'x/*y*/'")
    out = strip_sql(sql)
    assert out.startswith("SELECT (price) AS p, 'a -- b', 'ROUND(x, 2)', ' distinct '")
    assert "note" not in out and "/* DISTINCT" not in out and "'x/*y*/'" in out


def test_strip_keeps_aggregate_distinct_distinct_on_and_quoted_round():
    assert remove_distinct_sql("SELECT COUNT(DISTINCT city) FROM customers") == \
        "SELECT COUNT(DISTINCT city) FROM customers"
    pg = "SELECT DISTINCT ON (city) city, name FROM customers"
    assert remove_distinct_sql(pg, "postgres") == pg
    assert remove_distinct_sql("SELECT name FROM t WHERE x IN (SELECT DISTINCT y FROM u)") == \
        "SELECT name FROM t WHERE x IN (SELECT y FROM u)"
    assert remove_round_sql('SELECT "round"(1), round_id FROM t') == 'SELECT "round"(1), round_id FROM t'


def test_strip_round_keeps_precedence_and_unwraps_nested_calls():
    assert remove_round_sql("SELECT ROUND(a + b, 2) * 3 FROM t") == "SELECT (a + b) * 3 FROM t"
    assert remove_round_sql("SELECT round(ROUND(price, 2), 1), ROUND(f(x, y)) FROM t") == \
        "SELECT ((price)), (f(x, y)) FROM t"


def test_untokenizable_sql_takes_the_documented_fallback_which_can_change_literals():
    bad = "SELECT DISTINCT ROUND(x, 2) FROM t WHERE s = 'unterminated -- tail"
    assert strip_sql(bad) == strip_sql_fallback(bad)
    # The fallback is BIRD-CRITIC's own text rules: not literal-aware. A tokenizable query keeps its
    # literal; the fallback applied to the same text cuts it.
    ok = "SELECT 'a -- b' AS s FROM t"
    assert strip_sql(ok) == ok
    assert strip_sql_fallback(ok) == "SELECT 'a"


def test_preprocess_results_and_match_semantics():
    assert preprocess_results([(1.234, "x", True)]) == [(1.23, "x", True)]
    assert results_match([(1.001,)], [(1.0,)], order=False)
    assert not results_match([], [], order=False)  # BIRD-CRITIC's ex_base: empty never matches
    assert results_match([(2,), (1,), (1,)], [(1,), (2,)], order=False)
    assert not results_match([(2,), (1,)], [(1,), (2,)], order=True)


# ------------------------------------------------------------------ default test case

def test_default_pass_and_fail(url):
    task = make_task()
    ok = run_critic(task, [OSLO.replace("name FROM", "name  FROM")], url)
    assert ok.solved and ok.score == 1.0 and ok.outcomes[0].kind is OutcomeKind.PASSED
    bad = run_critic(task, ["SELECT name FROM customers WHERE city = 'Lima'"], url)
    assert not bad.solved and bad.score == 0.0 and bad.sol_error is None
    assert bad.outcomes[0].kind is OutcomeKind.FAILED and "results differ" in bad.outcomes[0].message


def test_order_condition(url):
    sol = "SELECT product_id FROM products ORDER BY price DESC"
    pred = "SELECT product_id FROM products ORDER BY price ASC"
    assert run_critic(make_task(sol), [pred], url).solved  # a set: order is ignored
    ordered = run_critic(make_task(sol, conditions={"order": True}), [pred], url)
    assert ordered.outcomes[0].kind is OutcomeKind.FAILED
    assert run_critic(make_task(sol, conditions={"order": True}), [sol + " -- same"], url).solved


def test_distinct_round_and_comments_are_stripped_from_both_sides(url):
    task = make_task("SELECT city FROM customers WHERE city IS NOT NULL")
    assert run_critic(task, ["SELECT DISTINCT city FROM customers /* dedupe */ WHERE city IS NOT NULL"],
                      url).solved
    ordered = make_task("SELECT product_id, price FROM products ORDER BY product_id",
                        conditions={"order": True})
    assert run_critic(ordered, ["-- rounded\nSELECT product_id, ROUND(price, 0) FROM products "
                                "ORDER BY product_id"], url).solved
    # ROUND is removed, not evaluated: a prediction that scales the value still fails.
    assert not run_critic(ordered, ["SELECT product_id, ROUND(price * 2, 2) FROM products "
                                    "ORDER BY product_id"], url).solved


def test_multi_statement_management_task_is_judged_by_the_state_it_leaves(url, executed):
    task = make_task(STOCK_SOL, preprocess=[STOCK_TABLE])
    good = run_critic(task, ["UPDATE stock_log SET stock = COALESCE(stock, 0)",
                             "SELECT * FROM stock_log"], url)
    assert good.solved
    # pred and sol each ran in their own fresh session, in order, after preprocess_sql
    assert ["UPDATE stock_log SET stock = 0 WHERE stock IS NULL",
            "SELECT product_id, stock FROM stock_log"] in executed
    wrong = run_critic(task, ["UPDATE stock_log SET stock = 1 WHERE stock IS NULL; "
                              "SELECT * FROM stock_log"], url)
    assert wrong.outcomes[0].kind is OutcomeKind.FAILED
    forgot_update = run_critic(task, ["SELECT * FROM stock_log"], url)
    assert not forgot_update.solved


def test_prediction_errors_fail_the_test_case(url):
    task = make_task()
    syntax = run_critic(task, ["SELEC name FROM customers"], url)
    assert syntax.outcomes[0].kind is OutcomeKind.PRED_ERROR and syntax.score == 0.0
    assert syntax.sol_error is None
    assert run_critic(task, ["SELECT nope FROM customers"], url).outcomes[0].kind is OutcomeKind.PRED_ERROR
    empty = run_critic(task, ["  ", ""], url)
    assert empty.outcomes[0].kind is OutcomeKind.PRED_ERROR and "no SQL" in empty.outcomes[0].message
    # the first statement fails: the later one is not run and does not rescue the prediction
    assert run_critic(task, ["SELECT * FROM missing_table", OSLO], url).outcomes[0].kind \
        is OutcomeKind.PRED_ERROR


def test_prediction_timeout(url):
    forever = ("WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) "
               "SELECT count(*) FROM c")
    verdict = run_critic(make_task(), [forever], url, timeout_s=0.3)
    assert verdict.outcomes[0].kind is OutcomeKind.PRED_TIMEOUT and not verdict.solved


@pytest.mark.parametrize("sol, preprocess, why", [
    ("SELECT nope FROM customers", (), "sol_sql failed"),
    ("SELECT name FROM customers WHERE 1 = 0", (), "returned no rows"),
    (OSLO, ("CREATE TABLE customers (x)",), "preprocess_sql failed"),
])
def test_broken_reference_is_flagged_and_scores_zero(url, sol, preprocess, why):
    verdict = run_critic(make_task(sol, preprocess=preprocess), [OSLO], url)
    assert verdict.sol_error is not None and why in verdict.sol_error
    assert verdict.score == 0.0 and not verdict.solved
    assert verdict.outcomes[0].kind is OutcomeKind.SOL_ERROR


def test_sol_runs_once_for_a_batch_of_eight_rollouts(url, executed):
    cache = SolCache()
    task = make_task("SELECT name FROM customers WHERE city = 'Oslo' ORDER BY name")
    preds = [OSLO] * 4 + ["SELECT name FROM customers WHERE city = 'Lima'"] * 3 + ["SELEC 1"]
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda p: run_critic(task, [p], url, sol_cache=cache), preds))
    assert [v.solved for v in verdicts] == [True] * 4 + [False] * 4
    sol_runs = [s for s in executed if s == [task.sol_sql[0]]]
    assert len(sol_runs) == 1 and cache.misses == 1 and cache.hits == 7
    # another url or instance is another entry; a sol error is cached too
    run_critic(make_task("SELECT nope", iid="t2"), [OSLO], url, sol_cache=cache)
    run_critic(make_task("SELECT nope", iid="t2"), [OSLO], url, sol_cache=cache)
    assert cache.misses == 2 and len(cache) == 2


def test_sol_cache_is_an_lru_and_rejects_bad_sizes(url):
    cache = SolCache(maxsize=1)
    run_critic(make_task(iid="a"), [OSLO], url, sol_cache=cache)
    run_critic(make_task(iid="b"), [OSLO], url, sol_cache=cache)
    run_critic(make_task(iid="a"), [OSLO], url, sol_cache=cache)
    assert len(cache) == 1 and cache.misses == 3
    with pytest.raises(ValueError, match="maxsize"):
        SolCache(maxsize=0)


def test_clean_up_sql_runs_and_its_errors_are_recorded_not_fatal(url, executed):
    task = make_task(STOCK_SOL, preprocess=[STOCK_TABLE],
                     clean_up=["DROP TABLE stock_log", "DROP TABLE no_such_table"])
    verdict = run_critic(task, STOCK_SOL, url)
    assert verdict.solved
    pred_session = executed[-1]
    assert pred_session[-2:] == ["DROP TABLE stock_log", "DROP TABLE no_such_table"]
    assert "no_such_table" in verdict.outcomes[0].cleanup_error


def test_bad_arguments_raise_clear_errors(url):
    with pytest.raises(ValueError, match="pred_sqls"):
        run_critic(make_task(), [OSLO, 3], url)
    with pytest.raises(ValueError, match="timeout_s"):
        run_critic(make_task(), [OSLO], url, timeout_s=0)
    with pytest.raises(ValueError, match="test_timeout_s"):
        run_critic(make_task(), [OSLO], url, test_timeout_s=-1)
    with pytest.raises(ValueError, match="CriticTask"):
        run_critic({"instance_id": "x"}, [OSLO], url)


# ------------------------------------------------------------------ custom test cases (sandbox)

EX_BASE_TEST = """
def test_case(pred_sqls, sol_sqls, db_path, conn, conditions):
    pred_sqls = remove_distinct(remove_comments(pred_sqls))
    sol_sqls = remove_distinct(remove_comments(sol_sqls))
    result = ex_base(pred_sqls, sol_sqls, db_path, conn, conditions)
    assert result == 1, f"ex_base returned {result} but expected 1."
"""

STATE_TEST = """
def test_case(pred_sqls, sol_sqls, db_path, conn, conditions):
    cur = conn.cursor()
    cur.execute("SELECT count(*) FROM stock_log WHERE stock IS NULL")
    assert cur.fetchone()[0] == 0, "NULL stock left"
    assert db_path.endswith("shop.sqlite")
    assert pred_query_result is not None and len(pred_query_result) == 40
    assert isinstance(date(2024, 1, 1), datetime.date)
"""

PG_STYLE_TEST = """
def test_case(pred_sqls, sol_sqls, db_name, conn):
    rows, _ = perform_query_on_postgresql_databases("SELECT count(*) FROM stock_log", db_name, conn)
    assert rows == [(40,)]
    res, err, to = execute_queries(["SELECT 1", "SELECT nope"], db_name, conn, is_solution=False)
    assert res == [(1,)] and not err and not to
    res, err, to = execute_queries(["SELECT nope"], db_name, conn)
    assert err and not to
"""


def test_custom_test_cases_pass_and_see_the_predictions_state(url):
    task = make_task(STOCK_SOL, preprocess=[STOCK_TABLE],
                     test_cases=[EX_BASE_TEST, STATE_TEST, PG_STYLE_TEST])
    verdict = run_critic(task, ["UPDATE stock_log SET stock = COALESCE(stock, 0)",
                                "SELECT DISTINCT product_id, stock FROM stock_log"], url)
    assert [o.kind for o in verdict.outcomes] == [OutcomeKind.PASSED] * 3, verdict
    assert verdict.solved and verdict.score == 1.0
    forgot = run_critic(task, ["SELECT product_id, stock FROM stock_log"], url)
    assert forgot.outcomes[1].kind is OutcomeKind.FAILED and "NULL stock left" in forgot.outcomes[1].message
    assert forgot.passed == 1 and forgot.score == pytest.approx(1 / 3)


def _pid_dead(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_runaway_test_code_is_killed_with_everything_it_forked(url, tmp_path):
    pids = tmp_path / "pids"
    looping = f"""
import os, time
def test_case(pred_sqls, sol_sqls, db_path, conn, conditions):
    child = os.fork()
    if child == 0:
        while True:
            time.sleep(0.05)
    with open({str(pids)!r}, "w") as f:
        f.write(f"{{os.getpid()}} {{child}}")
    while True:
        pass
"""
    # 3 s: time enough, even on a loaded machine, for the test code to fork and write its pids
    verdict = run_critic(make_task(test_cases=[looping]), [OSLO], url, test_timeout_s=3.0)
    assert verdict.outcomes[0].kind is OutcomeKind.TEST_TIMEOUT and not verdict.solved
    found = [int(p) for p in pids.read_text().split()]
    assert len(found) == 2
    deadline = time.monotonic() + 60  # reaping by the fork server is asynchronous: wait for it
    while not all(_pid_dead(p) for p in found) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_pid_dead(p) for p in found)


@pytest.mark.parametrize("code, kind, text", [
    ("def test_case(a, b, c, d, e):\n    raise KeyError('boom')\n", OutcomeKind.TEST_ERROR, "KeyError"),
    ("import os\ndef test_case(a, b, c, d, e):\n    os._exit(1)\n", OutcomeKind.TEST_ERROR, "died"),
    ("import os; os._exit(1)\n", OutcomeKind.TEST_ERROR, "died"),
    ("def test_case(a, b, c, d, e):\n    raise SystemExit(0)\n", OutcomeKind.TEST_ERROR, "SystemExit"),
    ("def helper():\n    pass\n", OutcomeKind.TEST_ERROR, "no function test_case"),
    ("def test_case(a, b, c, d, e):\n    print('looked at it')\n    assert False, 'nope'\n",
     OutcomeKind.FAILED, "looked at it"),
    ("def test_case(a, b, c, conn, e):\n    conn.cursor().execute('SELECT ?', (1,))\n",
     OutcomeKind.TEST_ERROR, "parameters are not supported"),
    ("def test_case(a, b, c, conn, e):\n    conn.cursor().execute('DROP TABLE nope')\n",
     OutcomeKind.TEST_ERROR, "DatabaseError"),
])
def test_failing_test_code_fails_closed(url, code, kind, text):
    verdict = run_critic(make_task(test_cases=[code, EX_BASE_TEST]), [OSLO], url, test_timeout_s=5)
    first, second = verdict.outcomes
    assert first.kind is kind and text in first.message, first
    assert second.kind is OutcomeKind.PASSED  # the next test case runs in a fresh process
    assert verdict.score == 0.5 and not verdict.solved and verdict.sol_error is None


def test_custom_test_case_sees_a_failing_sol_as_a_broken_instance(url):
    verdict = run_critic(make_task("SELECT nope FROM customers", test_cases=[EX_BASE_TEST] * 2),
                         [OSLO], url)
    assert verdict.sol_error is not None and "sol_sqls failed" in verdict.sol_error
    assert verdict.score == 0.0 and [o.kind for o in verdict.outcomes] == [OutcomeKind.SOL_ERROR] * 2


def test_failing_prediction_is_not_rerun_for_later_test_cases(url, executed):
    verdict = run_critic(make_task(test_cases=[EX_BASE_TEST] * 3), ["SELEC 1"], url)
    assert [o.kind for o in verdict.outcomes] == [OutcomeKind.PRED_ERROR] * 3
    assert sum(1 for s in executed if "SELEC 1" in s) == 1


def test_nothing_reaches_the_base_database(demo_db_path, url):
    before = sha(demo_db_path)
    vandal = """
def test_case(pred_sqls, sol_sqls, db_path, conn, conditions):
    conn.cursor().execute("DROP TABLE order_items")
    conn.cursor().execute("DELETE FROM customers")
    conn.commit()
"""
    task = make_task(STOCK_SOL, preprocess=[STOCK_TABLE, "DELETE FROM orders WHERE order_id < 10"],
                     clean_up=["DROP TABLE products"], test_cases=[vandal, EX_BASE_TEST])
    run_critic(task, ["UPDATE customers SET city = 'X'", "DROP VIEW delivered_orders",
                      "SELECT 1"], url)
    run_critic(make_task(STOCK_SOL, preprocess=[STOCK_TABLE]), ["DELETE FROM products",
                                                               "SELECT * FROM stock_log"], url)
    assert sha(demo_db_path) == before
    assert not any(p.name.startswith("shop.sqlite-") for p in Path(demo_db_path).parent.iterdir())


def test_test_case_signatures_and_plan_cost_helper(url):
    keyword = """
def test_case(pred_sqls, sol_sqls, db_path, conn, *, conditions):
    assert conditions == {"order": True}
    # SQLite: BIRD-CRITIC counts 1.0 per DML statement; fewer statements is "cheaper"
    assert performance_compare_by_qep(["SELECT 1", "SELECT 2"], ["SELECT 3"], db_path, conn) == 1
    assert performance_compare_by_qep(["SELECT 1"], ["SELECT 2", "SELECT 3"], db_path, conn) == 0
    assert check_sql_function_usage(pred_sqls, ["where", "city"]) == 1
"""
    var_kw = "def test_case(pred_sqls, sol_sqls, db_path, conn, **kw):\n    assert kw['conditions']['order']\n"
    task = make_task(test_cases=[keyword, var_kw], conditions={"order": True})
    verdict = run_critic(task, [OSLO], url)
    assert verdict.solved, verdict
