"""SessionPool against a real PostgreSQL that restarts mid-run: the pool recovers without leaking.

Restarting the server kills every connection (the ready clones' connections, sqlrl's admin
connections and the one under a live session). Expected: the live session reports session-lost
(never hangs or raises), dead ready clones are found by their ping and replaced, later sessions
work, and no scratch database or server connection is left behind.
"""

import subprocess
import uuid
from pathlib import Path

import psycopg2
import pytest

from sqlrl.db import ErrorKind, PoolConfig, SessionPool
from sqlrl.db.provisioning import provision
from sqlrl.db.provisioning.scratch import SCRATCH
from tests.conftest import scratch_names

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


def _scratch_backends(admin_url):
    return _admin_query(admin_url, "SELECT count(*) FROM pg_stat_activity WHERE datname LIKE "
                                   "'sqlrl\\_s\\_%' AND application_name = 'sqlrl'")[0][0]


def _scratch_databases(admin_url, baseline):
    return scratch_names(admin_url) - baseline


@pytest.fixture
def pg_db(pg_admin_url):
    name = f"sqlrl_recovery_{uuid.uuid4().hex[:8]}"
    db_admin = provision.create_database(pg_admin_url, name, replace=True)
    # The test server runs with synchronous_commit=off, and an immediate-mode restart may drop
    # commits still in the WAL buffer: make the fixture's data durable before anything restarts.
    _admin_query(db_admin, "SET synchronous_commit = on; CREATE TABLE t(x int); "
                           "INSERT INTO t SELECT generate_series(1, 50)")
    _admin_query(pg_admin_url, "CHECKPOINT")
    provision.prepare_server(pg_admin_url)
    provision.seal_database(pg_admin_url, name)
    yield name, provision.session_url(pg_admin_url, name)
    provision.drop_database(pg_admin_url, name)


def test_pool_recovers_after_a_server_restart_without_leaking(pg_admin_url, pg_db):
    name, url = pg_db
    baseline = scratch_names(pg_admin_url)  # other processes' clones, if any
    pool = SessionPool(PoolConfig(max_size=4, checkout_timeout_s=10))
    for _ in range(4):
        with pool.session(url) as s:
            assert s.execute("SELECT count(*) FROM t").rows == ((50,),)
    assert SCRATCH.settle()
    assert SCRATCH.stats().ready >= 1  # clones prepared ahead, each with an open connection
    live = pool.session(url)  # a trajectory in progress
    live.execute("CREATE TEMP TABLE mine AS SELECT 1 AS x")
    stale_before = SCRATCH.stats().stale

    subprocess.run(["bash", str(ROOT / "scripts" / "dbservers.sh"), "restart-pg"], check=True,
                   capture_output=True)

    r = live.execute("SELECT x FROM mine")
    assert r.error is not None and r.error.kind is ErrorKind.SESSION_LOST
    assert live.execute("SELECT 1").error.kind is ErrorKind.SESSION_LOST
    live.close()

    for _ in range(8):  # dead ready clones are found by their ping and replaced
        with pool.session(url) as s:
            r = s.execute("SELECT count(*) FROM t")
            assert r.error is None, r.error
            assert r.rows == ((50,),)
    assert SCRATCH.stats().stale > stale_before
    pool.close()
    assert SCRATCH.settle()
    # nothing leaked server-side: the dead clones were dropped over new admin connections, and
    # what is left is this process's ready clones, one backend each
    held = SCRATCH.held_names()
    assert _scratch_databases(pg_admin_url, baseline) <= held, SCRATCH.stats()
    assert _scratch_backends(pg_admin_url) <= SCRATCH.stats().ready + len(baseline)


def test_a_ready_clone_whose_backend_died_is_never_handed_out(pg_admin_url, pg_db):
    name, url = pg_db
    baseline = scratch_names(pg_admin_url)
    with SessionPool(PoolConfig(max_size=1)) as pool:
        for _ in range(2):
            pool.session(url).close()
        assert SCRATCH.settle() and SCRATCH.stats().ready >= 1
        stale_before = SCRATCH.stats().stale
        _admin_query(pg_admin_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                   "WHERE datname LIKE 'sqlrl\\_s\\_%' AND application_name = 'sqlrl'")
        with pool.session(url) as s:  # not a dead connection: a fresh clone
            assert s.execute("SELECT count(*) FROM t").rows == ((50,),)
        assert SCRATCH.stats().stale > stale_before
    assert SCRATCH.settle()
    assert _scratch_databases(pg_admin_url, baseline) <= SCRATCH.held_names()
