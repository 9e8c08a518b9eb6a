"""The DB-session pool as Ray actors: the lease protocol across processes, typed errors, a shard
killed mid-trajectory, callers that die, and client use from inside another actor."""

from __future__ import annotations

import time

import pytest

from actors.db_pool import DBPoolConfig, DBPoolGroup
from sqlrl.db.leases.protocol import Catalog, LeaseError, LeaseErrorKind
from sqlrl.db.leases.shard import ShardConfig
from sqlrl.db.types import ErrorKind, Limits, SessionRequest
from sqlrl.db.sessions.pool import PoolConfig


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.fixture()
def group(ray_session, demo_db_path):
    catalog = Catalog({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}})
    g = DBPoolGroup(DBPoolConfig(
        rollout_workers=2, per_worker={"sqlite": 1},
        shard=ShardConfig(catalog=catalog, lease_ttl_s=2.0,
                          pool=PoolConfig(max_size=16, limits=Limits(timeout_s=2))),
        # call_timeout_s also bounds the shards' start-up (twice it): generous on a loaded machine
        reaper_interval_s=0.25, call_timeout_s=60))
    yield g
    g.shutdown()


def active(group) -> int:
    return sum(s.active_leases for s in group.stats().values() if s is not None)


def test_a_trajectory_through_a_shard_actor(group) -> None:
    client = group.client(0)
    lease = client.lease(SessionRequest("shop", key="traj-1", preprocess_sql=["CREATE TEMP TABLE seen(x)"]))
    assert lease.shard == "rollout/w0/sqlite/0" and lease.worker_id == "rollout-0"
    assert client.execute(lease, "INSERT INTO seen VALUES (42)").ok
    assert client.execute(lease, "SELECT x FROM seen").rows == ((42,),)
    assert active(group) == 1
    assert client.release(lease) is True and client.release(lease) is False
    lost = client.execute(lease, "SELECT 1")
    assert lost.error.kind is ErrorKind.SESSION_LOST and "released" in lost.error.message
    assert active(group) == 0


def test_lease_errors_cross_the_actor_boundary_typed(group) -> None:
    client = group.client(1)
    with pytest.raises(LeaseError) as e:
        client.lease(SessionRequest("no_such_db"))
    assert type(e.value) is LeaseError and e.value.kind is LeaseErrorKind.UNKNOWN_DATABASE
    with pytest.raises(LeaseError) as e:
        client.resolve(client.lease_async(SessionRequest("shop", preprocess_sql=["SELEC broken"])))
    assert e.value.kind is LeaseErrorKind.OPEN_FAILED


def test_async_variants_return_object_refs(group, ray_session) -> None:
    client = group.client(0)
    ref = client.lease_async(SessionRequest("shop", key="a"))
    assert isinstance(ref, ray_session.ObjectRef)
    lease = client.resolve(ref)
    refs = [client.execute_async(lease, f"SELECT {i}") for i in range(5)]
    assert [r.rows for r in ray_session.get(refs)] == [((i,),) for i in range(5)]
    assert client.resolve(client.release_async(lease)) is True


def test_an_idle_lease_expires_and_says_so(group) -> None:
    client = group.client(0)
    lease = client.lease(SessionRequest("shop"))
    wait_for(lambda: active(group) == 0, 60, "the reaper to reclaim the idle lease")
    result = client.execute(lease, "SELECT 1")
    assert result.error.kind is ErrorKind.LEASE_EXPIRED
    assert group.stats()[lease.shard].reclaimed == 1


def test_a_killed_shard_restarts_and_callers_get_typed_errors_not_hangs(group, ray_session) -> None:
    client = group.client(0)
    # a long statement timeout: the runaway call cannot end by itself before the kill lands
    lease = client.lease(SessionRequest("shop", key="k", limits=Limits(timeout_s=120)))
    assert client.execute(lease, "CREATE TABLE mine(x)").ok
    slow = client.execute_async(
        lease, "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM c) SELECT COUNT(*) FROM c")
    # submitted before the kill, so it is in flight on the old process (calls are not retried)
    ray_session.kill(group.shards[lease.shard], no_restart=False)
    with pytest.raises(LeaseError) as e:  # the call in flight died with the shard
        client.resolve(slow)
    assert e.value.kind is LeaseErrorKind.SHARD_UNAVAILABLE
    assert "GetTimeoutError" not in e.value.message  # the death was seen, not the call timeout
    # while Ray restarts the shard a call fails fast ("did not answer"); once it is back, the old
    # lease is recognised as one of a previous incarnation
    wait_for(lambda: group.stats()[lease.shard] is not None, 120, "the shard to restart")
    after = client.execute(lease, "SELECT * FROM mine")  # the old lease, on the restarted shard
    assert after.error.kind is ErrorKind.SESSION_LOST and "restarted" in after.error.message
    fresh = client.lease(SessionRequest("shop", key="k"))  # the restarted shard serves new leases
    assert fresh.incarnation != lease.incarnation
    assert client.execute(fresh, "SELECT COUNT(*) FROM products").ok
    assert client.execute(fresh, "SELECT * FROM mine").error.kind is ErrorKind.RUNTIME
    client.release(fresh)
    assert active(group) == 0


