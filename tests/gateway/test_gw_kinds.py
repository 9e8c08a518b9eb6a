"""Clients declare the task kinds they take when they claim (``POST /v1/rollouts {"kinds": [...]}``):
the gateway hands them only tasks of those kinds, in offer order; 204 while none of them waits,
410 once the job is done with them; every bad declaration is a clear 400 naming the known kinds, and
kinds the job does not hand out are a 409 at once, never a wait. The claim queue itself
(``sqlrl.gateway.waiting``) keeps offer order across kinds. Real HTTP on loopback; events, not time."""

from __future__ import annotations

import pytest

from sqlrl.gateway.rollouts import GatewayConfig
from sqlrl.gateway.waiting import Waiting
from sqlrl.policy.scripted import ScriptedEngine

from .conftest import gateway, shop_task
from .test_gw_critic import critic_task


@pytest.fixture
def engine(tiny):
    return ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=[])


@pytest.fixture
def gw(tiny, shop_catalog, engine):
    with gateway(tiny, engine, shop_catalog, window=4096) as g:
        yield g


def claim(gw, body):
    r = gw.post("/v1/rollouts", body)
    return r.status_code, (r.json() if r.status_code not in (204, 410) and r.content else None), r


def test_a_client_gets_only_the_kinds_it_declared_in_offer_order(gw):
    gw.rollouts.offer("g1", critic_task("c1"), 1)
    gw.rollouts.offer("g2", shop_task("t1"), 1)
    gw.rollouts.offer("g3", critic_task("c2"), 1)
    gw.rollouts.offer("g4", shop_task("t2"), 1)
    status, got, _ = claim(gw, {"kinds": ["text2sql"]})
    assert status == 200 and got["task"]["task_id"] == "t1"  # past the critic task offered first
    status, got, _ = claim(gw, {})  # no declaration: any kind, the earliest
    assert status == 200 and got["task"]["task_id"] == "c1"
    status, got, _ = claim(gw, {"kinds": None})
    assert status == 200 and got["task"]["task_id"] == "c2"
    status, got, _ = claim(gw, {"kinds": ["critic"]})
    assert status == 204  # only a text2sql task waits: not this client's; it asks again later
    status, got, _ = claim(gw, {"kinds": ["critic", "text2sql"]})
    assert status == 200 and got["task"]["task_id"] == "t2"
    assert gw.rollouts.stats().claimed == 4 and gw.rollouts.stats().waiting == 0


def test_a_finished_job_is_410_for_kinds_with_nothing_left_while_others_still_claim(gw):
    gw.rollouts.offer("g1", critic_task(), 1)
    gw.rollouts.finish()
    status, _, r = claim(gw, {"kinds": ["text2sql"]})
    assert status == 410 and "of these kinds" in r.json()["error"]["message"]
    status, got, _ = claim(gw, {"kinds": ["critic"]})
    assert status == 200 and got["task"]["kind"] == "critic"
    assert claim(gw, {})[0] == 410


@pytest.mark.parametrize("body, param, says", [
    ({"kinds": "text2sql"}, "kinds", "list"),
    ({"kinds": [3]}, "kinds", "string"),
    ({"kinds": [["text2sql"]]}, "kinds", "string"),
    ({"kinds": {"text2sql": 1}}, "kinds", "list"),
    ({"kinds": []}, "kinds", "at least one task kind"),
    ({"kinds": ["nope"]}, "kinds", "unknown task kind(s) 'nope'; known: text2sql, critic"),
    ({"kinds": ["text2sql", "nope"]}, "kinds", "unknown task kind(s) 'nope'"),
    ({"kinds": ["text2sql"], "other": 1}, "other", "Extra inputs"),
])
def test_a_bad_declaration_is_a_400_naming_it_and_claims_nothing(gw, body, param, says):
    gw.rollouts.offer("g1", shop_task(), 1)
    status, got, _ = claim(gw, body)
    assert status == 400, got
    assert got["error"]["param"].startswith(param) and says in got["error"]["message"], got
    assert gw.rollouts.stats().waiting == 1 and gw.rollouts.stats().claimed == 0


@pytest.mark.parametrize("config, offered", [
    (GatewayConfig(deadline_s=60, task_kinds=("text2sql",)), "text2sql"),  # the job's data.kinds
    (GatewayConfig(deadline_s=60, reward="bird_ex_agentic"), "text2sql"),  # a reward that scores one kind
    (GatewayConfig(deadline_s=60, task_kinds=("critic",)), "critic"),
])
def test_kinds_the_job_does_not_hand_out_are_a_409_at_once(tiny, shop_catalog, engine, config, offered):
    other = next(k for k in ("text2sql", "critic") if k != offered)
    with gateway(tiny, engine, shop_catalog, window=4096, config=config) as g:
        for _ in range(2):  # with nothing waiting, then with work waiting: never a 204 to wait on
            status, got, _ = claim(g, {"kinds": [other]})
            assert status == 409 and got["error"]["code"] == "kinds_not_offered", got
            assert got["error"]["param"] == "kinds" and f"hands out {offered} tasks" in got["error"]["message"]
            g.rollouts.offer("g", shop_task() if offered == "text2sql" else critic_task(), 1)
        # a client that handles the job's kind besides others is served
        status, got, _ = claim(g, {"kinds": [other, offered]})
        assert status == 200 and got["task"]["kind"] == offered


def test_a_kind_registered_later_can_be_declared(gw):
    """The known kinds come from the registry: the test-only ``rewrite`` kind, once registered, is a
    kind a client may declare; nothing of the gateway is edited."""
    from sqlrl.tasks.kinds import registered
    from tests.unit.test_fake_task_kind import REWRITE, rewrite

    assert claim(gw, {"kinds": ["rewrite"]})[0] == 400
    with registered(REWRITE):
        gw.rollouts.offer("g1", shop_task(), 1)
        gw.rollouts.offer("g2", rewrite(), 1)
        status, got, _ = claim(gw, {"kinds": ["rewrite"]})
        assert status == 200 and got["task"]["kind"] == "rewrite"
        gw.post(got["complete_url"][len(gw.url):], {"sql": "SELECT 1"})


def test_the_claim_queue_keeps_offer_order_across_kinds():
    w = Waiting()
    w.add("g1", critic_task("c1"), 2)
    w.add("g2", shop_task("t1"), 1)
    w.add("g3", critic_task("c2"), 1)
    w.add("g4", critic_task("c1"), 1)  # c1 again, another group
    assert len(w) == 5
    assert w.take({"text2sql"}) == ("g2", shop_task("t1"))
    assert w.take({"text2sql"}) is None and len(w) == 4
    group, task = w.take(None)
    assert (group, task.task_id) == ("g1", "c1")
    w.put_back(group, task)  # its session could not be opened: first again
    w.add("g5", shop_task("t2"), 1)
    assert [g for g, _ in (w.take({"critic", "text2sql"}),)] == ["g1"]
    assert w.drop(critic_task("c1")) == ["g1", "g4"]  # every waiting rollout of that task, any group
    assert [(g, t.task_id) for g, t in (w.take(None), w.take(None))] == [("g3", "c2"), ("g5", "t2")]
    assert w.take(None) is None and len(w) == 0 and w.drop(shop_task()) == []
