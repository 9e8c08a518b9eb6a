"""Rewards: parsing, fail-closed scoring, the gold cache, SQL-R1's composite, hybrid routing."""

from __future__ import annotations

import threading

import pytest

from sqlrl.db import Limits
from sqlrl.rewards import (REWARDS, Judge, RewardConfig, SQLR1Config, batch_means, compute,
                           extract_agentic, extract_single, score)
from sqlrl.eval.compare import outer_order_by
from sqlrl.rewards.judge import ExecVerdict
from sqlrl.tasks.types import CriticTask, Text2SQLTask
from sqlrl.tools import ToolCall

RECURSIVE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"


def single(sql: str, thought: str = "count them") -> str:
    return f"<thought>{thought}</thought>\n<solution>{sql}</solution>"


@pytest.fixture()
def judge(demo_db_path):
    return Judge({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}},
                 limits=Limits(timeout_s=1.0, max_rows=50))


def t2s(gold: str, task_id: str = "t1") -> Text2SQLTask:
    return Text2SQLTask(task_id=task_id, db_id="shop", question="q?", gold_sql=gold)


def critic(sol: str, **kw) -> CriticTask:
    return CriticTask(instance_id=kw.pop("instance_id", "c1"), db_id="shop", query="fix it",
                      issue_sql=["SELECT COUNT(*) FROM customer"], sol_sql=[sol], **kw)


# -- parsing ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("response, problem", [
    ("<solution>SELECT 1</solution>", "exactly one <thought>"),
    ("<thought>a</thought><solution>SELECT 1</solution><solution>SELECT 2</solution>", "exactly one <solution>"),
    ("Sure! <thought>a</thought><solution>SELECT 1</solution>", "nothing else around"),
    ("<thought>a</thought><solution>SELECT 1</solution> trailing", "nothing else around"),
    ("<solution>SELECT 1</solution><thought>a</thought>", "then <solution>"),
    ("<thought>a</thought><solution>   </solution>", "holds no SQL"),
    ("<thought> </thought><solution>SELECT 1</solution>", "is empty"),
    ("<thought>a</thought><solution>```sql\nSELECT 1</solution>", "holds no SQL"),
])
def test_malformed_single_turn_responses_are_rejected_with_a_reason(response, problem) -> None:
    ex = extract_single(response)
    assert not ex.format_ok and ex.sql is None and problem in ex.problem


def test_well_formed_responses_and_fences() -> None:
    ex = extract_single(single("```sql\nSELECT 1\n```"))
    assert ex.format_ok and ex.sql == "SELECT 1"
    assert extract_single(single(" SELECT 2 ")).sql == "SELECT 2"
    assert not extract_single("<think>a</think><answer>SELECT 1</answer>", "sqlr1").format_ok
    assert extract_single("<think>a</think><answer>```sql\nSELECT 1\n```</answer>", "sqlr1").sql == "SELECT 1"
    assert not extract_single(None).format_ok  # type: ignore[arg-type]


def test_agentic_extraction_takes_the_last_submission() -> None:
    calls = [ToolCall("execute_sql", {"sql": "SELECT 1"}), ToolCall("submit_solution", {"sql": "SELECT 2"}),
             {"name": "submit_solution", "arguments": {"sql": "SELECT 3"}},
             {"name": "submit_solution", "arguments": "not an object"}]
    assert extract_agentic(calls).sql == "SELECT 3"
    assert extract_agentic([ToolCall("execute_sql", {"sql": "SELECT 1"})]).problem == "no submit_solution call"
    assert not extract_agentic([{"name": "submit_solution", "arguments": {"sql": "  "}}]).format_ok


def test_gold_order_is_the_outer_querys_order_by() -> None:
    assert outer_order_by("SELECT name FROM customers ORDER BY name")
    assert not outer_order_by("SELECT * FROM (SELECT name FROM customers ORDER BY name LIMIT 3)")


# -- execution-match rewards ---------------------------------------------------------------------------

def test_ex_rewards_match_and_mismatch(judge) -> None:
    task = t2s("SELECT COUNT(*) FROM customers")
    ok = compute("bird_ex_single", task, single("SELECT count(customer_id) FROM customers"), judge)
    assert (ok.score, ok.parts, ok.reason) == (1.0, {"format": 1.0, "executed": 1.0, "result": 1.0}, "ok")
    bad = compute("bird_ex_single", task, single("SELECT COUNT(*) FROM orders"), judge)
    assert (bad.score, bad.reason, bad.excluded) == (0.0, "wrong-result", False)