def test_a_blocking_execute_in_flight_on_a_killed_shard_is_session_lost(group, ray_session) -> None:
    import threading

    client = group.client(1)
    lease = client.lease(SessionRequest("shop", limits=Limits(timeout_s=120)))  # it cannot end before the kill
    submitted = threading.Event()  # the blocking call has sent its request: the kill lands after
    send = client.execute_async

    def execute_async(lease, sql):
        ref = send(lease, sql)
        submitted.set()
        return ref

    client.execute_async = execute_async  # what the blocking execute() sends through
    out = {}
    sql = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM c) SELECT COUNT(*) FROM c"
    t = threading.Thread(target=lambda: out.setdefault("r", client.execute(lease, sql)))
    t.start()
    assert submitted.wait(60), "the blocking execute never sent its call"
    ray_session.kill(group.shards[lease.shard], no_restart=False)
    t.join(timeout=180)  # call_timeout_s is 60: only a guard against hanging forever
    assert not t.is_alive()
    assert out["r"].error.kind is ErrorKind.SESSION_LOST and "did not answer" in out["r"].error.message


@pytest.fixture()
def caller_cls(ray_session):
    @ray_session.remote(num_cpus=0.25)
    class Caller:
        """A stand-in rollout worker: holds leases and may die holding them."""

        def __init__(self, client) -> None:
            self.client = client
            self.leases = []

        def hold(self, n: int) -> list[str]:
            self.leases += [self.client.lease(SessionRequest("shop", key=str(i))) for i in range(n)]
            return [lease.id for lease in self.leases]

        def work(self) -> list[bool]:
            return [self.client.execute(x, "SELECT COUNT(*) FROM products").ok for x in self.leases]

    return Caller


def test_the_client_works_inside_another_actor(group, caller_cls, ray_session) -> None:
    caller = caller_cls.remote(group.client(1))
    assert len(ray_session.get(caller.hold.remote(3))) == 3
    assert ray_session.get(caller.work.remote()) == [True, True, True]
    assert group.stats()["rollout/w1/sqlite/0"].holders == (("rollout-1", 3),)
    ray_session.kill(caller)


def test_leases_of_a_dead_caller_are_reclaimed_after_the_ttl(group, caller_cls, ray_session) -> None:
    caller = caller_cls.remote(group.client(0))
    ray_session.get(caller.hold.remote(4))
    assert active(group) == 4
    ray_session.kill(caller)  # dies holding four sessions
    wait_for(lambda: active(group) == 0, 60, "the dead caller's leases to be reclaimed")
    stats = group.stats()["rollout/w0/sqlite/0"]  # by the TTL (nobody released them)
    assert stats.reclaimed == 4 and stats.pool.in_use == 0


def test_release_worker_frees_a_dead_callers_leases_without_waiting(group, caller_cls,
                                                                    ray_session) -> None:
    caller = caller_cls.remote(group.client(1))
    ray_session.get(caller.hold.remote(2))
    ray_session.kill(caller)
    assert group.release_worker("rollout-1") == 2
    assert active(group) == 0


def test_rebalance_starts_and_retires_shard_actors(group, ray_session) -> None:
    change = group.rebalance(3)
    assert [s.id for s in change.added] == ["rollout/w2/sqlite/0"]
    client = group.client(2)
    with client.session(SessionRequest("shop")) as s:
        assert s.execute("SELECT 1").ok
    leaving = group.shards["rollout/w1/sqlite/0"]
    group.rebalance([0, 2])
    assert "rollout/w1/sqlite/0" not in group.shards
    wait_for(lambda: _dead(ray_session, leaving), 60, "the retired shard actor to stop")


