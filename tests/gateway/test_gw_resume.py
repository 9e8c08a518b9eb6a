"""What a restarted gateway needs from its driver (``sqlrl.gateway.rollouts`` on its journal, no Ray):
repeatable offers and drains (idempotency tokens, journalled), and the policy's weights -- a gateway
restarted under a version > 0 holds its calls and releases the job's step wait until an update
brings them back, and then records the job's version numbers, not its new engine's."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from sqlrl.gateway.journal import JOURNAL_FILE, replay
from sqlrl.gateway.rollouts import Busy

from .conftest import GOLD, shop_task
from .test_gw_journal import pool, rollouts  # noqa: F401  (the journal tests' pool fixture and Rollouts)
from .test_gw_rollouts import gen

K = "gw-secret-key-1"


class Engine:
    """The part of an ``AsyncEngine`` weight updates use: versions count from 0 in every process."""

    def __init__(self) -> None:
        self.version, self.loaded = 0, []

    async def update_weights(self, weights, *, policy=None):
        self.loaded.append(dict(weights))
        self.version += 1
        return self.version


def test_offers_and_drains_repeated_with_their_token_happen_once(shop_catalog, pool, tmp_path):
    path = tmp_path / JOURNAL_FILE
    first = rollouts(shop_catalog, pool, path)
    first.offer("g", shop_task("t1"), 2, token="o1")
    first.offer("g", shop_task("t1"), 2, token="o1")  # the driver repeats a call it got no answer to
    assert first.stats().waiting == 2
    a = first.claim(K).rollout_id
    first.complete(K, a, sql=GOLD)
    (got,) = first.drain(token="d1")
    assert first.drain(token="d1") == [got]  # the same drain again: the same traces
    # the process dies after journalling the drain and before the driver got its answer

    second = rollouts(shop_catalog, pool, path)
    second.offer("g", shop_task("t1"), 2, token="o1")  # journalled by the dead process: not offered twice
    assert second.stats().waiting == 1
    assert second.drain(token="d1") == [got]  # the repeated drain gets the traces the reply lost
    assert second.drain(token="d2") == []  # a new drain: nothing handed out twice
    assert second.drain(token="d2") == []
    second.offer("g", shop_task("t1"), 1)  # no token: always offered
    assert second.stats().waiting == 2
    state = replay(path)
    assert state.offer_tokens == {"o1"} and state.last_drain == ("d1", [got])
    second.close()


def test_a_gateway_restarted_under_a_later_version_waits_for_its_weights(shop_catalog, pool, tmp_path):
    path = tmp_path / JOURNAL_FILE
    first = rollouts(shop_catalog, pool, path)
    engine = Engine()
    assert asyncio.run(first.update_weights(engine, {"w": 1})) == 1
    assert asyncio.run(first.update_weights(engine, {"w": 2}, version=2)) == 2
    first.offer("g", shop_task("t1"), 2)
    # the process dies: the next one's engine has the start weights (its version 0)

    second = rollouts(shop_catalog, pool, path)
    assert second.awaiting_weights and second.weights.base == 2 and replay(path).version == 2
    rid = second.claim(K).rollout_id
    with pytest.raises(Busy, match="restore the policy's weights"):
        second.begin_call(K, rid)
    assert second.wait_idle(None) is False  # the job's wait returns: its driver must restore them first
    woken = []
    assert second.when_weights(lambda: woken.append(1)) is False
    with pytest.raises(ValueError, match="version"):
        asyncio.run(second.update_weights(Engine(), {"w": 2}, version=0))
    fresh = Engine()
    assert asyncio.run(second.update_weights(fresh, {"w": 2}, version=2)) == 2  # restored: the job's number
    assert woken == [1] and not second.awaiting_weights and second.when_weights(lambda: None) is True
    assert fresh.loaded == [{"w": 2}]
    ticket = second.begin_call(K, rid)
    ticket.commit((1, 2), gen([5, 6]), None)  # tokens the engine says its version 3 sampled
    (trace,) = [second.complete(K, rid, sql=GOLD)]
    assert trace.calls[0].versions == (4, 4)  # read as the job's: + the offset 1 (job's 2 = engine's 1)
    assert asyncio.run(second.update_weights(fresh, {"w": 3})) == 3  # then it counts on in the job's numbers

    third = rollouts(shop_catalog, pool, path)
    assert third.awaiting_weights and third.weights.base == 3
    third.close()  # stopping releases held calls too
    assert third.when_weights(lambda: None) is True


def test_a_gateway_restarted_before_any_update_serves_at_once(shop_catalog, pool, tmp_path):
    path = tmp_path / JOURNAL_FILE
    first = rollouts(shop_catalog, pool, path)
    first.offer("g", shop_task("t1"), 1)
    second = rollouts(shop_catalog, pool, path)
    assert not second.awaiting_weights and second.weights.base == 0
    rid = second.claim(K).rollout_id
    second.begin_call(K, rid).abandon()
    second.close()


@pytest.mark.parametrize("during_update", ["wait", "reject"])
def test_over_http_a_restarted_gateway_holds_or_refuses_calls_until_its_weights_are_back(
        tiny, shop_catalog, tmp_path, during_update):
    """The app (``serve/gateway.py``) on a gateway restarted under version 2: a chat call waits for
    the restore (``wait``) or gets 429 + ``Retry-After`` (``reject``); then it runs, recorded under
    the job's version."""
    import threading

    from sqlrl.gateway.journal import Journal
    from sqlrl.gateway.rollouts import GatewayConfig
    from sqlrl.policy.scripted import ScriptedEngine

    from .conftest import QUESTION, SCRIPT, gateway

    path = tmp_path / JOURNAL_FILE
    Journal(path).append("weights", version=2)  # what the dead process recorded
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    config = GatewayConfig(deadline_s=60, during_update=during_update)
    body = {"model": "m", "messages": [{"role": "user", "content": QUESTION}]}
    with gateway(tiny, engine, shop_catalog, config=config, journal=Journal(path)) as g:
        g.rollouts.offer("g", shop_task(), 1)
        rid = g.claim()["rollout_id"]
        chat = f"/rollouts/{rid}/v1/chat/completions"
        if during_update == "reject":
            r = g.post(chat, body)
            assert r.status_code == 429 and "restore the policy's weights" in r.text and r.headers["retry-after"]
        else:
            answers: list = []
            caller = threading.Thread(target=lambda: answers.append(g.post(chat, body)))
            caller.start()
            while not g.rollouts.weights._waiters and caller.is_alive():  # the call reached the hold
                threading.Event().wait(0.01)  # polls the gateway's state
            assert not answers and g.rollouts.stats().in_flight == 0  # held before it began
        assert asyncio.run(g.rollouts.update_weights(engine, {"scripted.weight": np.zeros(1)}, version=2)) == 2
        if during_update == "wait":
            caller.join(timeout=60)
            (r,) = answers
        else:
            r = g.post(chat, body)
        assert r.status_code == 200, r.text
        g.post(f"/v1/rollouts/{rid}/complete", {"sql": GOLD})
        (trace,) = g.rollouts.drain()
        assert {v for c in trace.calls for v in c.versions} == {2}  # the engine's 1, read as the job's 2
