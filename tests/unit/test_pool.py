"""SessionPool on SQLite: checkout/checkin, bounded wait, counters, events, thread safety."""

import threading
import time

import pytest

from sqlrl.db import ErrorKind, Limits, PoolConfig, PoolTimeout, SessionError, SessionPool


def url(path):
    return f"sqlite:///{path}"


def test_sessions_from_the_pool_are_isolated_and_counted(demo_db_path):
    events = []
    with SessionPool() as pool:
        pool.on("checkout", lambda u, waited: events.append("checkout"))
        pool.on("checkin", lambda u, reused: events.append(("checkin", reused)))
        with pool.session(url(demo_db_path)) as a, pool.session(url(demo_db_path)) as b:
            a.execute("DELETE FROM orders")
            assert a.execute("SELECT count(*) FROM orders").rows == ((0,),)
            assert b.execute("SELECT count(*) FROM orders").rows == ((300,),)
            assert pool.stats().in_use == 2
        stats = pool.stats()
    assert stats.leases == 2 and stats.in_use == 0 and stats.connects == 2
    assert stats.resets == 2 and stats.discards == 0 and stats.idle == 2
    assert events == ["checkout", "checkout", ("checkin", True), ("checkin", True)]


def test_a_reused_connection_starts_from_the_base_again(demo_db_path):
    with SessionPool(PoolConfig(max_size=1)) as pool:
        with pool.session(url(demo_db_path)) as s:
            s.execute("DELETE FROM orders")
            s.execute("CREATE TABLE scratch(x)")
            s.execute("CREATE VIEW vv AS SELECT 1")
        with pool.session(url(demo_db_path)) as s:
            assert s.execute("SELECT count(*) FROM orders").rows == ((300,),)
            assert s.execute("SELECT * FROM scratch").error is not None
            assert s.execute("SELECT * FROM vv").error is not None
            s.execute("CREATE TEMP TABLE t(x)")  # TEMP objects make the connection unreusable
        stats = pool.stats()
        assert stats.connects == 1 and stats.resets == 1 and stats.discards == 1
        with pool.session(url(demo_db_path)) as s:
            assert s.execute("SELECT * FROM t").error is not None


@pytest.mark.parametrize("sql, reused", [
    ("CREATE TEMP TABLE a(x)", False), ("CREATE TEMPORARY TABLE b AS SELECT 1", False),
    ("CREATE TABLE temp.c(x)", False), ("CREATE TEMP VIEW d AS SELECT 1", False),
    ("CREATE TABLE main.e(x)", True), ("CREATE VIEW f AS SELECT 1", True),
])
def test_only_connections_without_temp_objects_are_reused(demo_db_path, sql, reused):
    with SessionPool() as pool:
        with pool.session(url(demo_db_path)) as s:
            assert s.execute(sql).ok
        assert pool.stats().resets == int(reused)


def test_discard_mode_never_reuses(demo_db_path):
    with SessionPool(PoolConfig(reset_on_return="discard")) as pool:
        for _ in range(3):
            pool.session(url(demo_db_path)).close()
        assert pool.stats().connects == 3 and pool.stats().discards == 3


def test_bounded_wait_error_states_size_in_use_and_timeout(demo_db_path):
    pool = SessionPool(PoolConfig(max_size=2, checkout_timeout_s=0.2))
    held = [pool.session(url(demo_db_path)) for _ in range(2)]
    t0 = time.monotonic()
    with pytest.raises(PoolTimeout) as info:
        pool.session(url(demo_db_path))
    assert time.monotonic() - t0 > 0.15  # it waited (a lower bound: load cannot break it) ...
    # ... and gave up by itself (the upper bound only stops a hang)
    assert time.monotonic() - t0 < 30
    message = str(info.value)
    assert "pool size 2" in message and "2 in use" in message and "0.2s" in message
    assert pool.stats().wait_timeouts == 1 and pool.stats().waits == 1
    for s in held:
        s.close()
    pool.session(url(demo_db_path)).close()  # slots came back


