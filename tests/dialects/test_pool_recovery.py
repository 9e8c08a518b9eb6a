"""SessionPool against a real PostgreSQL that restarts mid-run: the pool recovers without leaking.

Restarting the server kills every connection (idle ones in the pool and the one under a live
session). Expected: the live session reports session-lost (never hangs or raises), pre-ping
replaces dead idle connections, later sessions work, and no server connection is left behind.
"""

import subprocess
import time
import uuid
from pathlib import Path

import psycopg2
import pytest

from sqlrl.db import ErrorKind, PoolConfig, SessionPool, provision

ROOT = Path(__file__).resolve().parents[2]


def _admin_query(url, sql):
    from sqlrl.db.url import parse_url
    u = parse_url(url)
    conn = psycopg2.connect(host=u.host, port=u.port, user=u.username, password=u.password,
                            dbname=u.database)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


def _backends(admin_url, db_name):
    return _admin_query(admin_url, f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{db_name}'")[0][0]


@pytest.fixture
def pg_db(pg_admin_url):
    name = f"sqlrl_recovery_{uuid.uuid4().hex[:8]}"
    db_admin = provision.create_database(pg_admin_url, name, replace=True)
    # The test server runs with synchronous_commit=off, and an immediate-mode restart may drop
    # commits still in the WAL buffer: make the fixture's data durable before anything restarts.
    _admin_query(db_admin, "SET synchronous_commit = on; CREATE TABLE t(x int); "
                           "INSERT INTO t SELECT generate_series(1, 50)")
    _admin_query(pg_admin_url, "CHECKPOINT")
    provision.ensure_agent_role(pg_admin_url)
    provision.grant_database(pg_admin_url, name)
    yield name, provision.agent_url(pg_admin_url, name)
    provision.drop_database(pg_admin_url, name)


def test_pool_recovers_after_a_server_restart_without_leaking(pg_admin_url, pg_db):
    name, url = pg_db
    pool = SessionPool(PoolConfig(max_size=4, checkout_timeout_s=10))
    warm = [pool.session(url) for _ in range(4)]
    for s in warm:
        assert s.execute("SELECT count(*) FROM t").rows == ((50,),)
        s.close()
    assert pool.stats().idle == 4
    live = pool.session(url)  # a trajectory in progress
    live.execute("CREATE TEMP TABLE mine AS SELECT 1 AS x")

    subprocess.run(["bash", str(ROOT / "scripts" / "dbservers.sh"), "restart-pg"], check=True,
                   capture_output=True)

    r = live.execute("SELECT x FROM mine")
    assert r.error is not None and r.error.kind is ErrorKind.SESSION_LOST
    assert live.execute("SELECT 1").error.kind is ErrorKind.SESSION_LOST
    live.close()

    for _ in range(8):
        with pool.session(url) as s:
            r = s.execute("SELECT count(*) FROM t")
            assert r.error is None, r.error
            assert r.rows == ((50,),)
    stats = pool.stats()
    assert stats.invalidations >= 3  # the dead idle connections found by pre-ping
    assert stats.in_use == 0 and stats.idle <= 4
    assert _backends(pg_admin_url, name) == stats.idle  # nothing leaked server-side
    pool.close()
    deadline = time.monotonic() + 30  # backends of closed connections exit asynchronously
    while _backends(pg_admin_url, name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _backends(pg_admin_url, name) == 0


def test_pool_without_pre_ping_loses_one_session_then_recovers(pg_admin_url, pg_db):
    name, url = pg_db
    pool = SessionPool(PoolConfig(max_size=1, pre_ping=False))
    pool.session(url).close()
    subprocess.run(["bash", str(ROOT / "scripts" / "dbservers.sh"), "restart-pg"], check=True,
                   capture_output=True)
    with pool.session(url) as s:  # handed the dead connection: a typed error, not a hang
        assert s.execute("SELECT 1").error.kind is ErrorKind.SESSION_LOST
    with pool.session(url) as s:  # the dead one was discarded on return
        assert s.execute("SELECT count(*) FROM t").rows == ((50,),)
    assert pool.stats().discards >= 1
    pool.close()
