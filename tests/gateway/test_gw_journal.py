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


def records(path, kind: str) -> list[dict]:
    """The journal's records of one kind, in order."""
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == kind]


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


def test_a_restarted_gateway_releases_the_pool_leases_of_its_lost_rollouts(shop_catalog, tmp_path):
    """Sessions from the DB pool (``PoolSessions``: leases that outlive the gateway's process) of the
    rollouts live at the crash are released by the restarted gateway, which records each lost
    rollout with its typed reason and whether its session was released; a lease released already
    (ended before the crash was journalled) is not counted twice; the other rollouts' leases stay."""
    from sqlrl.db.leases.client import LocalTransport, PoolClient
    from sqlrl.db.leases.partition import PartitionPlan
    from sqlrl.db.leases.protocol import Catalog
    from sqlrl.db.leases.shard import ShardConfig, ShardCore
    from sqlrl.db.source import PoolSessions
    from sqlrl.gateway.trace import LostReason

    plan = PartitionPlan.build(1, {"sqlite": 1}, {"sqlite": 1})
    cores = {s.id: ShardCore(s.id, ShardConfig(catalog=Catalog(shop_catalog))) for s in plan.shards()}
    ids = [s.id for s in plan.shards_for("rollout", 0)]
    client = PoolClient(plan, ids, "rollout", 0, LocalTransport(cores))

    def held() -> int:
        return sum(core.stats().active_leases for core in cores.values())

    def gateway() -> Rollouts:
        return Rollouts(GatewayConfig(deadline_s=10), PoolSessions(client), FixedScorer(), clock=FakeClock(),
                        journal=Journal(tmp_path / JOURNAL_FILE))

    try:
        first = gateway()
        first.offer("g", shop_task(), 4)
        a, b, c, d = (first.claim(K).rollout_id for _ in range(4))
        first.complete(K, a, sql=GOLD)  # its lease released
        assert held() == 3
        claims = {r["rollout_id"]: r for r in records(tmp_path / JOURNAL_FILE, "claim")}
        client.release_many([first._live[d].session.lease])  # d's lease ended already (the crash came after)
        assert held() == 2
        # the process dies here: b, c and d were live; b's and c's leases are still held in the pool

        second = gateway()
        assert held() == 0 and second.restored_released == 2
        kept, *lost = second.drain()
        assert kept.rollout_id == a and kept.lost is None
        assert {t.rollout_id for t in lost} == {b, c, d}
        assert all(t.status == "expired" and t.lost is LostReason.GATEWAY_RESTART and t.error == RESTART_CAUSE
                   for t in lost)
        ends = {r["trace"]["rollout_id"]: r for r in records(tmp_path / JOURNAL_FILE, "end")}
        assert {rid: ends[rid]["session_released"] for rid in (b, c, d)} == {b: True, c: True, d: False}
        assert {rid: ends[rid]["trace"]["lost"] for rid in (b, c, d)} == dict.fromkeys((b, c, d), "gateway-restart")
        assert claims[b]["session"]["worker_id"] == "rollout-0" and K not in json.dumps(claims)

        third = gateway()  # restarted again: the lost rollouts ended; nothing released twice
        assert third.restored_released == 0 and third.drain() == []
        third.offer("h", shop_task("t2"), 1)
        claim = third.claim(K)  # new work still leases and releases normally
        assert held() == 1
        third.complete(K, claim.rollout_id, sql=GOLD)
        assert held() == 0
    finally:
        for core in cores.values():
            core.close()


def test_local_sessions_are_not_named_in_the_journal(shop_catalog, pool, tmp_path):
    """``LocalSessions`` die with their process: claims record no session, and a restart releases none."""
    first = rollouts(shop_catalog, pool, tmp_path / JOURNAL_FILE)
    first.offer("g", shop_task(), 1)
    rid = first.claim(K).rollout_id
    assert [c["session"] for c in records(tmp_path / JOURNAL_FILE, "claim")] == [None]
    second = rollouts(shop_catalog, pool, tmp_path / JOURNAL_FILE)
    (lost,) = second.drain()
    assert lost.rollout_id == rid and lost.lost == "gateway-restart" and second.restored_released == 0
    for gateway in (first, second):
        gateway.close()


def test_a_journal_that_cannot_be_written_still_ends_the_rollout(shop_catalog, pool, tmp_path):
    """A full disk at the ``claim`` record: the claim fails and the rollout waits again, its session
    released; at the ``end`` record: the completion's caller gets the error, and the rollout ends in
    memory all the same (released, drained, not live): never left ``closing``."""
    import errno

    class FullDisk(Journal):
        full: set[str] = {"claim", "end"}

        def append(self, kind, **fields):
            if kind in self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            super().append(kind, **fields)

    journal = FullDisk(tmp_path / JOURNAL_FILE)
    r = Rollouts(GatewayConfig(deadline_s=10), LocalSessions(shop_catalog, pool=pool), FixedScorer(),
                 clock=FakeClock(), journal=journal)
    r.offer("g", shop_task("t1"), 1)
    with pytest.raises(OSError, match="No space"):  # the claim's record: nothing handed out, nothing held
        r.claim(K)
    assert r.stats().waiting == 1 and r.stats().active == 0 and pool.stats().in_use == 0
    journal.full = {"end"}
    rid = r.claim(K).rollout_id
    with pytest.raises(OSError, match="No space"):
        r.complete(K, rid, sql=GOLD)
    assert r.rollout_status(rid) == "ended" and r.stats().active == 0 and pool.stats().in_use == 0
    (trace,) = r.drain()
    assert trace.rollout_id == rid and trace.reward == 1.0
    with pytest.raises(RolloutClosed):
        r.complete(K, rid, sql=GOLD)
