"""Batched pool calls (lease_many / execute_many / release_many) on PostgreSQL and MariaDB, where a
shard runs a batch's server calls in parallel threads: results in order, per-call errors, scratch
state per lease, nothing left open."""

import pytest

from actors.db_pool import DBPoolConfig, DBPoolGroup
from sqlrl.db.leases.protocol import Catalog
from sqlrl.db.leases.shard import ShardConfig
from sqlrl.db.types import ErrorKind, SessionRequest


@pytest.fixture
def server(shop_server):
    return shop_server  # tests/dialects/conftest.py


def test_a_batch_on_a_server_shard(server) -> None:
    dialect, url = server
    group = DBPoolGroup(DBPoolConfig(rollout_workers=1, per_worker={dialect: 1}, reward={},
                                     in_process=True,
                                     shard=ShardConfig(catalog=Catalog({"shop": {dialect: url}}))))
    try:
        client = group.client(0)
        leases = client.lease_many([SessionRequest("shop", dialect, key=f"t{i}") for i in range(6)])
        # each lease's own scratch state: a table only it can see
        made = client.execute_many([(l, f"CREATE TEMPORARY TABLE mine AS SELECT {i} AS v")
                                    for i, l in enumerate(leases)])
        assert all(r.ok for r in made), [r.error for r in made]
        out = client.execute_many([(l, "SELECT v FROM mine") for l in leases]
                                  + [(leases[0], "SELECT nope FROM customers")])
        assert [r.rows for r in out[:6]] == [((i,),) for i in range(6)]
        assert out[6].error.kind is ErrorKind.RUNTIME
        assert client.release_many(leases) == [True] * 6
        shard_id = f"rollout/w0/{dialect}/0"
        stats = group.stats()[shard_id]
        assert stats.active_leases == 0 and stats.granted == 6
        assert group.shards[shard_id]._batch_pool is not None  # the parallel path ran
    finally:
        group.shutdown()
