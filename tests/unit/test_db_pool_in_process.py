"""The DB-pool client in in-process mode (n=0: ShardCores in this process, Ray never started):
the same interface the Ray mode has, routing within the caller's partition, and rebalancing."""

from __future__ import annotations

import pickle

import pytest

from actors.db_pool import DBPoolConfig, DBPoolGroup
from sqlrl.db.leases.protocol import Catalog, LeaseError, LeaseErrorKind
from sqlrl.db.leases.shard import ShardConfig
from sqlrl.db.types import ErrorKind, SessionRequest


@pytest.fixture()
def group(demo_db_path):
    catalog = Catalog({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}})
    g = DBPoolGroup(DBPoolConfig(rollout_workers=2, per_worker={"sqlite": 2}, in_process=True,
                                 shard=ShardConfig(catalog=catalog, max_leases=2),
                                 lease_wait_s=0.3))
    yield g
    g.shutdown()


def test_in_process_mode_never_touches_ray(demo_db_path, monkeypatch) -> None:
    # Other test modules may share one Ray instance in this process, so "is Ray initialised" says
    # nothing here; instead every entry point into Ray fails loudly for the length of this test.
    import ray

    def forbidden(*args, **kwargs):
        raise AssertionError("in-process mode called into Ray")

    for name in ("init", "remote", "get", "wait", "kill", "get_actor"):
        monkeypatch.setattr(ray, name, forbidden)
    catalog = Catalog({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}})
    g = DBPoolGroup(DBPoolConfig(rollout_workers=2, per_worker={"sqlite": 2}, in_process=True,
                                 shard=ShardConfig(catalog=catalog)))
    try:
        assert len(g.shards) == 5  # 2 workers x 2 sqlite shards + 1 reward shard
        client = g.client(1)
        with client.session(SessionRequest("shop", key="t")) as s:
            assert s.execute("SELECT COUNT(*) FROM products").ok
        ref = client.lease_async(SessionRequest("shop", key="u"))
        client.release(client.resolve(ref))
        assert all(st is not None and st.active_leases == 0 for st in g.stats().values())
    finally:
        g.shutdown()


def test_client_routes_only_to_its_own_shards_and_is_deterministic_by_key(group) -> None:
    c0, c1 = group.client(0), group.client(1)
    assert set(c0.shards).isdisjoint(c1.shards)
    shards = set()
    for i in range(8):
        lease = c0.lease(SessionRequest("shop", key=f"traj-{i}"))
        shards.add(lease.shard)
        c0.release(lease)
    assert shards == {"rollout/w0/sqlite/0", "rollout/w0/sqlite/1"}
    again = c1.lease(SessionRequest("shop", "sqlite", key="traj-x")).shard
    c1.release(c1.lease(SessionRequest("shop", key="traj-y")))
    assert again == group.plan.pick("rollout", 1, "sqlite", "traj-x")


def test_session_context_manager_releases_even_when_the_body_raises(group) -> None:
    client = group.client(0)
    with pytest.raises(RuntimeError):
        with client.session(SessionRequest("shop", key="t")) as s:
            assert s.execute("SELECT COUNT(*) FROM products").ok
            lease = s.lease
            raise RuntimeError("trajectory crashed")
    assert client.execute(lease, "SELECT 1").error.kind is ErrorKind.SESSION_LOST
    assert sum(st.active_leases for st in group.stats().values()) == 0


def test_async_variants_return_futures_and_resolve_raises_typed_errors(group) -> None:
    client = group.client(0)
    lease = client.resolve(client.lease_async(SessionRequest("shop", key="a")))
    assert client.resolve(client.execute_async(lease, "SELECT 1")).rows == ((1,),)
    assert client.resolve(client.release_async(lease)) is True
    with pytest.raises(LeaseError) as e:
        client.resolve(client.lease_async(SessionRequest("missing")))
    assert e.value.kind is LeaseErrorKind.UNKNOWN_DATABASE


def test_a_full_shard_is_retried_until_lease_wait_then_capacity(group) -> None:
    client = group.client(0)
    held = [client.lease(SessionRequest("shop", key="same")) for _ in range(2)]  # max_leases=2 on that shard
    with pytest.raises(LeaseError) as e:
        client.lease(SessionRequest("shop", key="same"))
    assert e.value.kind is LeaseErrorKind.CAPACITY
    assert group.stats()[held[0].shard].refused >= 2  # it retried before giving up
    for lease in held:
        client.release(lease)


