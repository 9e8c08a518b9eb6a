"""What PostgreSQL sessions do their own way, on a real server (what every server engine does is in
test_server_sessions.py, run on PostgreSQL too): error positions in the agent's lines, a failed
statement rolled back alone, dynamic SQL that cannot lift the timeout or end the transaction,
streamed results in batches, a fresh database and role per session, sessions that never wait for
each other, and the lexer guard.

Each test gets its own small database made through ``sqlrl.db.provisioning.provision`` (the base of
``server_cases.PG``) and opens sessions with the unprivileged agent URL, exactly as users do.
"""

import time

import pytest

from sqlrl.db import ErrorKind, Limits, PoolConfig, SessionPool, open_session
from sqlrl.db.dialects import postgresql as pg_adapter
from sqlrl.db.provisioning.scratch import SCRATCH
from tests.dialects.server_cases import PG, PG_SESSION_ADVISORY_LOCKS, make_db, ok, pg_admin_query

pytestmark = pytest.mark.postgres


@pytest.fixture
def db(pg_admin_url, request):
    yield from make_db(PG, pg_admin_url, request)


# --- statements ----------------------------------------------------------------------------------

def test_error_messages_point_at_the_agents_own_lines(db):
    with open_session(db.url) as s:
        ok(s.execute("SELECT 1"))
        e = s.execute("SELECT\n  nosuchcolumn\nFROM customers").error
        assert e.kind is ErrorKind.RUNTIME and "LINE 2:" in e.message and "DECLARE" not in e.message
        e = s.execute("SELECT * FORM customers").error
        assert e.kind is ErrorKind.SYNTAX and "LINE 1:" in e.message and "sqlrl" not in e.message


def test_a_failed_statement_rolls_back_only_itself(db):
    with open_session(db.url) as s:
        ok(s.execute("INSERT INTO customers VALUES (100, 'a', NULL)"))
        r = s.execute("DELETE FROM customers WHERE id = 100; SELECT 1/0; SELECT 2")
        assert r.error.kind is ErrorKind.RUNTIME and r.error.statement_index == 1
        assert s.execute("SELECT count(*) FROM customers WHERE id = 100").rows == ((0,),)
        # an error in the first statement after a success rolls back only itself
        ok(s.execute("INSERT INTO customers VALUES (102, 'c', NULL)"))
        assert s.execute("INSERT INTO customers VALUES (102, 'dup', NULL)").error.kind is ErrorKind.RUNTIME
        assert s.execute("SELECT name FROM customers WHERE id = 102").rows == (("c",),)


def test_dynamic_sql_neither_lifts_the_timeout_nor_ends_the_transaction(db):
    with open_session(db.url, limits=Limits(timeout_s=1)) as s:
        # a DO block that lifts statement_timeout with dynamic SQL does not carry over: the 1 s
        # timeout stops a 60 s sleep (the bound tells 1 s from 60 s, whatever the machine load)
        ok(s.execute("DO $$BEGIN EXECUTE 'SET statement' || '_timeout = 0'; END$$"))
        t0 = time.monotonic()
        assert s.execute("SELECT pg_sleep(60)").error.kind is ErrorKind.TIMEOUT
        assert time.monotonic() - t0 < 30
        r = s.execute("DO $$BEGIN EXECUTE 'COM' || 'MIT'; END$$")  # cannot end the transaction
        assert r.error.kind is ErrorKind.RUNTIME and "transaction" in r.error.message


def test_results_stream_in_batches_and_a_later_batch_error_is_typed(db):
    with open_session(db.url) as s:  # several FETCH batches, in order, nothing lost
        r = ok(s.execute("SELECT g FROM generate_series(1, 2500) g"))
        assert r.rows == tuple((i,) for i in range(1, 2501)) and not r.truncated
        # an error raised in a later batch is a typed error; the session carries on
        r = s.execute("SELECT 1 / (g - 1800) FROM generate_series(1, 2500) g")
        assert r.error.kind is ErrorKind.RUNTIME
        ok(s.execute("CREATE TEMP TABLE after_error AS SELECT 1 AS x"))
        assert ok(s.execute("SELECT x FROM after_error")).rows == ((1,),)


def test_data_modifying_queries_are_not_streamed(db):
    with open_session(db.url) as s:
        r = ok(s.execute("WITH d AS (DELETE FROM orders WHERE qty = 5 RETURNING id) "
                         "SELECT count(*) FROM d"))
        assert r.rows[0][0] > 0
        ok(s.execute("SELECT * INTO copy_of_products FROM products"))
        assert s.execute("SELECT count(*) FROM copy_of_products").rows == ((10,),)
        assert ok(s.execute("SELECT id FROM customers WHERE id = 1 FOR UPDATE")).rows == ((1,),)


