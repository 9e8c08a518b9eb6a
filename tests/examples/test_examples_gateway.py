"""The example clients against a fake of the gateway's contract (tests/examples/fake_gateway.py):
claim -> run the agent unchanged -> SQL on the session URL -> complete, until 410; the tags each
call sends; 204 waits; an agent failure left to expire; a completion after expiry (409); K client
processes. The local SQLite executor used at serving: read-only, errors as observations."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytest.importorskip("langgraph", reason="the agents extra (langgraph, langchain-openai) is not installed")

from examples.run_clients import client_loop, load_agent, run_clients  # noqa: E402
from examples.sql_exec import SQLiteExecutor, executor_for, load_task  # noqa: E402
from sqlrl.tasks.demo_db import build_demo_database  # noqa: E402
from sqlrl.tasks.schema import DatabaseSchema  # noqa: E402

from .fake_gateway import GOLD, KEY, FakeGateway, Served  # noqa: E402

QUESTION = "How many customers are there?"


@pytest.fixture(scope="module")
def shop(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("shop") / "shop.sqlite"
    build_demo_database(str(db))
    return db


def task(shop: Path, question: str = QUESTION, i: int = 0) -> dict:
    return {"task_id": f"t{i}", "question": question, "evidence": "", "database": "shop", "dialect": "sqlite",
            "schema": DatabaseSchema.from_sqlite(shop).to_create_sql()}


def by_rollout(fake: FakeGateway, key: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for c in fake.calls:
        out.setdefault(c["rollout_id"], []).append(c[key])
    return out


def test_the_langgraph_agent_claims_runs_on_the_session_and_completes(shop):
    fake = FakeGateway(str(shop), [task(shop)], waits=2)
    with Served(fake.app) as gw:
        report = client_loop(0, gw.url, KEY, "langgraph", {"max_turns": 3})
    assert (report.claimed, report.completed, report.waits, report.failed) == (1, 1, 2, 0)
    assert report.rewards == [1.0]
    (rid,) = fake.rollouts
    assert by_rollout(fake, "tag") == {rid: ["write", "check", "rewrite", "check"]}  # header X-Sqlrl-Tag
    assert [s for _, s in fake.sql] == ["SELECT count(nme) FROM customers", GOLD]  # on the session URL
    assert fake.completed == [(rid, GOLD, 1.0)]


def test_the_openai_client_agent_sends_its_tag_and_tools_and_completes(shop):
    fake = FakeGateway(str(shop), [task(shop)], waits=0)
    with Served(fake.app) as gw:
        report = client_loop(0, gw.url, KEY, "openai", {"max_turns": 3})
    assert (report.completed, report.rewards) == (1, [1.0])
    assert [c["tag"] for c in fake.calls] == ["agent"] * 3  # metadata.tag
    assert all(c["tools"] == ["execute_sql"] for c in fake.calls)
    # one growing conversation: the tool results come back as tool messages
    assert [c["roles"] for c in fake.calls] == [
        ["system", "user"], ["system", "user", "assistant", "tool"],
        ["system", "user", "assistant", "tool", "assistant", "tool"]]
    assert [s for _, s in fake.sql] == ["SELECT nme FROM customers", GOLD]
    assert [sql for _, sql, _ in fake.completed] == [GOLD]


def test_a_failing_agent_leaves_its_rollout_to_expire_and_a_late_completion_is_counted(shop):
    fake = FakeGateway(str(shop), [task(shop, "BROKEN: how many customers?", 0), task(shop, i=1),
                                   task(shop, "LATE: how many customers?", 2)],
                       waits=0, fail_chat={"BROKEN: how many customers?"}, expire={"LATE: how many customers?"})
    with Served(fake.app) as gw:
        report = client_loop(0, gw.url, KEY, "langgraph", {"max_turns": 3, "max_retries": 0})
    assert (report.claimed, report.completed, report.failed, report.expired) == (3, 1, 1, 1)
    assert "500" in report.errors[0] and "engine failed" in report.errors[0]
    statuses = sorted(r.status for r in fake.rollouts.values())
    assert statuses == ["completed", "expired", "running"]  # the failed one: never completed, expires there


def test_a_completion_the_restarted_jobs_gateway_does_not_know_is_counted_lost_and_the_client_goes_on(shop):
    fake = FakeGateway(str(shop), [task(shop, "GONE: how many customers?", 0), task(shop, i=1)], waits=0,
                       forget={"GONE: how many customers?"})
    with Served(fake.app) as gw:
        report = client_loop(0, gw.url, KEY, "openai", {"max_turns": 3})
    assert (report.claimed, report.completed, report.lost, report.expired) == (2, 1, 1, 0)


@pytest.mark.slow
def test_k_client_processes_drain_the_gateway(shop):
    fake = FakeGateway(str(shop), [task(shop, i=i) for i in range(4)], waits=1)
    with Served(fake.app) as gw:
        codes = run_clients(gw.url, KEY, "langgraph", 2, {"max_turns": 3})
    assert codes == [0, 0]
    assert len(fake.completed) == 4 and all(reward == 1.0 for _, _, reward in fake.completed)
    assert all(tags == ["write", "check", "rewrite", "check"] for tags in by_rollout(fake, "tag").values())
    assert len(by_rollout(fake, "tag")) == 4


def test_bad_runner_input_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="unknown agent"):
        load_agent("crewai")
    with pytest.raises(ValueError, match="unknown agent"):
        run_clients("http://127.0.0.1:9", KEY, "crewai", 2)


def test_the_local_sqlite_executor_is_read_only_and_reports_errors(shop):
    before = hashlib.sha256(shop.read_bytes()).hexdigest()
    execute = executor_for({"question": QUESTION}, "unused", shop)
    observation, is_error = execute("DROP TABLE customers")
    assert is_error and "readonly" in observation.replace(" ", "").lower()
    observation, is_error = execute("SELECT nme FROM customers")
    assert is_error and "no such column" in observation
    observation, is_error = execute("SELECT customer_id FROM customers ORDER BY customer_id")
    assert not is_error and observation.splitlines()[0] == "customer_id" and "more than 20 rows" in observation
    assert hashlib.sha256(shop.read_bytes()).hexdigest() == before
    filled = load_task({"question": QUESTION}, execute)
    assert "CREATE TABLE customers" in filled["schema"] and filled["dialect"] == "sqlite"
    with pytest.raises(ValueError, match="session_url"):
        executor_for({"question": QUESTION}, "k")
    with pytest.raises(FileNotFoundError):
        SQLiteExecutor(shop.parent / "missing.sqlite")


def test_the_jobs_client_command_passes_a_key_that_starts_with_a_dash(monkeypatch):
    """A gateway key is ``secrets.token_urlsafe``, which can start with "-": ``start_clients``
    must hand it to ``run_clients`` as the key, not as an option (it once failed with
    "argument --api-key: expected one argument")."""
    import subprocess

    import examples.run_clients as rc
    from jobs.train_agent import start_clients

    started, seen = [], []
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **_: started.append(argv))
    monkeypatch.setattr(rc, "run_clients", lambda url, key, *a, **k: seen.append((url, key)) or [0])
    start_clients("http://127.0.0.1:1", "-Xk3y", "openai", 1)
    argv = started[0]
    assert argv[1:3] == ["-m", "examples.run_clients"]
    assert rc.main(argv[3:]) == 0
    assert seen == [("http://127.0.0.1:1", "-Xk3y")]


@pytest.mark.parametrize("agent", ["langgraph", "openai"])
def test_a_task_of_a_kind_the_agent_does_not_handle_is_refused_and_left_to_expire(shop, agent):
    other = {**task(shop, i=0), "kind": "sql-rewrite"}  # a kind neither example agent handles
    fake = FakeGateway(str(shop), [other, task(shop, i=1)], waits=0)
    with Served(fake.app) as gw:
        report = client_loop(0, gw.url, KEY, agent, {"max_turns": 3})
    assert (report.claimed, report.refused, report.completed, report.failed) == (2, 1, 1, 0)
    assert "refused" in report.errors[0] and "'sql-rewrite' task" in report.errors[0]
    refused = next(r for r in fake.rollouts.values() if r.task["task_id"] == "t0")
    assert refused.status == "running"  # never completed: the gateway expires it at its deadline
    assert {c["rollout_id"] for c in fake.calls} == {r.rollout_id for r in fake.rollouts.values()} - {refused.rollout_id}