def test_another_workers_lease_and_an_unserved_dialect_are_clear_errors(group) -> None:
    lease = group.client(0).lease(SessionRequest("shop", key="k"))
    other = group.client(1)
    assert other.execute(lease, "SELECT 1").error.kind is ErrorKind.SESSION_LOST
    assert other.release(lease) is False
    with pytest.raises(LeaseError) as e:
        other.lease(SessionRequest("shop", "postgresql"))
    assert e.value.kind is LeaseErrorKind.BAD_REQUEST
    with pytest.raises(ValueError, match="not in this plan"):
        group.client(7)


def test_reward_client_uses_the_reward_partition(group) -> None:
    reward = group.client(role="reward")
    with reward.session(SessionRequest("shop")) as s:
        assert s.lease.shard == "reward/sqlite/0" and s.lease.worker_id == "reward"
        assert s.execute("SELECT 1").ok


def test_release_worker_frees_a_dead_workers_leases_at_once(group) -> None:
    client = group.client(1)
    leases = [client.lease(SessionRequest("shop", key=str(i))) for i in range(2)]
    assert group.release_worker("rollout-1") == 2
    assert all(client.execute(x, "SELECT 1").error.kind is ErrorKind.SESSION_LOST for x in leases)


def test_rebalance_keeps_live_leases_of_survivors_and_retires_drained_shards(group) -> None:
    survivor, leaver = group.client(0), group.client(1)
    kept = survivor.lease(SessionRequest("shop", key="k"))
    draining = leaver.lease(SessionRequest("shop", key="k"))
    change = group.rebalance([0, 2])
    assert {s.worker for s in change.added} == {2} and {s.worker for s in change.removed} == {1}
    assert survivor.execute(kept, "SELECT 1").ok  # untouched
    assert leaver.execute(draining, "SELECT 1").ok  # a drained shard finishes its leases
    with pytest.raises(LeaseError) as e:
        leaver.lease(SessionRequest("shop", key="k"))
    assert e.value.kind is LeaseErrorKind.CLOSED
    assert group.retire_idle() == []  # still holds a lease
    leaver.release(draining)
    assert group.retire_idle() == [draining.shard]
    assert group.client(2).lease(SessionRequest("shop")).shard.startswith("rollout/w2/")



def test_batched_calls_keep_order_and_type_each_failure(group) -> None:
    client = group.client(0)
    leases = client.lease_many([SessionRequest("shop", "sqlite", key=f"b{i}") for i in range(2)])
    assert {l.shard for l in leases} <= set(client.shards) and len(leases) == 2
    tables = ["customers", "orders"]
    results = client.execute_many([(l, f"SELECT COUNT(*) FROM {t}") for l, t in zip(leases, tables)])
    single = [client.execute(l, f"SELECT COUNT(*) FROM {t}") for l, t in zip(leases, tables)]
    assert [r.rows for r in results] == [r.rows for r in single] and all(r.ok for r in results)
    assert client.release_many([leases[0]]) == [True]
    stranger = group.client(1).lease(SessionRequest("shop", key="x"))
    mixed = client.execute_many([(leases[0], "SELECT 1"), (leases[1], "SELEC 1"),
                                 (leases[1], "SELECT 2"), (stranger, "SELECT 3")])
    assert [r.error.kind if r.error else None for r in mixed] == [
        ErrorKind.SESSION_LOST, ErrorKind.SYNTAX, None, ErrorKind.SESSION_LOST]
    assert mixed[2].rows == ((2,),) and "released" in mixed[0].error.message
    assert client.release_many([leases[1], leases[1], stranger]) == [True, False, False]
    group.client(1).release(stranger)


def test_lease_many_is_all_or_nothing(group) -> None:
    client = group.client(0)
    with pytest.raises(LeaseError) as e:
        client.lease_many([SessionRequest("shop", "sqlite", key="ok"),
                           SessionRequest("no_such_db", "sqlite", key="bad")])
    assert e.value.kind is LeaseErrorKind.UNKNOWN_DATABASE
    assert all(s.active_leases == 0 for s in group.stats().values())
    # more than the shards' capacity (2 shards x max_leases 2): the client retries, then gives up
    with pytest.raises(LeaseError) as e:
        client.lease_many([SessionRequest("shop", "sqlite", key=f"k{i}") for i in range(5)])
    assert e.value.kind is LeaseErrorKind.CAPACITY
    assert all(s.active_leases == 0 for s in group.stats().values())