# --- isolation under load ------------------------------------------------------------------------


def test_ddl_on_a_base_table_stays_in_the_session(db):
    before = PG.checksum(db)
    with open_session(db.url) as a:
        ok(a.execute("ALTER TABLE customers ADD COLUMN vip boolean DEFAULT true"))
        assert a.execute("SELECT bool_and(vip) FROM customers").rows == ((True,),)
    with open_session(db.url) as c:
        assert c.execute("SELECT vip FROM customers").error is not None
    assert PG.checksum(db) == before


# --- isolation -----------------------------------------------------------------------------------

def test_every_session_gets_a_fresh_database_and_role(db):
    with SessionPool(PoolConfig(max_size=1)) as pool:
        with pool.session(db.url) as s:
            pid, role = s.execute("SELECT pg_backend_pid(), current_user").rows[0]
            ok(s.execute("PREPARE p AS SELECT 1"))
            assert s.execute("SELECT pg_advisory_lock(7)").error.kind is ErrorKind.PERMISSION
            ok(s.execute("SET search_path = pg_catalog"))
            ok(s.execute("SELECT count(*) FROM pg_class"))  # leaves the streamed cursor open
        with pool.session(db.url) as s:
            pid2, role2 = s.execute("SELECT pg_backend_pid(), current_user").rows[0]
            assert pid2 != pid and role2 != role and role2.startswith("sqlrl_s_")
            assert s.execute("EXECUTE p").error.kind is ErrorKind.RUNTIME
            assert ok(s.execute("SHOW search_path")).rows != (("pg_catalog",),)
            assert ok(s.execute("SELECT current_setting('statement' || '_timeout')")).rows \
                == (("5s",),)
            assert ok(s.execute("SELECT count(*) FROM customers")).rows == ((20,),)
    assert SCRATCH.settle()
    assert pg_admin_query(db.admin, PG_SESSION_ADVISORY_LOCKS) == [(0,)]
    assert pg_admin_query(db.admin, "SELECT count(*) FROM pg_roles WHERE rolname = %s",
                       (role,)) == [(0,)]


def test_sessions_never_wait_for_each_other(db):
    with open_session(db.url, limits=Limits(timeout_s=1)) as a, \
            open_session(db.url, limits=Limits(timeout_s=1)) as b:
        ok(a.execute("UPDATE customers SET name = 'changed' WHERE id = 1"))
        ok(a.execute("SELECT * FROM products"))  # a's cursor block holds a lock until its next call
        ok(b.execute("ALTER TABLE products ADD COLUMN c int"))  # b's own table: no wait
        assert ok(b.execute("SELECT name FROM customers WHERE id = 1")).rows == (("customer 1",),)
        ok(a.execute("DROP TABLE products CASCADE"))
        assert ok(b.execute("SELECT count(*) FROM products")).rows == ((10,),)
    with open_session(db.url) as c:
        assert ok(c.execute("SELECT count(*) FROM products")).rows == ((10,),)


# --- the sandbox ---------------------------------------------------------------------------------


# --- the sandbox ---------------------------------------------------------------------------------

def test_the_lexer_guard_refuses_hidden_statements():
    denial = pg_adapter.denial
    assert denial("SELECT 1; COMMIT")  # a ';' the splitter did not split on
    assert denial("SELECT a$b$; COMMIT --$b$")  # a$b$ is an identifier, not a dollar quote
    assert denial("SELECT '\\'; COMMIT; --'")  # standard strings have no backslash escapes
    # PostgreSQL's scanner rejects "1E" (trailing junk), so the server runs none of this text: it
    # is sent whole and fails as a syntax error (tests/dialects/test_filter_attacks.py)
    assert denial("SELECT 1E'x'; COMMIT") is None
    assert denial("SELECT 1 /* /* */ */; COMMIT")
    for fine in ("SELECT ';'", "SELECT E'\\';'", "SELECT $$;$$", "SELECT $t$ ; $t$",
                 'SELECT 1 AS ";"', "SELECT 1 -- ;", "SELECT 1 /* /* ; */ ; */",
                 "SELECT 'it''s; fine'", "SELECT U&'\\0041;'"):
        assert denial(fine) is None, fine


def test_the_agent_is_no_superuser(db):
    with open_session(db.url) as s:
        (role, superuser), = s.execute("SELECT current_user, current_setting('is_superuser')").rows
        assert role.startswith("sqlrl_s_") and superuser == "off"
