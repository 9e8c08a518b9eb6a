"""A gateway restart loses no completed rollout (``sqlrl.gateway.journal``): the state is journalled,
a ``Rollouts`` built on the journal of a killed one resumes (ended traces kept for the job, offers
waiting again, rollouts live at the kill expired with the cause named); a torn last line is skipped
and cut, a corrupt one refused."""

from __future__ import annotations

import json

import pytest

from sqlrl.db import SessionPool
from sqlrl.db.source import LocalSessions
from sqlrl.gateway.journal import JOURNAL_FILE, RESTART_CAUSE, Journal, JournalError, replay
from sqlrl.gateway.rollouts import GatewayConfig, RolloutClosed, RolloutNotFound, Rollouts

from .conftest import GOLD, FakeClock, shop_task
from .test_gw_rollouts import FixedScorer, gen

K = "gw-secret-key-1"


@pytest.fixture
def pool():
    p = SessionPool()
    yield p
    p.close()


def rollouts(catalog, pool, path):
    return Rollouts(GatewayConfig(deadline_s=10), LocalSessions(catalog, pool=pool), FixedScorer(),
                    clock=FakeClock(), journal=Journal(path))


def test_a_restarted_gateway_keeps_every_completed_rollout(shop_catalog, pool, tmp_path):
    path = tmp_path / JOURNAL_FILE
    first = rollouts(shop_catalog, pool, path)
    first.offer("g", shop_task("t1"), 3)
    first.offer("h", shop_task("t2"), 1)
    a, b, c = (first.claim(K).rollout_id for _ in range(3))
    first.complete(K, c, sql=GOLD)
    assert [t.rollout_id for t in first.drain()] == [c]  # the job has it: not handed out again
    ticket = first.begin_call(K, a)
    ticket.commit((1, 2, 3), gen([7, 8]), "write")
    (done,) = [first.complete(K, a, sql=GOLD)]
    first.finish()
    # the process dies here: nothing is closed, b is mid-rollout, h's rollout was never claimed

    second = rollouts(shop_catalog, pool, path)
    kept, lost = second.drain()
    assert kept == done  # the same trace: calls, token ids, log-probs, versions, reward
    assert kept.calls[0].response_ids == (7, 8) and kept.calls[0].prompt_ids == (1, 2, 3) and kept.reward == 1.0
    assert lost.rollout_id == b and lost.status == "expired" and lost.error == RESTART_CAUSE and lost.calls == ()
    assert second.stats().waiting == 1 and second.stats().claimed == 3 and second.stats().expired == 1
    for rid in (a, b, c):  # ended: 409 for the key that claimed it, 404 for any other
        with pytest.raises(RolloutClosed):
            second.check(K, rid)
        with pytest.raises(RolloutNotFound):
            second.check("other", rid)
    claim = second.claim(K)
    assert claim.group_id == "h" and claim.task.task_id == "t2"
    second.complete(K, claim.rollout_id, sql=GOLD)
    assert [t.group_id for t in second.drain()] == ["h"]

    third = rollouts(shop_catalog, pool, path)  # restarted again: nothing is handed out twice
    assert third.drain() == [] and third.idle() and third.stats().expired == 1
    assert K not in path.read_text()  # the journal holds key digests, never keys
    third.close()


def test_a_torn_last_line_is_skipped_and_cut_and_a_corrupt_one_refused(shop_catalog, pool, tmp_path):
    path = tmp_path / JOURNAL_FILE
    first = rollouts(shop_catalog, pool, path)
    first.offer("g", shop_task(), 2)
    rid = first.claim(K).rollout_id
    first.complete(K, rid, sql=GOLD)
    with open(path, "a") as f:
        f.write('{"kind": "claim", "rollout_id": "x')  # the crash interrupted this write
    state = replay(path)
    assert state.torn == 1 and [t.rollout_id for t in state.ended] == [rid] and len(state.waiting) == 1

    second = rollouts(shop_catalog, pool, path)  # reopening cuts the torn line before appending
    assert [t.rollout_id for t in second.drain()] == [rid]
    assert all(json.loads(line) for line in path.read_text().splitlines())
    second.close()

    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")
    with pytest.raises(JournalError, match="line 2 is not a journal record"):
        replay(path)
