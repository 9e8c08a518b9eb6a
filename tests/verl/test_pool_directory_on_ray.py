"""The Ray path of ``actors.verl.sessions``: a DB pool published as a named actor, claimed by two
actors standing in for verl's ``AgentLoopWorker``s (each claims by its own Ray actor id)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_local():
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, namespace="sqlrl-verl-tests")
    yield ray
    if started:
        ray.shutdown()


class FakeWorker:
    """What an agent-loop worker process does: take this process's source, lease, run SQL."""

    def lease_and_run(self, pool: str) -> tuple[int, str]:
        from actors.verl.sessions import worker_sessions
        from sqlrl.db.source import SessionRequest, open_one

        source = worker_sessions(pool=pool)
        with open_one(source, SessionRequest("shop", "sqlite")) as session:
            session.execute("CREATE TEMP TABLE mine AS SELECT 1 AS v")
            assert [tuple(r) for r in session.execute("SELECT v FROM mine").rows] == [(1,)]
        assert worker_sessions(pool=pool) is source  # one source per process
        return source.client.worker, session.lease.shard


@pytest.mark.slow
def test_each_worker_process_claims_its_own_partition(ray_local, demo_db_path):
    ray = ray_local
    from actors.db_pool import DBPoolConfig, DBPoolGroup
    from actors.verl.sessions import publish_pool
    from sqlrl.db.leases.protocol import Catalog
    from sqlrl.db.leases.shard import ShardConfig

    group = DBPoolGroup(DBPoolConfig(rollout_workers=2, per_worker={"sqlite": 1}, num_cpus_per_shard=0.1,
                                     shard=ShardConfig(catalog=Catalog({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}}))))
    directory = publish_pool(group, "sqlrl-verl-test-pool")
    try:
        workers = [ray.remote(num_cpus=0.1)(FakeWorker).remote() for _ in range(2)]
        first = ray.get([w.lease_and_run.remote("sqlrl-verl-test-pool") for w in workers], timeout=120)
        again = ray.get([w.lease_and_run.remote("sqlrl-verl-test-pool") for w in workers], timeout=120)
        assert sorted(w for w, _ in first) == [0, 1]  # two processes, two partitions
        assert first == again  # a process keeps its partition
        for worker, shard in first:
            assert shard.startswith(f"rollout/w{worker}/")  # and leases only from its own shards
    finally:
        ray.kill(directory)
        group.shutdown()