def _dead(ray_session, actor) -> bool:
    try:
        ray_session.get(actor.ready.remote(), timeout=10)
        return False
    except ray_session.exceptions.RayActorError:
        return True
    except ray_session.exceptions.GetTimeoutError:  # slow to answer is not dead: ask again
        return False


def _prometheus_text(ray) -> str:
    import urllib.request

    port = ray.nodes()[0]["MetricsExportPort"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def _sample(text: str, metric: str, shard: str, worker: str) -> float | None:
    """The value of one Prometheus sample (``ray_<metric>{...shard="<shard>"...} <value>``) of the
    shard actor process ``worker`` (earlier tests' shards had the same shard ids)."""
    for line in text.splitlines():
        if (line.startswith(f"ray_{metric}{{") and f'shard="{shard}"' in line
                and f'WorkerId="{worker}"' in line):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_reach_the_ray_metrics_endpoint(group, ray_session) -> None:
    client = group.client(0)
    shard = "rollout/w0/sqlite/0"
    lease = client.lease(SessionRequest("shop", key="m"))
    for _ in range(3):
        assert client.execute(lease, "SELECT COUNT(*) FROM orders").ok
    client.execute(lease, "SELEC oops")
    client.execute(lease, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                          "SELECT COUNT(*) FROM c")  # stopped by the 2 s statement timeout
    client.release(lease)
    client.lease(SessionRequest("shop", key="m2"))  # never used again: the reaper reclaims it after the 2 s TTL
    wait_for(lambda: group.stats()[shard].reclaimed == 1, 60,
             "the reaper to reclaim the idle lease")

    worker = ray_session.get(group.shards[shard].__ray_call__.remote(
        lambda self: __import__("ray").get_runtime_context().get_worker_id()))
    expected = {"leases": 2, "releases": 1, "executes": 5, "errors": 2, "timeouts": 1, "reclaimed": 1}

    def seen():
        text = _prometheus_text(ray_session)
        values = {name: _sample(text, f"sqlrl_db_{name}_total", shard, worker) for name in expected}
        hist = _sample(text, "sqlrl_db_execute_ms_count", shard, worker)
        gauge = _sample(text, "sqlrl_db_active_sessions", shard, worker)
        ok = all(v is not None and v >= expected[k] for k, v in values.items())
        return (values, hist, gauge) if ok and hist and hist >= 5 and gauge == 0 else None

    values, hist, gauge = wait_for(seen, 90, "the shard's metrics on the Prometheus endpoint")
    assert values == expected  # a fresh shard: exactly what this test did
    stats = group.stats()[shard]
    assert (stats.granted, stats.executes, stats.timeouts, stats.reclaimed) == (2, 5, 1, 1)


def test_batched_calls_across_shards_and_a_killed_shard(ray_session, demo_db_path) -> None:
    catalog = Catalog({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}})
    g = DBPoolGroup(DBPoolConfig(rollout_workers=1, per_worker={"sqlite": 2}, reward={},
                                 shard=ShardConfig(catalog=catalog), call_timeout_s=60))
    try:
        client = g.client(0)
        keys = [f"t{i}" for i in range(8)]
        leases = client.lease_many([SessionRequest("shop", "sqlite", key=k) for k in keys])
        assert len({l.shard for l in leases}) == 2  # crc32 spreads 8 keys over both shards
        pending = client.execute_many_async([(l, "SELECT COUNT(*) FROM products") for l in leases])
        assert len(pending.refs) == 2  # one round trip per shard
        assert all(r.ok for r in client.resolve_many(pending))
        dead = leases[0].shard
        before = g.stats()[dead].incarnation
        ray_session.kill(g.shards[dead], no_restart=False)  # asynchronous: wait for the restart
        wait_for(lambda: getattr(g.stats()[dead], "incarnation", before) != before, 60,
                 "the shard to restart")
        out = client.execute_many([(l, "SELECT 1") for l in leases])
        for lease, r in zip(leases, out):
            if lease.shard == dead:
                assert r.error.kind is ErrorKind.SESSION_LOST
            else:
                assert r.ok and r.rows == ((1,),)
        released = client.release_many(leases)
        assert all(released[i] for i, l in enumerate(leases) if l.shard != dead)
        wait_for(lambda: all(s is not None and s.active_leases == 0 for s in g.stats().values()),
                 60, "both shards idle")
    finally:
        g.shutdown()
