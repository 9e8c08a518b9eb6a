"""Self-consistency voting (the documented rule) and prediction writers read back by the evaluators."""

from __future__ import annotations

import pytest

from sqlrl.db import open_session
from sqlrl.db.types import ErrorKind, QueryResult
from sqlrl.eval.bird import read_bird_pred
from sqlrl.eval.critic_eval import read_predictions
from sqlrl.eval.spider import read_spider_pred
from sqlrl.eval.vote import vote
from sqlrl.eval.writers import write_bird, write_critic, write_spider


def canned(results: dict[str, QueryResult]):
    return lambda sql: results[sql]


def ok(*rows) -> QueryResult:
    return QueryResult(columns=("a",), rows=tuple(rows), row_count=len(rows))


BAD = QueryResult.failure(ErrorKind.RUNTIME, "no such column")


def test_majority_over_results_not_over_sql_text() -> None:
    results = {"A": ok((1,), (2,)), "B": ok((2,), (1.0,)), "C": ok((3,)), "D": BAD}
    v = vote(["C", "A", "B", "D"], canned(results))
    assert (v.sql, v.index, v.votes, v.groups, v.failed) == ("A", 1, 2, 2, 1)


def test_order_matters_only_when_the_candidate_orders() -> None:
    results = {"SELECT a FROM t ORDER BY a": ok((1,), (2,)), "SELECT a FROM t ORDER BY a DESC": ok((2,), (1,)),
               "SELECT a FROM t": ok((2,), (1,))}
    v = vote(list(results), canned(results))
    assert v.groups == 3 and v.votes == 1


def test_ties_break_on_log_probability_then_sampling_order() -> None:
    results = {"A": ok((1,)), "B": ok((2,))}
    assert vote(["A", "B"], canned(results)).sql == "A"
    assert vote(["A", "B"], canned(results), logprobs=[-2.0, -0.5]).sql == "B"
    assert vote(["A", "B"], canned(results), logprobs=[None, None]).sql == "A"


def test_failed_and_empty_candidates_get_no_vote() -> None:
    results = {"A": BAD, "B": QueryResult(columns=("a",), rows=((1,),), row_count=1, truncated=True)}
    v = vote([None, "A", "B"], canned(results))
    assert v.unanimous_failure and v.sql == "A" and v.failed == 3
    assert vote([None, "  "], canned({})).sql is None


def test_vote_on_a_real_database(demo_db_path) -> None:
    def execute(sql: str) -> QueryResult:
        with open_session(f"sqlite:///{demo_db_path}") as s:
            return s.execute(sql)
    v = vote(["SELECT COUNT(*) FROM customers", "SELECT COUNT(customer_id) FROM customers",
              "SELECT COUNT(*) FROM orders", "SELECT nope FROM customers"], execute)
    assert (v.index, v.votes, v.failed) == (0, 2, 1)


def test_writers_round_trip_through_the_evaluators_readers(tmp_path) -> None:
    sqls = ["SELECT a\nFROM t", None, "SELECT 'x'"]
    assert read_spider_pred(write_spider(tmp_path / "p.sql", sqls)) == ["SELECT a FROM t", "SELECT 1", "SELECT 'x'"]
    assert read_bird_pred(write_bird(tmp_path / "p.json", sqls, ["d1", "d2", "d3"])) == [
        "SELECT a FROM t", "SELECT 1", "SELECT 'x'"]
    with pytest.raises(ValueError, match="database ids"):
        write_bird(tmp_path / "x.json", sqls, ["d1"])
    path = write_critic(tmp_path / "c.jsonl", [("i1", ["UPDATE t SET a = 1", "SELECT a FROM t"]),
                                               ("i2", "SELECT 1"), ("i3", None)])
    assert read_predictions(path) == {"i1": ["UPDATE t SET a = 1", "SELECT a FROM t"], "i2": ["SELECT 1"], "i3": []}
