"""The pool client's rules without Ray (sqlrl/db/leases/client.py): routing, retry on a restarting
shard, all-or-nothing lease_many, per-shard batches, and typed results for a shard that does not
answer — over ShardCores in this process, behind a transport that can take a shard down."""

from __future__ import annotations

import pytest

from sqlrl.db.leases.protocol import Catalog, LeaseError, LeaseErrorKind
from sqlrl.db.leases.partition import PartitionPlan
from sqlrl.db.leases.client import LocalTransport, PoolClient, ShardUnreachable
from sqlrl.db.leases.shard import ShardConfig, ShardCore
from sqlrl.db.types import ErrorKind, SessionRequest


class Flaky(LocalTransport):
    """LocalTransport whose shards can be down: for ever (``down``) or for the next N calls
    (``down_for``), like a dead or restarting shard actor."""

    def __init__(self, shards) -> None:
        super().__init__(shards)
        self.down: set[str] = set()
        self.down_for: dict[str, int] = {}
        self.sent: list[tuple[str, str]] = []

    def send(self, shard_id, op, *args):
        self.sent.append((shard_id, op.__name__))
        if shard_id in self.down or self.down_for.get(shard_id, 0) > 0:
            self.down_for[shard_id] = self.down_for.get(shard_id, 0) - 1
            return ("unreachable", shard_id)
        return super().send(shard_id, op, *args)

    def result(self, handle, timeout_s):
        if isinstance(handle, tuple):
            raise ShardUnreachable(f"shard {handle[1]} did not answer")
        return super().result(handle, timeout_s)


@pytest.fixture()
def pool(demo_db_path):
    plan = PartitionPlan.build(2, {"sqlite": 2}, {"sqlite": 1})
    config = ShardConfig(catalog=Catalog({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}}), max_leases=2)
    cores = {s.id: ShardCore(s.id, config) for s in plan.shards()}
    transport = Flaky(cores)

    def client(worker=0, role="rollout", **kw):
        ids = [s.id for s in plan.shards_for(role, worker)]
        return PoolClient(plan, ids, role, worker, transport, **{"lease_wait_s": 0.3, **kw})

    yield client, transport, cores
    for core in cores.values():
        core.close()


def test_routing_is_crc32_over_the_callers_own_shards(pool) -> None:
    client, transport, cores = pool
    c = client(1)
    for key in ("a", "b", "c", "d"):
        lease = c.lease(SessionRequest("shop", "sqlite", key=key))
        assert lease.shard == c.plan.pick("rollout", 1, "sqlite", key) and lease.shard.startswith("rollout/w1/")
        assert c.release(lease)
    assert {op for _, op in transport.sent} == {"lease", "release"}  # typed calls by their method


def test_a_restarting_shard_is_retried_and_a_dead_one_is_typed(pool) -> None:
    client, transport, _ = pool
    waits = []
    c = client(0, on_lease_wait=lambda role, ms: waits.append((role, ms)))
    shard = c.plan.pick("rollout", 0, "sqlite", "k")
    transport.down_for[shard] = 2  # two refusals, then back
    lease = c.lease(SessionRequest("shop", "sqlite", key="k"))
    assert lease.shard == shard and waits and waits[0][0] == "rollout"
    transport.down.add(shard)
    assert c.execute(lease, "SELECT 1").error.kind is ErrorKind.SESSION_LOST
    assert c.release(lease) is False
    with pytest.raises(LeaseError) as e:
        c.lease(SessionRequest("shop", "sqlite", key="k"))  # retried until lease_wait_s
    assert e.value.kind is LeaseErrorKind.SHARD_UNAVAILABLE and "did not answer" in e.value.message
    assert sum(1 for s, op in transport.sent if s == shard and op == "lease") > 2


def test_execute_many_groups_per_shard_and_a_dead_shard_loses_only_its_calls(pool) -> None:
    client, transport, _ = pool
    c = client(0)
    by_shard: dict[str, list[str]] = {}
    for k in map(str, range(40)):
        by_shard.setdefault(c.plan.pick("rollout", 0, "sqlite", k), []).append(k)
    keys = [k for ks in by_shard.values() for k in ks[:2]]
    leases = c.lease_many([SessionRequest("shop", "sqlite", key=k) for k in keys])
    assert len({l.shard for l in leases}) == 2  # both of worker 0's shards (max_leases=2 each)
    transport.sent.clear()
    results = c.execute_many([(l, f"SELECT {i}") for i, l in enumerate(leases)])
    assert [r.rows for r in results] == [((i,),) for i in range(4)]
    assert sorted(op for _, op in transport.sent) == ["submit_many", "submit_many"]
    transport.down.add(leases[0].shard)
    mixed = c.execute_many([(l, "SELECT 1") for l in leases])
    assert [r.ok for r in mixed] == [l.shard != leases[0].shard for l in leases]
    assert all(r.error.kind is ErrorKind.SESSION_LOST for r in mixed if not r.ok)
    released = c.release_many(leases)
    assert released == [l.shard != leases[0].shard for l in leases]


def test_lease_many_releases_what_it_granted_when_a_request_fails(pool) -> None:
    client, transport, cores = pool
    c = client(0)
    with pytest.raises(LeaseError) as e:
        c.lease_many([SessionRequest("shop", "sqlite", key=k) for k in "ab"]
                     + [SessionRequest("nope", "sqlite", key="c")])
    assert e.value.kind is LeaseErrorKind.UNKNOWN_DATABASE
    assert all(core.stats().active_leases == 0 for core in cores.values())


def test_leases_of_other_callers_get_lost_results_without_a_call(pool) -> None:
    client, transport, _ = pool
    mine, other = client(0), client(role="reward")
    lease = mine.lease(SessionRequest("shop", "sqlite", key="x"))
    transport.sent.clear()
    assert other.execute(lease, "SELECT 1").error.kind is ErrorKind.SESSION_LOST
    assert other.execute_many([(lease, "SELECT 1")])[0].error.kind is ErrorKind.SESSION_LOST
    assert other.release(lease) is False and other.release_many([lease]) == [False]
    with pytest.raises(LeaseError) as e:
        other.renew(lease)
    assert e.value.kind is LeaseErrorKind.BAD_REQUEST
    assert transport.sent == []
    assert mine.renew(lease).expires_at >= lease.expires_at and mine.release(lease)
