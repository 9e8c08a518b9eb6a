"""Debugging (BIRD-CRITIC) tasks through the training gateway: the claim's ``task`` is the kind's
public payload (``TaskKind.payload`` + the common fields; nothing of the answer), the rollout's
session has the task's ``preprocess_sql`` run, completion is scored by the server's Judge for the
critic kind (the fix > 0, the issue SQL 0, a forged reward refused), kinds the gateway does not
hand out (or its reward cannot score) are refused at ``offer``, and the journal brings a critic task
back as one. Real HTTP on loopback, the scripted engine; events, not time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sqlrl.gateway.rollouts import GatewayConfig
from sqlrl.policy.scripted import ScriptedEngine
from sqlrl.tasks.kinds import PAYLOAD_COMMON, get_kind, kinds, task_from_dict
from sqlrl.tasks.types import CriticTask

from .conftest import KEY, gateway, shop_task

PROBLEM = "I need the number of VIP customers, but my query counts every customer."
ISSUE = "SELECT count(*) FROM customers"
FIX = "SELECT count(*) FROM vip"
SCENE = ("CREATE TABLE vip (customer_id INTEGER PRIMARY KEY)", "INSERT INTO vip VALUES (1), (2), (3)")


def critic_task(task_id: str = "c1") -> CriticTask:
    return CriticTask(task_id, "shop", PROBLEM, issue_sql=(ISSUE,), sol_sql=(FIX,), preprocess_sql=SCENE,
                      clean_up_sql=("DROP TABLE vip",), conditions={"order": False}, difficulty="simple",
                      category="Query", source="test/critic", meta={"bug": "counts the wrong table"})


@pytest.fixture
def gw(tiny, shop_catalog):
    from sqlrl.tasks.schema import DatabaseSchema

    path = shop_catalog["shop"]["sqlite"][len("sqlite:///"):]
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=[])
    with gateway(tiny, engine, shop_catalog, window=4096,
                 schemas={"shop": DatabaseSchema.from_sqlite(path, db_id="shop")}) as g:
        yield g


def test_a_claim_shows_the_critic_payload_and_nothing_of_the_answer(gw):
    from sqlrl.agent.prompts import build_messages
    from sqlrl.agent.request import request_from_task

    task = critic_task()
    gw.rollouts.offer("g1", task, 1)
    r = gw.post("/v1/rollouts")
    assert r.status_code == 200, r.text
    claim = r.json()
    shown = claim["task"]
    assert shown["schema"].startswith("CREATE TABLE customers")
    assert {k: v for k, v in shown.items() if k != "schema"} == {
        "kind": "critic", "task_id": "c1", "database": "shop", "dialect": "sqlite",
        "job": get_kind("critic").job,
        "prompt": build_messages(request_from_task(task), None)[1]["content"],  # the built-in agent's user message
        "problem": PROBLEM, "issue_sql": [ISSUE]}
    assert ISSUE in shown["prompt"] and PROBLEM in shown["prompt"]
    # nothing of the answer, the tests, the scene or meta reaches the client
    text = r.text
    for secret in (FIX, "vip VALUES", "counts the wrong table", "sol_sql", "test_cases", "clean_up_sql"):
        assert secret not in text


def test_a_text2sql_claim_keeps_its_fields_and_says_its_kind(gw):
    gw.rollouts.offer("g1", shop_task(), 1)
    shown = gw.claim()["task"]
    assert shown["kind"] == "text2sql" and shown["question"] == shop_task().question
    assert shown["evidence"] == "count rows" and shown["task_id"] == "t1" and shown["database"] == "shop"
    assert shop_task().gold_sql not in json.dumps(shown)


def test_the_rollout_session_has_the_scene_and_the_judge_scores_the_fix(gw):
    gw.rollouts.offer("g1", critic_task(), 3)
    fix, wrong, vandal = gw.claim(), gw.claim(), gw.claim()
    sql = lambda c, q: gw.post(c["session_url"][len(gw.url):], {"sql": q}).json()  # noqa: E731
    assert sql(fix, FIX) == {"observation": "count(*)\n3\n(1 row)", "is_error": False}  # preprocess_sql ran
    assert sql(wrong, ISSUE)["observation"] == "count(*)\n60\n(1 row)"
    # the agent changes its own session; the Judge grades on fresh ones: the fix still scores
    assert sql(vandal, "DELETE FROM vip")["is_error"] is False and sql(vandal, FIX)["observation"].startswith("count(*)\n0")

    def complete(c, final):
        r = gw.post(c["complete_url"][len(gw.url):], {"sql": final})
        assert r.status_code == 200, r.text
        return r.json()["reward"]

    assert complete(fix, FIX) > 0 and complete(vandal, FIX) > 0
    assert complete(wrong, ISSUE) == 0.0
    traces = {t.rollout_id: t for t in gw.rollouts.drain()}
    assert traces[fix["rollout_id"]].reward_parts["is_critic"] == 1.0 and traces[fix["rollout_id"]].task_id == "c1"
    assert traces[wrong["rollout_id"]].reward_source == "judge"
    assert gw.pool.stats().in_use == 0


def test_a_forged_reward_is_refused_and_the_rollout_stays_open(gw):
    gw.rollouts.offer("g1", critic_task(), 1)
    c = gw.claim()
    r = gw.post(c["complete_url"][len(gw.url):], {"reward": 1.0})
    assert r.status_code == 403 and r.json()["error"]["code"] == "client_rewards_not_allowed"
    r = gw.post(c["complete_url"][len(gw.url):], {"sql": ISSUE})
    assert r.status_code == 200 and r.json()["reward"] == 0.0


def test_offer_refuses_kinds_not_handed_out_or_not_scored(shop_catalog):
    from sqlrl.db import SessionPool
    from sqlrl.db.source import LocalSessions
    from sqlrl.gateway.rollouts import JudgeScorer, NoWorkNow, Rollouts
    from sqlrl.rewards import Judge

    with pytest.raises(ValueError, match="unknown task kind 'nope'"):
        GatewayConfig(task_kinds=("nope",))
    with pytest.raises(ValueError, match="scores text2sql tasks, not critic"):
        GatewayConfig(task_kinds=("critic",), reward="bird_ex_agentic")
    pool = SessionPool()
    try:
        for config, refused in ((GatewayConfig(task_kinds=("text2sql",)), critic_task()),
                                (GatewayConfig(reward="bird_ex_agentic"), critic_task()),
                                (GatewayConfig(reward="critic_agentic"), shop_task())):
            r = Rollouts(config, LocalSessions(shop_catalog, pool=pool), JudgeScorer(Judge(shop_catalog), config.reward))
            with pytest.raises(ValueError, match="offer of"):
                r.offer("g", refused, 1)
            assert r.stats().waiting == 0
        # a job that offers text2sql only: every claim is text2sql, a critic task never appears
        r = Rollouts(GatewayConfig(task_kinds=("text2sql",)), LocalSessions(shop_catalog, pool=pool),
                     JudgeScorer(Judge(shop_catalog)))
        r.offer("g1", shop_task("t1"), 2)
        with pytest.raises(ValueError):
            r.offer("g2", critic_task(), 1)
        r.offer("g3", shop_task("t2"), 1)
        shown = [r.claim(KEY).task_payload()["kind"] for _ in range(3)]
        assert shown == ["text2sql"] * 3
        with pytest.raises(NoWorkNow):
            r.claim(KEY)
        r.close()
    finally:
        pool.close()


def test_a_critic_task_record_round_trips_and_the_journal_keeps_the_kind(shop_catalog, tmp_path):
    from sqlrl.db import SessionPool
    from sqlrl.db.source import LocalSessions
    from sqlrl.gateway.journal import Journal, replay
    from sqlrl.gateway.rollouts import JudgeScorer, Rollouts
    from sqlrl.rewards import Judge

    task = critic_task()
    back = task_from_dict(json.loads(json.dumps(task.to_dict())))  # what the journal holds, as JSON
    assert isinstance(back, CriticTask) and back == task and back.to_dict() == task.to_dict()
    assert back.conditions == {"order": False} and back.meta == {"bug": "counts the wrong table"}

    path = tmp_path / "journal.jsonl"
    pool = SessionPool()
    try:
        def rollouts():
            return Rollouts(GatewayConfig(), LocalSessions(shop_catalog, pool=pool), JudgeScorer(Judge(shop_catalog)),
                            journal=Journal(path))

        first = rollouts()
        first.offer("g1", task, 3, token="o1")
        first.offer("g2", shop_task(), 1, token="o2")
        done, live = first.claim(KEY), first.claim(KEY)  # one completed, one live at the "crash"
        first.complete(KEY, done.rollout_id, sql=FIX)
        assert replay(path).counts["claimed"] == 2  # the critic claims matched their offers

        second = rollouts()  # a new incarnation on the same journal (the first is abandoned)
        ended = {t.rollout_id: t for t in second.drain()}
        assert ended[done.rollout_id].status == "completed" and ended[done.rollout_id].reward > 0
        assert ended[live.rollout_id].status == "expired" and ended[live.rollout_id].task_id == "c1"
        waiting = second.claim(KEY)  # the critic offer not claimed waits again, as a critic task
        assert isinstance(waiting.task, CriticTask) and waiting.task.to_dict() == task.to_dict()
        assert waiting.task_payload()["issue_sql"] == [ISSUE]
        assert second.execute_sql(KEY, waiting.rollout_id, FIX)[0] == "count(*)\n3\n(1 row)"
        assert second.claim(KEY).task_payload()["kind"] == "text2sql"
        second.close()
        first.close()
    finally:
        pool.close()


def test_every_kind_declares_its_payload_and_the_docs_name_it():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "gateway.md").read_text()
    for kind in kinds():
        assert kind.payload, f"{kind.name} declares no public payload"
        for field in kind.payload:
            assert field.name not in PAYLOAD_COMMON and f"`{field.name}`" in doc, (kind.name, field.name)
    for name in PAYLOAD_COMMON:
        assert f'"{name}"' in doc or f"`{name}`" in doc, name


def test_a_new_kind_is_handed_out_with_its_declared_payload_and_no_gateway_edit(gw):
    """The test-only ``rewrite`` kind (tests/unit/test_fake_task_kind.py) with a payload declared in
    its registry entry: claimed, shown, scored by the Judge -- nothing of the gateway edited."""
    import dataclasses

    from sqlrl.tasks.kinds import PayloadField, registered
    from tests.unit.test_fake_task_kind import GOLD as RW_GOLD
    from tests.unit.test_fake_task_kind import ORIGINAL, REWRITE, rewrite

    kind = dataclasses.replace(REWRITE, payload=(
        PayloadField("ask", str, "how to rewrite it", lambda r: r.ask),
        PayloadField("original_sql", str, "the working query", lambda r: r.original_sql)))
    with registered(kind):
        gw.rollouts.offer("g1", rewrite(), 2)
        good, bad = gw.claim(), gw.claim()
        shown = good["task"]
        assert (shown["kind"], shown["task_id"], shown["original_sql"], shown["ask"]) == (
            "rewrite", "rw0", ORIGINAL, rewrite().ask)
        assert RW_GOLD not in json.dumps(shown) and "gold_sql" not in shown
        rewards = [gw.post(c["complete_url"][len(gw.url):], {"sql": sql}).json()["reward"]
                   for c, sql in ((good, RW_GOLD), (bad, "SELECT 1"))]
    assert rewards[0] > 0 and rewards[1] == 0.0


def test_a_payload_field_of_the_wrong_type_is_refused():
    from sqlrl.tasks.kinds import PayloadField

    with pytest.raises(ValueError, match="not one of"):
        PayloadField("kind", str, "shadows a common field", lambda r: "x")
    with pytest.raises(ValueError, match="type must be str or list"):
        PayloadField("n", int, "a number", lambda r: 1)
    with pytest.raises(TypeError, match="must be a list of strings"):
        PayloadField("sqls", list, "statements", lambda r: "SELECT 1").value(object())