def test_bird_and_spider_semantics_differ_on_duplicates_and_order(judge) -> None:
    first20 = "SELECT city FROM customers WHERE city IS NOT NULL ORDER BY customer_id LIMIT 20"
    task = t2s(first20)  # 20 rows over 8 cities: duplicates
    dup_free = single(f"SELECT DISTINCT city FROM ({first20})")
    assert compute("bird_ex_single", task, dup_free, judge).score == 1.0  # sets are equal
    assert compute("spider_ex_single", task, dup_free, judge).score == 0.0  # bags/order differ


def test_an_erroring_prediction_scores_zero_even_when_the_gold_result_is_empty(judge) -> None:
    empty_gold = t2s("SELECT name FROM customers WHERE 1 = 0")
    for response in (single("SELECT nme FROM customers WHERE 1 = 0"), single("SELEC oops")):
        b = compute("bird_ex_single", empty_gold, response, judge)
        assert b.score == 0.0 and b.reason.startswith("pred-error") and b.parts["executed"] == 0.0


def test_a_prediction_that_times_out_or_floods_scores_zero(judge) -> None:
    task = t2s("SELECT COUNT(*) FROM customers")
    slow = compute("bird_ex_single", task, single(RECURSIVE), judge)
    assert slow.score == 0.0 and "timeout" in slow.reason
    big = t2s("SELECT order_id FROM orders LIMIT 40", "t-big")
    flood = compute("bird_ex_single", big, single("SELECT order_id FROM orders"), judge)  # > 50 rows
    assert flood.score == 0.0 and "truncated" in flood.reason


def test_a_failing_gold_is_excluded_and_never_rewarded(judge) -> None:
    broken = t2s("SELECT no_such_column FROM customers")
    same_error = compute("bird_ex_single", broken, single("SELECT no_such_column FROM customers"), judge)
    assert same_error.excluded and same_error.score == 0.0 and same_error.reason.startswith("gold-error")
    runs = compute("bird_ex_single", broken, single("SELECT 1"), judge)
    assert runs.excluded and runs.score == 0.0
    assert batch_means([same_error, runs])["excluded"] == 2.0


def test_a_malformed_response_is_never_executed(demo_db_path) -> None:
    class Forbidden:
        def open_many(self, requests):
            raise AssertionError("executed SQL from a malformed response")

        def close_many(self, sessions):
            pass
    judge = Judge({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}}, sessions=Forbidden())
    b = compute("bird_ex_single", t2s("SELECT 1"), "SELECT 1", judge)
    assert b.score == 0.0 and b.reason.startswith("format")


def test_a_prediction_cannot_change_what_the_gold_sees(judge) -> None:
    task = t2s("SELECT COUNT(*) FROM customers")
    sneaky = single("DELETE FROM customers; SELECT COUNT(*) FROM customers")
    assert compute("bird_ex_single", task, sneaky, judge).score == 0.0  # 0 rows left in its scratch
    assert compute("bird_ex_single", task, single("SELECT COUNT(*) FROM customers"), judge).score == 1.0


