"""The lease protocol in ShardCore (no Ray): grant, execute, renew-on-use, release, TTL reclaim,
capacity, drain, close, and every bad-input path."""

from __future__ import annotations

import pickle
import threading
import time

import pytest

from sqlrl.db import open_session
from sqlrl.db.leases.protocol import Catalog, Lease, LeaseError, LeaseErrorKind
from sqlrl.db.leases.shard import ShardConfig, ShardCore
from sqlrl.db.types import ErrorKind, SessionRequest


@pytest.fixture()
def catalog(demo_db_path: str) -> Catalog:
    return Catalog({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}})


@pytest.fixture()
def shard(catalog: Catalog):
    core = ShardCore("test/0", ShardConfig(catalog=catalog, lease_ttl_s=30, max_leases=4))
    yield core
    core.close()


class ShardClock:
    """ShardCore's clock (TTL deadlines, ``expires_at``), moved only by the test: TTL tests assert
    what the protocol does at a given time, never how fast this machine is."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    @staticmethod
    def perf_counter() -> float:
        return time.perf_counter()

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture()
def clock(monkeypatch) -> ShardClock:
    import sqlrl.db.leases.shard as shard_module

    fake = ShardClock()
    monkeypatch.setattr(shard_module, "time", fake)
    return fake


def wait_for(predicate, what: str, timeout_s: float = 60) -> None:
    """Wait for an event (e.g. the reaper thread's pass); the bound only stops a hang."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def req(db: str = "shop", **kw) -> SessionRequest:
    return SessionRequest(db, worker_id=kw.pop("worker_id", "rollout-0"), **kw)


def checksum(path: str) -> tuple:
    with open_session(f"sqlite:///{path}") as s:
        return s.execute("SELECT COUNT(*), SUM(price) FROM products").rows


# -- contracts ----------------------------------------------------------------------------------

def test_lease_error_pickles_with_kind_and_message() -> None:
    err = pickle.loads(pickle.dumps(LeaseError(LeaseErrorKind.CAPACITY, "full")))
    assert err.kind is LeaseErrorKind.CAPACITY and err.message == "full"
    assert str(err) == "lease capacity: full"


def test_catalog_resolves_ids_and_urls_and_explains_misses(catalog: Catalog, demo_db_path) -> None:
    url = f"sqlite:///{demo_db_path}"
    assert catalog.resolve("shop", "sqlite") == (url, "sqlite")
    assert catalog.resolve("shop", None) == (url, "sqlite")
    assert catalog.resolve(url, None) == (url, "sqlite")
    assert pickle.loads(pickle.dumps(catalog)).resolve("shop", None) == (url, "sqlite")
    with pytest.raises(LeaseError) as e:
        catalog.resolve("nope", "sqlite")
    assert e.value.kind is LeaseErrorKind.UNKNOWN_DATABASE and "shop" in e.value.message
    with pytest.raises(LeaseError) as e:
        catalog.resolve("shop", "postgresql")
    assert e.value.kind is LeaseErrorKind.UNKNOWN_DATABASE and "available: sqlite" in e.value.message
    with pytest.raises(LeaseError) as e:
        catalog.resolve(url, "mysql")
    assert e.value.kind is LeaseErrorKind.BAD_REQUEST


def test_catalog_rejects_url_under_the_wrong_dialect() -> None:
    with pytest.raises(ValueError, match="is a sqlite URL"):
        Catalog({"x": {"postgresql": "sqlite:///x.sqlite"}})


def test_session_request_rejects_a_bare_string_as_preprocess_sql() -> None:
    with pytest.raises(TypeError, match="sequence of SQL strings"):
        SessionRequest("shop", preprocess_sql="CREATE TABLE t(x)")  # type: ignore[arg-type]
    assert SessionRequest("shop", preprocess_sql=["SELECT 1"]).preprocess_sql == ("SELECT 1",)


# -- the protocol -------------------------------------------------------------------------------

def test_trajectory_state_persists_within_a_lease_and_the_base_is_untouched(shard, demo_db_path):
    before = checksum(demo_db_path)
    lease = shard.lease(req(preprocess_sql=("CREATE TEMP TABLE notes(x)",)))
    assert (lease.shard, lease.worker_id, lease.dialect) == ("test/0", "rollout-0", "sqlite")
    assert lease.expires_at > time.time() + 25
    assert shard.execute(lease, "INSERT INTO notes VALUES (1); DELETE FROM products").ok
    assert shard.execute(lease, "SELECT COUNT(*) FROM notes").rows == ((1,),)
    assert shard.execute(lease, "SELECT COUNT(*) FROM products").rows == ((0,),)
    other = shard.lease(req(worker_id="rollout-1"))
    assert shard.execute(other, "SELECT COUNT(*) FROM products").rows != ((0,),)
    assert dict(shard.stats().holders) == {"rollout-0": 1, "rollout-1": 1}
    assert shard.release(lease) and shard.release(other)
    assert checksum(demo_db_path) == before


def test_double_release_is_harmless_and_execute_after_release_is_session_lost(shard) -> None:
    lease = shard.lease(req())
    assert shard.release(lease) is True
    assert shard.release(lease) is False
    result = shard.execute(lease, "SELECT 1")
    assert result.error.kind is ErrorKind.SESSION_LOST and "released" in result.error.message
    stats = shard.stats()
    assert (stats.active_leases, stats.released, stats.lost_calls) == (0, 1, 1)


def test_an_idle_lease_expires_lazily_and_by_the_reaper(catalog) -> None:
    core = ShardCore("t", ShardConfig(catalog=catalog, lease_ttl_s=0.2))
    try:
        a, b = core.lease(req()), core.lease(req())
        time.sleep(0.3)
        result = core.execute(a, "SELECT 1")  # lazily reclaimed by the call that finds it expired
        assert result.error.kind is ErrorKind.LEASE_EXPIRED and "TTL" in result.error.message
        assert core.reclaim_expired() == 1  # b, by the reaper's pass
        assert core.execute(b, "SELECT 1").error.kind is ErrorKind.LEASE_EXPIRED
        assert core.release(b) is False
        stats = core.stats()
        assert (stats.active_leases, stats.reclaimed) == (0, 2)
    finally:
        core.close()


def test_use_and_renew_keep_a_lease_alive_past_its_ttl(catalog, clock) -> None:
    core = ShardCore("t", ShardConfig(catalog=catalog, lease_ttl_s=0.4))
    core.start_reaper(0.01)  # a real thread, on the test's clock
    try:
        used, renewed = core.lease(req()), core.lease(req())
        for _ in range(6):  # 0.9 s of shard time in total, more than twice the TTL
            clock.advance(0.15)
            assert core.execute(used, "SELECT 1").ok
            renewed = core.renew(renewed)
        assert renewed.expires_at == pytest.approx(clock.time() + 0.4)
        assert core.execute(renewed, "SELECT 1").ok
        assert core.stats().reclaimed == 0
        clock.advance(0.7)
        wait_for(lambda: core.stats().active_leases == 0, "the reaper to take both idle leases")
        assert core.stats().reclaimed == 2
        with pytest.raises(LeaseError) as e:
            core.renew(used)
        assert e.value.kind is LeaseErrorKind.CLOSED
    finally:
        core.close()


def test_a_lease_is_not_reclaimed_while_a_call_runs_on_it(catalog, clock) -> None:
    core = ShardCore("t", ShardConfig(catalog=catalog, lease_ttl_s=0.2))
    try:
        lease = core.lease(req())
        # a call that runs until the test lets it finish (events, not a query's speed)
        session = core._held[lease.id].session
        running, finish = threading.Event(), threading.Event()
        real_execute = session.execute

        def held_open(sql):
            running.set()
            assert finish.wait(60)
            return real_execute(sql)

        session.execute = held_open
        out = {}
        t = threading.Thread(
            target=lambda: out.setdefault("r", core.execute(lease, "SELECT 42")))
        t.start()
        assert running.wait(60), "the call never started"
        clock.advance(0.4)  # past the TTL, but the call is running
        assert core.reclaim_expired() == 0
        finish.set()
        t.join(60)
        assert out["r"].ok and out["r"].rows == ((42,),)
        del session.execute
        assert core.execute(lease, "SELECT 1").ok  # the call's end renewed it
        clock.advance(0.4)  # idle past the TTL now: reclaimed
        assert core.reclaim_expired() == 1
    finally:
        core.close()


def test_capacity_is_refused_at_once_and_frees_on_release(shard) -> None:
    leases = [shard.lease(req()) for _ in range(4)]
    t0 = time.monotonic()
    with pytest.raises(LeaseError) as e:
        shard.lease(req())
    # refused at once, not after the pool's 30 s checkout wait (the bound only tells them apart)
    assert e.value.kind is LeaseErrorKind.CAPACITY and time.monotonic() - t0 < 15
    assert "maximum of 4" in e.value.message
    shard.release(leases[0])
    assert shard.lease(req()).shard == "test/0"
    assert shard.stats().refused == 1


def test_unknown_database_and_urls_when_not_allowed(catalog, demo_db_path) -> None:
    core = ShardCore("t", ShardConfig(catalog=catalog, allow_urls=False))
    try:
        with pytest.raises(LeaseError) as e:
            core.lease(req("missing_db"))
        assert e.value.kind is LeaseErrorKind.UNKNOWN_DATABASE
        with pytest.raises(LeaseError) as e:
            core.lease(req(f"sqlite:///{demo_db_path}"))
        assert e.value.kind is LeaseErrorKind.BAD_REQUEST and "catalog" in e.value.message
        with pytest.raises(LeaseError) as e:
            core.lease({"db": "shop"})  # type: ignore[arg-type]
        assert e.value.kind is LeaseErrorKind.BAD_REQUEST and "SessionRequest" in e.value.message
        with pytest.raises(LeaseError) as e:  # the holder is named (a pool client fills it in)
            core.lease(SessionRequest("shop"))
        assert e.value.kind is LeaseErrorKind.BAD_REQUEST and "worker_id" in e.value.message
        assert core.stats().refused == 4 and core.stats().active_leases == 0
    finally:
        core.close()


def test_a_failing_preprocess_statement_is_open_failed_and_frees_the_slot(shard) -> None:
    for _ in range(5):  # more than max_leases: every failed open gave its slot back
        with pytest.raises(LeaseError) as e:
            shard.lease(req(preprocess_sql=("SELEC nonsense",)))
        assert e.value.kind is LeaseErrorKind.OPEN_FAILED
    assert shard.stats().active_leases == 0
    assert shard.lease(req()).dialect == "sqlite"


def test_missing_database_file_is_open_failed(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'gone.sqlite'}"
    core = ShardCore("t", ShardConfig(catalog=Catalog({"gone": {"sqlite": url}})))
    try:
        with pytest.raises(LeaseError) as e:
            core.lease(req("gone"))
        assert e.value.kind is LeaseErrorKind.OPEN_FAILED and "gone.sqlite" in e.value.message
    finally:
        core.close()


def test_a_lease_from_an_earlier_shard_process_is_session_lost(shard, catalog) -> None:
    lease = shard.lease(req())
    restarted = ShardCore("test/0", ShardConfig(catalog=catalog))  # same id, new incarnation
    try:
        result = restarted.execute(lease, "SELECT 1")
        assert result.error.kind is ErrorKind.SESSION_LOST and "restarted" in result.error.message
        assert restarted.release(lease) is False
    finally:
        restarted.close()


def test_garbage_in_place_of_a_lease_is_an_error_result(shard) -> None:
    result = shard.execute("not-a-lease", "SELECT 1")  # type: ignore[arg-type]
    assert result.error.kind is ErrorKind.SESSION_LOST and "expected a Lease" in result.error.message
    forged = Lease("0" * 24, "test/0", shard.incarnation, "w", "shop", "sqlite", 0.0, 1.0)
    assert shard.execute(forged, "SELECT 1").error.kind is ErrorKind.SESSION_LOST
    assert shard.release(forged) is False


def test_drain_refuses_new_leases_and_lets_live_ones_finish(shard) -> None:
    lease = shard.lease(req())
    shard.drain()
    with pytest.raises(LeaseError) as e:
        shard.lease(req())
    assert e.value.kind is LeaseErrorKind.CLOSED and "draining" in e.value.message
    assert shard.execute(lease, "SELECT 1").ok
    assert shard.release(lease) and shard.stats().draining


def test_release_worker_ends_only_that_workers_leases(shard) -> None:
    mine = [shard.lease(req(worker_id="rollout-7")) for _ in range(2)]
    theirs = shard.lease(req(worker_id="rollout-8"))
    assert shard.release_worker("rollout-7") == 2
    assert all(shard.execute(m, "SELECT 1").error.kind is ErrorKind.SESSION_LOST for m in mine)
    assert shard.execute(theirs, "SELECT 1").ok


def test_close_ends_every_lease_and_refuses_new_ones(catalog) -> None:
    core = ShardCore("t", ShardConfig(catalog=catalog))
    leases = [core.lease(req()) for _ in range(3)]
    assert core.close() == 3
    assert all(core.execute(x, "SELECT 1").error.kind is ErrorKind.SESSION_LOST for x in leases)
    with pytest.raises(LeaseError) as e:
        core.lease(req())
    assert e.value.kind is LeaseErrorKind.CLOSED
    assert core.stats().pool.in_use == 0


def test_concurrent_trajectories_on_one_shard_stay_isolated(catalog, demo_db_path) -> None:
    core = ShardCore("t", ShardConfig(catalog=catalog, max_leases=16))
    before = checksum(demo_db_path)
    errors: list[str] = []

    def trajectory(i: int) -> None:
        lease = core.lease(req(worker_id=f"w{i}"))
        try:
            core.execute(lease, f"CREATE TABLE mine(x); INSERT INTO mine VALUES ({i})")
            for _ in range(20):
                r = core.execute(lease, "SELECT x FROM mine")
                if r.rows != ((i,),):
                    errors.append(f"trajectory {i} saw {r.rows} {r.error}")
        finally:
            core.release(lease)

    threads = [threading.Thread(target=trajectory, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = core.stats()
    core.close()
    assert errors == []
    assert (stats.active_leases, stats.granted, stats.released) == (0, 12, 12)
    assert checksum(demo_db_path) == before


def test_metric_hook_sees_counters_gauge_and_latency(shard) -> None:
    seen: list[tuple[str, float]] = []
    shard.on_metric(lambda name, value: seen.append((name, value)))
    shard.on_metric(lambda name, value: 1 / 0)  # a broken hook never breaks a call
    lease = shard.lease(req())
    assert shard.execute(lease, "SELECT * FROM no_such_table").error.kind is ErrorKind.RUNTIME
    shard.release(lease)
    names = [n for n, _ in seen]
    for expected in ("leases", "active_sessions", "executes", "errors", "execute_ms", "releases"):
        assert expected in names
    assert ("active_sessions", 1) in seen and ("active_sessions", 0) in seen