def test_a_waiting_checkout_gets_the_connection_returned_by_another_thread(demo_db_path):
    pool = SessionPool(PoolConfig(max_size=1, checkout_timeout_s=5))
    first = pool.session(url(demo_db_path))
    got = []

    def waiter():
        with pool.session(url(demo_db_path)) as s:
            got.append(s.execute("SELECT 1").rows)

    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 60  # wait for the event (the waiter is waiting), not a clock
    while pool.stats().waits == 0:
        assert time.monotonic() < deadline, "the waiter never started waiting"
        time.sleep(0.01)
    assert got == []
    first.close()
    t.join(60)
    assert got == [((1,),)] and pool.stats().waits == 1


def test_many_threads_never_exceed_the_pool_size(demo_db_path):
    pool = SessionPool(PoolConfig(max_size=3, checkout_timeout_s=10))
    peak = []
    failures = []

    def work(i):
        for _ in range(20):
            with pool.session(url(demo_db_path)) as s:
                peak.append(pool.stats().in_use)
                s.execute(f"CREATE TEMP TABLE t{i}(x)")
                r = s.execute(f"SELECT count(*) FROM t{i}")
                if r.rows != ((0,),):
                    failures.append(r)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [] and max(peak) <= 3
    stats = pool.stats()
    assert stats.leases == 160 and stats.in_use == 0


def test_statement_errors_and_timeouts_are_counted(demo_db_path):
    pool = SessionPool(PoolConfig(limits=Limits(timeout_s=0.3)))
    results = []
    pool.on("result", lambda u, r: results.append(r.ok))
    with pool.session(url(demo_db_path)) as s:
        s.execute("SELECT 1")
        s.execute("SELEC 1")
        s.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c")
    stats = pool.stats()
    assert stats.statement_errors == 2 and stats.statement_timeouts == 1
    assert results == [True, False, False]


def test_connect_errors_free_the_slot_and_raise_session_error(tmp_path):
    pool = SessionPool(PoolConfig(max_size=1, checkout_timeout_s=0.1))
    for _ in range(3):
        with pytest.raises(SessionError, match="not found"):
            pool.session(url(tmp_path / "missing.sqlite"))
    assert pool.stats().connect_errors == 3 and pool.stats().in_use == 0


def test_failing_preprocess_returns_the_connection(demo_db_path):
    pool = SessionPool(PoolConfig(max_size=1, checkout_timeout_s=0.1))
    with pytest.raises(SessionError, match="preprocess_sql failed"):
        pool.session(url(demo_db_path), preprocess_sql=["SELEC 1"])
    with pool.session(url(demo_db_path), preprocess_sql=["CREATE TEMP TABLE p AS SELECT 4 AS x"]) as s:
        assert s.execute("SELECT x FROM p").rows == ((4,),)


def test_listener_errors_never_break_sessions(demo_db_path):
    pool = SessionPool()
    pool.on("result", lambda u, r: 1 / 0)
    with pool.session(url(demo_db_path)) as s:
        assert s.execute("SELECT 1").ok
    with pytest.raises(ValueError, match="unknown pool event"):
        pool.on("nope", print)


def test_closed_pool_refuses_new_sessions(demo_db_path):
    pool = SessionPool()
    live = pool.session(url(demo_db_path))
    pool.close()
    with pytest.raises(SessionError, match="closed"):
        pool.session(url(demo_db_path))
    assert live.execute("SELECT 1").ok  # a live session finishes its trajectory
    live.close()
    assert live.execute("SELECT 1").error.kind is ErrorKind.SESSION_LOST


def test_config_validation():
    with pytest.raises(ValueError):
        PoolConfig(max_size=0)
    with pytest.raises(ValueError):
        PoolConfig(reset_on_return="never")
    with pytest.raises(ValueError):
        Limits(timeout_s=0)


def test_sessions_with_other_limits_get_connections_opened_with_them(demo_db_path):
    # the default timeout is far from the session's: the wall-time bound below only has to tell
    # 0.3 s from 120 s, which no machine load blurs
    pool = SessionPool(PoolConfig(limits=Limits(timeout_s=120)))
    runaway = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"
    pool.session(url(demo_db_path)).close()  # a warm connection with the default limits
    t0 = time.monotonic()
    with pool.session(url(demo_db_path), limits=Limits(timeout_s=0.3, max_rows=2)) as s:
        assert s.limits.timeout_s == 0.3
        assert s.execute(runaway).error.kind is ErrorKind.TIMEOUT
        assert s.execute("SELECT * FROM orders").row_count == 2
    assert time.monotonic() - t0 < 60
    assert pool.stats().connects == 2 and pool.stats().idle == 2