def test_gold_runs_once_per_task_across_concurrent_rollouts(judge) -> None:
    task = t2s("SELECT name FROM customers ORDER BY customer_id LIMIT 5", "cached")
    results = []

    def rollout(i: int) -> None:
        results.append(compute("spider_ex_agentic", task, [ToolCall(
            "submit_solution", {"sql": "SELECT name FROM customers ORDER BY customer_id LIMIT 5"})], judge))

    threads = [threading.Thread(target=rollout, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [b.score for b in results] == [1.0] * 8
    assert judge.gold_executions == 1 and judge.gold_hits == 7


def test_agentic_reward_without_a_submission_scores_zero(judge) -> None:
    b = compute("bird_ex_agentic", t2s("SELECT 1"), [ToolCall("execute_sql", {"sql": "SELECT 1"})], judge)
    assert b.score == 0.0 and "no submit_solution" in b.reason
    b = compute("bird_ex_agentic", t2s("SELECT 1"), "a plain text response", judge)
    assert b.score == 0.0


def test_reward_and_task_type_must_agree(judge) -> None:
    with pytest.raises(ValueError, match="hybrid"):
        compute("bird_ex_single", critic("SELECT 1"), single("SELECT 1"), judge)


# -- debugging rewards ---------------------------------------------------------------------------------

def test_critic_reward_is_the_share_of_test_cases_passed(judge) -> None:
    task = critic("SELECT COUNT(*) FROM customers")
    assert compute("critic_single", task, single("SELECT COUNT(*) FROM customers"), judge).score == 1.0
    wrong = compute("critic_agentic", task, [ToolCall("submit_solution", {"sql": "SELECT COUNT(*) FROM customer"})], judge)
    assert wrong.score == 0.0 and wrong.parts["executed"] == 0.0 and "pred-error" in wrong.reason
    two = critic("SELECT 1", instance_id="c2", test_cases=[
        "def test_case(pred_sqls, sol_sqls, db_path, conn, conditions):\n    assert True\n",
        "def test_case(pred_sqls, sol_sqls, db_path, conn, conditions):\n    assert False, 'no'\n"])
    half = compute("critic_single", two, single("SELECT 1"), judge)
    assert half.score == 0.5 and half.parts["result"] == 0.5


def test_critic_with_a_broken_solution_is_excluded(judge) -> None:
    b = compute("critic_single", critic("SELECT nope FROM nowhere"), single("SELECT nope FROM nowhere"), judge)
    assert b.excluded and b.score == 0.0


# -- SQL-R1 --------------------------------------------------------------------------------------------

def sqlr1_response(sql: str, thought: str = "think") -> str:
    return f"<think>{thought}</think><answer>```sql\n{sql}\n```</answer>"


def test_sqlr1_progressive_parts(judge) -> None:
    task = t2s("SELECT COUNT(*) FROM customers")
    fmt = compute("sqlr1", task, single("SELECT COUNT(*) FROM customers"), judge)  # wrong tags
    assert fmt.parts == {"format": -1.0, "execution": 0.0, "result": 0.0, "length": 0.0} and fmt.score == -1.0
    err = compute("sqlr1", task, sqlr1_response("SELECT nope FROM customers"), judge)
    assert err.parts == {"format": 1.0, "execution": -2.0, "result": 0.0, "length": 0.0} and err.score == -1.0
    wrong = compute("sqlr1", task, sqlr1_response("SELECT COUNT(*) FROM orders"), judge)
    assert wrong.parts == {"format": 1.0, "execution": 2.0, "result": -3.0, "length": 0.0}
    right = compute("sqlr1", task, sqlr1_response("SELECT COUNT(*) FROM customers"), judge)
    assert right.parts["result"] == 3.0 and 0.0 < right.parts["length"] <= 1.0
    assert right.score == pytest.approx(6.0 + right.parts["length"])


def test_sqlr1_length_term_and_over_length_penalty(judge) -> None:
    task = t2s("SELECT COUNT(*) FROM customers")
    cfg = RewardConfig(sqlr1=SQLR1Config(max_length=200))
    short = compute("sqlr1", task, sqlr1_response("SELECT COUNT(*) FROM customers"), judge, cfg)
    longer = compute("sqlr1", task, sqlr1_response("SELECT COUNT(*) FROM customers", "t" * 100), judge, cfg)
    assert longer.parts["length"] > short.parts["length"]
    over = compute("sqlr1", task, sqlr1_response("SELECT COUNT(*) FROM customers", "t" * 300), judge, cfg)
    assert over.parts["length"] == -0.5 and over.score == pytest.approx(5.5)


def test_sqlr1_constants_come_from_config() -> None:
    cfg = RewardConfig(sqlr1=SQLR1Config(format=0.5, execution=1.0, result=4.0))
    v = ExecVerdict(True, False, False)
    ex = extract_single(sqlr1_response("SELECT 1"), "sqlr1")
    assert score("sqlr1", t2s("SELECT 1"), ex, v, cfg).parts == {
        "format": 0.5, "execution": 1.0, "result": -4.0, "length": 0.0}


# -- hybrid ---------------------------------------------------------------------------------------------

def test_hybrid_routes_by_task_type_with_identical_keys(judge) -> None:
    items = [(t2s("SELECT COUNT(*) FROM customers"), single("SELECT COUNT(*) FROM customers")),
             (critic("SELECT COUNT(*) FROM products"), single("SELECT COUNT(*) FROM products")),
             (t2s("SELECT COUNT(*) FROM orders", "t3"), "garbage")]
    out = [compute("hybrid_single", t, r, judge) for t, r in items]
    assert [b.score for b in out] == [1.0, 1.0, 0.0]
    assert {tuple(b.parts) for b in out} == {("format", "executed", "result", "is_critic")}
    assert [b.parts["is_critic"] for b in out] == [0.0, 1.0, 0.0]


def test_every_registered_reward_is_fail_closed_on_garbage(judge) -> None:
    for name, spec in REWARDS.items():
        task = critic("SELECT 1") if spec.task_kind == "critic" else t2s("SELECT 1")
        b = compute(name, task, "¯\\_(ツ)_/¯", judge)
        assert b.score <= 0.0 and not b.excluded, name
        assert tuple(b.parts) == spec.keys, name


# -- shaping (RL only) -----------------------------------------------------------------------------

def test_shaped_hybrid_lifts_only_a_well_formed_answer_that_ran(judge) -> None:
    gold = "SELECT COUNT(*) FROM customers"
    cases = {"solved": (t2s(gold), single(gold)),
             "wrong": (t2s(gold), single("SELECT COUNT(*) FROM products")),
             "error": (t2s(gold), single("SELECT nope FROM nowhere")),
             "malformed": (t2s(gold), "garbage"),
             "gold-broken": (t2s("SELECT * FROM no_such_table"), single(gold)),
             "critic-solved": (critic("SELECT COUNT(*) FROM products"), single("SELECT COUNT(*) FROM products"))}
    want = {"solved": 1.0, "wrong": 0.1, "error": 0.0, "malformed": 0.0, "gold-broken": 0.0, "critic-solved": 1.0}
    for name, (task, response) in cases.items():
        plain, shaped = compute("hybrid_single", task, response, judge), compute("hybrid_single_shaped", task, response, judge)
        assert shaped.score == pytest.approx(want[name]), name
        assert shaped.parts == plain.parts and shaped.excluded == plain.excluded, name  # success never counts it
    assert compute("hybrid_single_shaped", *cases["gold-broken"], judge).excluded


def test_shaped_agentic_ranks_a_runnable_submission_above_running_out_of_turns(judge) -> None:
    task = t2s("SELECT COUNT(*) FROM customers")
    submitted = [ToolCall("execute_sql", {"sql": "SELECT 1"}), ToolCall("submit_solution", {"sql": "SELECT COUNT(*) FROM orders"})]
    out_of_turns = [ToolCall("execute_sql", {"sql": "SELECT 1"})] * 3
    assert compute("hybrid_agentic", task, submitted, judge).score == 0.0
    assert compute("hybrid_agentic_shaped", task, submitted, judge).score == pytest.approx(0.1)
    assert compute("hybrid_agentic_shaped", task, out_of_turns, judge).score == 0.0


def test_a_floor_outside_zero_to_one_is_refused() -> None:
    from sqlrl.rewards.registry import RewardSpec

    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="executed_floor"):
            RewardSpec("x", "any", "single", None, executed_floor=bad)


# -- the floor needs the engine's word that the answer only read (docs/rewards.md) ----------------

WRITES = [  # each runs on SQLite (or is refused by it) and none is a correct answer
    "DELETE FROM orders",
    "DROP TABLE order_items",
    "UPDATE customers SET city = 'Oslo'",
    "INSERT INTO customers (name, joined) VALUES ('x', '2024-01-01')",
    "CREATE TABLE t (x INTEGER)",
    "CREATE TEMP TABLE t (x INTEGER)",
    "CREATE TEMP TABLE t AS SELECT COUNT(*) FROM products",
    "CREATE VIEW v AS SELECT 1",
    "PRAGMA user_version = 5",  # refused by the sandbox: an error, 0 anyway
    "PRAGMA table_info(customers)",  # a read-only pragma, but no PRAGMA earns the floor
    "DELETE FROM orders RETURNING *",
    "WITH x AS (SELECT 1) DELETE FROM orders WHERE order_id IN (SELECT * FROM x) RETURNING *",
    "UPDATE products SET stock = stock RETURNING stock",
    "REINDEX",  # SQLite's authorizer reports no action for it: not attested as a read
    "ANALYZE",
    "DELETE FROM orders WHERE 0",  # wrote no row, but is no read
    "SELECT COUNT(*) FROM products; DELETE FROM orders",
    "DELETE FROM orders; SELECT COUNT(*) FROM products",  # ends in a SELECT: still wrote
]


@pytest.mark.parametrize("sql", WRITES)
def test_a_runnable_statement_that_is_not_a_read_earns_no_floor(judge, sql) -> None:
    task = t2s("SELECT COUNT(*) FROM customers")
    plain = compute("hybrid_single", task, single(sql), judge)
    shaped = compute("hybrid_single_shaped", task, single(sql), judge)
    assert shaped.score == plain.score == 0.0, (sql, shaped)
    assert shaped.parts == plain.parts and not shaped.excluded
    assert shaped.read_only is not True
    if plain.parts["executed"]:  # it ran: the engine saw the write
        assert shaped.read_only is False
    agentic = [ToolCall("submit_solution", {"sql": sql})]
    assert compute("hybrid_agentic_shaped", task, agentic, judge).score == 0.0


def test_a_runnable_read_earns_the_floor_and_a_solved_task_scores_one_whatever_it_runs(judge) -> None:
    task = t2s("SELECT COUNT(*) FROM customers")
    wrong = compute("hybrid_single_shaped", task, single("SELECT COUNT(*) FROM products"), judge)
    assert (wrong.score, wrong.read_only) == (pytest.approx(0.1), True)
    for read in ("WITH c AS (SELECT * FROM customers) SELECT city, COUNT(*) FROM c GROUP BY city",
                 "SELECT COUNT(*) FROM delivered_orders", "VALUES (1)",
                 "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5) SELECT * FROM c"):
        assert compute("hybrid_single_shaped", task, single(read), judge).score == pytest.approx(0.1), read
    right = compute("hybrid_single_shaped", task, single("SELECT COUNT(customer_id) FROM customers"), judge)
    assert (right.score, right.read_only) == (1.0, True)
    # a correct result reached through a write still scores exactly 1 (success is the task's word)
    via_temp = single("CREATE TEMP TABLE n AS SELECT COUNT(*) AS c FROM customers; SELECT c FROM n")
    solved = compute("hybrid_single_shaped", task, via_temp, judge)
    assert (solved.score, solved.reason, solved.read_only) == (1.0, "ok", False)


def test_a_debugging_tasks_dml_fix_scores_one_and_a_wrong_dml_fix_no_floor(judge) -> None:
    preprocess = ["CREATE TABLE stock_log AS SELECT product_id, stock FROM products"]
    task = CriticTask(instance_id="c-dml", db_id="shop", query="fill the missing stock",
                      issue_sql=["SELECT * FROM stock_log"], preprocess_sql=preprocess,
                      sol_sql=["UPDATE stock_log SET stock = 0 WHERE stock IS NULL",
                               "SELECT product_id, stock FROM stock_log"])
    fix = single("UPDATE stock_log SET stock = COALESCE(stock, 0); SELECT * FROM stock_log")
    solved = compute("hybrid_single_shaped", task, fix, judge)
    assert (solved.score, solved.read_only, solved.parts["is_critic"]) == (1.0, False, 1.0)
    bad_fix = single("UPDATE stock_log SET stock = 1; SELECT * FROM stock_log")
    bad = compute("hybrid_single_shaped", task, bad_fix, judge)
    assert (bad.score, bad.read_only, bad.parts["executed"]) == (0.0, False, 1.0)
    read = compute("hybrid_single_shaped", task, single("SELECT * FROM stock_log"), judge)
    assert (read.score, read.read_only) == (pytest.approx(0.1), True)


@pytest.mark.parametrize("read_only, want", [(True, 0.1), (None, 0.0), (False, 0.0)])
def test_only_an_attested_read_earns_the_floor(read_only, want) -> None:
    """None -- an engine that gives no attestation (MariaDB/MySQL, SQL Server, Oracle) or a
    statement it cannot judge -- is not enough: the floor is never guessed from the SQL text."""
    task, ex = t2s("SELECT 1"), extract_single(single("SELECT 2"))
    verdict = ExecVerdict(True, False, False, read_only=read_only)
    assert score("hybrid_single_shaped", task, ex, verdict).score == pytest.approx(want)
    assert score("hybrid_single", task, ex, verdict).score == 0.0
    right = ExecVerdict(True, True, True, read_only=read_only)
    assert score("hybrid_single_shaped", task, ex, right).score == 1.0
