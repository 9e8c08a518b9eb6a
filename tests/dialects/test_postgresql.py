"""PostgreSQL sessions on a real server: isolation, limits, the sandbox, typed errors.

Each test gets its own small database made through ``sqlrl.db.provision`` and opens sessions with
the unprivileged agent URL, exactly as users do.
"""

import hashlib
import os
import random
import threading
import time
from types import SimpleNamespace

import psycopg2
import pytest

from sqlrl.db import ErrorKind, Limits, PoolConfig, SessionError, SessionPool, open_session
from sqlrl.db import provision
from sqlrl.db.dialects import postgresql as pg_adapter
from sqlrl.db.scratch import SCRATCH
from sqlrl.db.url import parse_url
from tests.conftest import scratch_names, sealed_base

pytestmark = pytest.mark.postgres

BASE_SQL = [
    "CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, city text)",
    "CREATE TABLE products (id integer PRIMARY KEY, name text NOT NULL, price numeric(10,2) NOT NULL)",
    "CREATE TABLE orders (id serial PRIMARY KEY, customer_id integer REFERENCES customers(id), "
    "product_id integer REFERENCES products(id), qty integer NOT NULL, placed date NOT NULL, "
    "meta jsonb, tags text[])",
    "CREATE VIEW big_orders AS SELECT id, customer_id, qty FROM orders WHERE qty >= 3",
    "INSERT INTO customers SELECT g, 'customer ' || g, (ARRAY['Oslo','Lima','Pune'])[1 + g % 3] "
    "FROM generate_series(1, 20) g",
    "INSERT INTO products SELECT g, 'product ' || g, (g * 1.25)::numeric(10,2) "
    "FROM generate_series(1, 10) g",
    "INSERT INTO orders(customer_id, product_id, qty, placed, meta, tags) SELECT 1 + g % 20, "
    "1 + g % 10, 1 + g % 5, DATE '2024-01-01' + g, jsonb_build_object('n', g, 'gift', g % 2 = 0), "
    "ARRAY['a', 'b'] FROM generate_series(1, 60) g",
]
TABLES = ("customers", "products", "orders")


def _admin(url):
    conn = psycopg2.connect(url)
    conn.autocommit = True
    return conn


def admin_query(url, sql, args=None):
    conn = _admin(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


def checksum(admin_db_url):
    """Hash of the table list, column definitions, view definitions, indexes and every table's
    sorted rows."""
    conn = _admin(admin_db_url)
    h = hashlib.sha256()
    with conn.cursor() as cur:
        cur.execute("SELECT table_name, table_type FROM information_schema.tables "
                    "WHERE table_schema = 'public' ORDER BY 1")
        tables = cur.fetchall()
        h.update(repr(tables).encode())
        for sql in ("SELECT table_name, column_name, data_type, is_nullable, column_default "
                    "FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2",
                    "SELECT viewname, definition FROM pg_views WHERE schemaname = 'public' ORDER BY 1",
                    "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1",
                    "SELECT relname, pg_get_userbyid(relowner) FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE nspname = 'public' ORDER BY 1"):
            cur.execute(sql)
            h.update(repr(cur.fetchall()).encode())
        for name, kind in tables:
            if kind == "BASE TABLE":
                cur.execute(f'SELECT * FROM "{name}"')
                for row in sorted(map(repr, cur.fetchall())):
                    h.update(row.encode())
    conn.close()
    return h.hexdigest()


@pytest.fixture(scope="module")
def pg(pg_admin_url):
    provision.prepare_server(pg_admin_url)
    return pg_admin_url


@pytest.fixture
def db(pg, request):
    tag = hashlib.md5(request.node.name.encode()).hexdigest()[:8]
    name = f"sqlrl_t_{os.getpid()}_{tag}"
    for admin_db, url in sealed_base(pg, name, BASE_SQL):
        yield SimpleNamespace(name=name, admin=admin_db, url=url, server=pg,
                              baseline=scratch_names(pg))


def ok(result):
    assert result.error is None, result.error
    return result


# --- basics ------------------------------------------------------------------------------------

def test_execute_returns_columns_and_rows(db):
    with open_session(db.url) as s:
        r = ok(s.execute("SELECT id, name FROM customers WHERE id <= 2 ORDER BY id"))
        assert r.columns == ("id", "name")
        assert r.rows == ((1, "customer 1"), (2, "customer 2"))
        assert r.row_count == 2 and not r.truncated
        assert ok(s.execute("UPDATE products SET price = price + 1 WHERE id <= 3")).affected_rows == 3
        assert ok(s.execute("SELECT count(*) FROM big_orders")).rows[0][0] > 0


def test_values_are_normalised(db):
    with open_session(db.url) as s:
        r = ok(s.execute("SELECT price, 2::numeric, placed, meta, tags, '\\x0aff'::bytea, "
                         "interval '90 seconds', TIMESTAMP '2020-01-31 12:00:00', 1.5::float8, "
                         "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid "
                         "FROM orders JOIN products p ON p.id = product_id WHERE orders.id = 2"))
        assert r.rows == ((3.75, 2, "2024-01-03", '{"gift":true,"n":2}', '["a","b"]', "0x0aff", 90.0,
                           "2020-01-31 12:00:00", 1.5, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),)
        hash(r.rows)


def test_state_persists_across_calls_and_is_private(db):
    before = checksum(db.admin)
    with open_session(db.url) as a, open_session(db.url) as b:
        ok(a.execute("CREATE TEMP TABLE t(x int)"))
        assert ok(a.execute("INSERT INTO t VALUES (1), (2)")).affected_rows == 2
        ok(a.execute("CREATE TABLE notes(id int, body text)"))
        ok(a.execute("INSERT INTO notes VALUES (1, 'hi')"))
        ok(a.execute("DELETE FROM orders WHERE qty = 1"))
        ok(a.execute("UPDATE products SET price = 0"))
        ok(a.execute("CREATE VIEW v AS SELECT count(*) AS n FROM orders"))
        assert a.execute("SELECT sum(x) FROM t").rows == ((3,),)
        assert a.execute("SELECT body FROM notes").rows == (("hi",),)
        assert a.execute("SELECT max(price) FROM products").rows == ((0,),)
        n_a = a.execute("SELECT n FROM v").rows[0][0]
        # the concurrently open session sees none of it
        assert b.execute("SELECT * FROM t").error.kind is ErrorKind.RUNTIME
        assert b.execute("SELECT * FROM notes").error.kind is ErrorKind.RUNTIME
        assert b.execute("SELECT * FROM v").error.kind is ErrorKind.RUNTIME
        assert b.execute("SELECT count(*) FROM orders").rows[0][0] > n_a
        assert b.execute("SELECT max(price) FROM products").rows[0][0] > 0
        # (DDL on a base table would lock it for b until a ends: see the lock test)
        ok(a.execute("ALTER TABLE customers ADD COLUMN vip boolean DEFAULT true"))
        assert a.execute("SELECT bool_and(vip) FROM customers").rows == ((True,),)
    with open_session(db.url) as c:  # and all of it is gone after close
        assert c.execute("SELECT * FROM notes").error is not None
        assert c.execute("SELECT vip FROM customers").error is not None
        assert c.execute("SELECT count(*) FROM orders").rows == ((60,),)
    assert checksum(db.admin) == before


def test_multi_statement_stops_at_first_error_and_keeps_earlier_effects(db):
    with open_session(db.url) as s:
        r = s.execute("INSERT INTO customers VALUES (100, 'a', NULL); SELEC 1; "
                      "INSERT INTO customers VALUES (101, 'b', NULL)")
        assert r.error.kind is ErrorKind.SYNTAX and r.error.statement_index == 1
        assert r.statements == 3
        assert s.execute("SELECT id FROM customers WHERE id >= 100").rows == ((100,),)
        r = s.execute("DELETE FROM customers WHERE id = 100; SELECT 1/0; SELECT 2")
        assert r.error.kind is ErrorKind.RUNTIME and r.error.statement_index == 1
        assert s.execute("SELECT count(*) FROM customers WHERE id = 100").rows == ((0,),)
        # an error in the first statement after a success rolls back only itself
        ok(s.execute("INSERT INTO customers VALUES (102, 'c', NULL)"))
        assert s.execute("INSERT INTO customers VALUES (102, 'dup', NULL)").error.kind is ErrorKind.RUNTIME
        assert s.execute("SELECT name FROM customers WHERE id = 102").rows == (("c",),)
        r = ok(s.execute("SELECT 1 AS a; SELECT 2 AS b"))
        assert r.columns == ("b",) and r.rows == ((2,),) and r.statements == 2


def test_error_messages_point_at_the_agents_own_lines(db):
    with open_session(db.url) as s:
        ok(s.execute("SELECT 1"))
        e = s.execute("SELECT\n  nosuchcolumn\nFROM customers").error
        assert e.kind is ErrorKind.RUNTIME and "LINE 2:" in e.message and "DECLARE" not in e.message
        e = s.execute("SELECT * FORM customers").error
        assert e.kind is ErrorKind.SYNTAX and "LINE 1:" in e.message and "sqlrl" not in e.message


def test_error_kinds(db):
    with open_session(db.url, limits=Limits(timeout_s=1)) as s:
        assert s.execute("SELEC 1").error.kind is ErrorKind.SYNTAX
        assert s.execute("SELECT * FROM nosuch").error.kind is ErrorKind.RUNTIME
        assert s.execute("SELECT 1/0").error.kind is ErrorKind.RUNTIME
        assert s.execute("SELECT * FROM pg_authid").error.kind is ErrorKind.PERMISSION
        assert s.execute("SELECT pg_sleep(3)").error.kind is ErrorKind.TIMEOUT
        assert s.execute("").error.kind is ErrorKind.SYNTAX
        assert ok(s.execute("SELECT 1")).rows == ((1,),)


def test_runaway_recursive_cte_times_out_and_the_session_survives(db):
    with open_session(db.url, limits=Limits(timeout_s=1)) as s:
        ok(s.execute("CREATE TEMP TABLE kept AS SELECT 7 AS x"))
        t0 = time.monotonic()
        r = s.execute("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
                      "SELECT count(*) FROM r")
        assert r.error.kind is ErrorKind.TIMEOUT  # it never ends by itself
        assert time.monotonic() - t0 < 30  # only a guard against hanging
        assert s.execute("SELECT x FROM kept").rows == ((7,),)
        # a DO block that lifts statement_timeout with dynamic SQL does not carry over: the 1 s
        # timeout stops a 60 s sleep (the bound tells 1 s from 60 s, whatever the machine load)
        ok(s.execute("DO $$BEGIN EXECUTE 'SET statement' || '_timeout = 0'; END$$"))
        t0 = time.monotonic()
        assert s.execute("SELECT pg_sleep(60)").error.kind is ErrorKind.TIMEOUT
        assert time.monotonic() - t0 < 30


def test_row_and_byte_caps_truncate_and_stop_the_query(db):
    with open_session(db.url, limits=Limits(max_rows=5)) as s:
        r = ok(s.execute("SELECT g FROM generate_series(1, 100) g"))
        assert r.rows == tuple((i,) for i in range(1, 6)) and r.truncated
        t0 = time.monotonic()  # a billion-row cross join stops at the cap (server-side cursor)
        r = ok(s.execute("SELECT a.g FROM generate_series(1, 100000) a(g), generate_series(1, 100000) b(g)"))
        # ok(): the whole join would have run into the 5 s statement timeout (an error)
        assert r.row_count == 5 and r.truncated and time.monotonic() - t0 < 30
        assert ok(s.execute("SELECT 1")).rows == ((1,),)
    with open_session(db.url, limits=Limits(max_bytes=2000)) as s:
        r = ok(s.execute("SELECT repeat('x', 100) FROM generate_series(1, 100)"))
        assert r.truncated and 0 < r.row_count < 100
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

def _random_statement(rng):
    t = rng.choice(TABLES)
    n = rng.randint(0, 9)
    return rng.choice([
        f"DELETE FROM {t} WHERE id % {rng.randint(2, 5)} = 0",
        "UPDATE products SET price = price * 2",
        f"UPDATE customers SET name = 'x{n}' WHERE id = {n}",
        f"INSERT INTO customers VALUES ({1000 + n}, 'new', NULL)",
        "INSERT INTO orders(customer_id, product_id, qty, placed) VALUES (1, 1, 9, now())",
        f"DROP TABLE {t} CASCADE",
        f"TRUNCATE {t} CASCADE",
        f"ALTER TABLE {t} ADD COLUMN c{n} text DEFAULT 'z'",
        f"ALTER TABLE {t} DROP COLUMN name",
        f"ALTER TABLE {t} RENAME TO {t}_old",
        f"CREATE TABLE t{n} AS SELECT * FROM {t}",
        f"CREATE VIEW v{n} AS SELECT 1 AS x",
        "DROP VIEW big_orders",
        "CREATE OR REPLACE VIEW big_orders AS SELECT 1 AS id, 2 AS customer_id, 3 AS qty",
        f"CREATE INDEX ON {t}(id)",
        "CREATE TEMP TABLE tt AS SELECT 1 AS x",
        f"CREATE SEQUENCE s{n}",
        f"CREATE FUNCTION f{n}() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "PREPARE p AS SELECT 1",
        "SELECT pg_advisory_lock(42)",
        "SET search_path = pg_catalog",
        "SET work_mem = '64kB'",
        "DECLARE held CURSOR WITH HOLD FOR SELECT 1",
        "SELECT nosuch FROM customers",
        "SELEC 1",
        "COMMIT",
        "ROLLBACK",
        "BEGIN",
        "END",
        "PREPARE TRANSACTION 'x'",
        "DO $$BEGIN EXECUTE 'COM' || 'MIT'; END$$",
        "DO $$BEGIN EXECUTE 'DROP TABLE orders CASCADE'; END$$",
        "SELECT set_config('search_path', 'pg_catalog', false)",
        "SELECT 1; COMMIT",
    ])


@pytest.mark.slow
def test_a_thousand_random_ddl_dml_sessions_leave_the_base_unchanged(db):
    before = checksum(db.admin)
    rng = random.Random(11)
    pool = SessionPool(PoolConfig(max_size=2, limits=Limits(timeout_s=2)))
    errors = 0
    try:
        for i in range(1000):
            with pool.session(db.url) as s:
                # whatever the previous session on this connection did is gone
                assert ok(s.execute("SELECT count(*) FROM orders")).rows == ((60,),), i
                for _ in range(rng.randint(1, 4)):
                    sql = "; ".join(_random_statement(rng) for _ in range(rng.randint(1, 3)))
                    r = s.execute(sql)
                    errors += r.error is not None
                    assert r.error is None or r.error.kind is not ErrorKind.SESSION_LOST, (sql, r.error)
        stats = pool.stats()
        assert stats.connects == stats.discards == 1000  # a fresh clone each, never reused
    finally:
        pool.close()
    assert 300 < errors < 3500  # the mix really exercised both paths
    assert checksum(db.admin) == before
    assert SCRATCH.settle()
    assert _session_advisory_locks(db) == [(0,)]
    assert admin_query(db.admin, "SELECT count(*) FROM pg_prepared_xacts") == [(0,)]
    assert _scratch_databases(db) <= SCRATCH.held_names()  # only this process's ready clones


def _session_advisory_locks(db):
    """Advisory locks other than sqlrl's own liveness locks (class 0x7371, two-key form)."""
    return admin_query(db.admin, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                       "AND NOT (classid = 29553 AND objsubid = 2)")


def _scratch_databases(db):
    """Scratch databases and roles that appeared since the test began (waits for drops first)."""
    assert SCRATCH.settle()
    return scratch_names(db.server) - db.baseline


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
    assert _session_advisory_locks(db) == [(0,)]
    assert admin_query(db.admin, "SELECT count(*) FROM pg_roles WHERE rolname = %s",
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

def test_hostile_statements_are_errors_and_touch_nothing(db, tmp_path):
    target = f"/tmp/sqlrl_pwn_{os.getpid()}"
    before = checksum(db.admin)
    with open_session(db.url, limits=Limits(timeout_s=2)) as s, open_session(db.url) as victim:
        victim_pid = victim.execute("SELECT pg_backend_pid()").rows[0][0]
        ok(s.execute("DELETE FROM orders WHERE id > 10"))
        hostile = [
            "SELECT pg_read_file('/etc/passwd')",
            "SELECT pg_read_binary_file('/etc/passwd')",
            "SELECT * FROM pg_ls_dir('/')",
            f"COPY (SELECT 1) TO PROGRAM 'touch {target}'",
            f"COPY customers TO '{target}'",
            "COPY customers FROM '/etc/passwd'",
            f"SELECT lo_export(lo_from_bytea(0, 'x'), '{target}')",
            "SELECT lo_import('/etc/passwd')",
            "SET ROLE postgres",
            "SET SESSION AUTHORIZATION postgres",
            "RESET ROLE",
            "ALTER SYSTEM SET work_mem = '1MB'",
            "CREATE EXTENSION dblink",
            "CREATE EXTENSION pgcrypto",
            "LOAD 'auto_explain'",
            f"SELECT pg_terminate_backend({victim_pid})",
            f"SELECT pg_cancel_backend({victim_pid})",
            "SELECT pg_reload_conf()",
            "COMMIT", "BEGIN", "ROLLBACK", "END", "SAVEPOINT x", "RELEASE SAVEPOINT sqlrl_sp",
            "ROLLBACK TO SAVEPOINT sqlrl_sp", "START TRANSACTION", "PREPARE TRANSACTION 'x'",
            "COMMIT PREPARED 'x'", "ABORT",
            "SET statement_timeout = 0", "SET LOCAL lock_timeout = 0",
            "SELECT set_config('statement_timeout', '0', false)",
            "SET standard_conforming_strings = off",
            "LISTEN ch", "NOTIFY ch", "CREATE ROLE evil SUPERUSER", "ALTER ROLE CURRENT_USER SUPERUSER",
            "CREATE DATABASE evil", "DROP DATABASE postgres", "DISCARD ALL", "CLOSE ALL",
            "VACUUM customers", "CHECKPOINT", "FETCH ALL FROM sqlrl_c",
            "SELECT 1; COMMIT",
        ]
        for sql in hostile:
            r = s.execute(sql)
            assert r.error is not None, sql
            assert r.error.kind is ErrorKind.PERMISSION, (sql, r.error)
        # the same things through dynamic SQL meet the role's privileges instead of text rules
        dynamic = [
            "SELECT pg_' || 'read_file(''/etc/passwd'')",
            f"COPY (SELECT 1) TO PROGRAM ''touch {target}''",
            f"COPY customers TO ''{target}''",
            f"SELECT lo_' || 'export(lo_from_bytea(0, ''x''), ''{target}'')",
            "SET ROLE postgres",
            f"SELECT pg_' || 'terminate_backend({victim_pid})",
            "SELECT set_' || 'config(''statement_timeout'', ''0'', false)",
            "CREATE EXTENSION pgcrypto",
        ]
        for body in dynamic:
            r = s.execute(f"DO $$BEGIN EXECUTE '{body}'; END$$")
            assert r.error is not None and r.error.kind is ErrorKind.PERMISSION, (body, r.error)
        r = s.execute("DO $$BEGIN EXECUTE 'COM' || 'MIT'; END$$")  # cannot end the transaction
        assert r.error.kind is ErrorKind.RUNTIME and "transaction" in r.error.message
        assert ok(s.execute("SELECT count(*) FROM orders")).rows == ((10,),)
        assert ok(victim.execute("SELECT count(*) FROM orders")).rows == ((60,),)
    assert not os.path.exists(target)
    assert checksum(db.admin) == before


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


def test_the_agents_sql_never_runs_as_the_admin(db):
    with open_session(db.url) as s:  # db.url holds the admin's credentials
        (role, superuser), = s.execute("SELECT current_user, current_setting('is_superuser')").rows
        assert role.startswith("sqlrl_s_") and superuser == "off"
    with pytest.raises(SessionError, match="allow_superuser is not supported"):
        open_session(db.admin + "?allow_superuser=1")


def test_unreachable_server_fails_fast():
    t0 = time.monotonic()
    with pytest.raises(SessionError, match="cannot connect"):
        open_session("postgresql://sqlrl_agent:x@127.0.0.1:1/nowhere")
    assert time.monotonic() - t0 < 3


def test_failing_preprocess_sql_raises_and_leaves_nothing(db):
    before = checksum(db.admin)
    with pytest.raises(SessionError, match="preprocess_sql failed"):
        open_session(db.url, preprocess_sql=["DELETE FROM orders", "CREATE TABLE x(a int)",
                                             "SELECT nosuch FROM customers"])
    assert checksum(db.admin) == before
    assert SCRATCH.settle()  # its clone was dropped: only ready clones of this process remain
    assert _scratch_databases(db) <= SCRATCH.held_names()
    with open_session(db.url, preprocess_sql=["CREATE TEMP TABLE pre AS SELECT 5 AS x"]) as s:
        assert s.execute("SELECT x FROM pre").rows == ((5,),)


def test_killed_backend_gives_session_lost_then_and_later(db):
    s = open_session(db.url)
    ok(s.execute("CREATE TEMP TABLE t AS SELECT 1 AS x"))
    pid = s.execute("SELECT pg_backend_pid()").rows[0][0]
    assert admin_query(db.admin, "SELECT pg_terminate_backend(%s)", (pid,)) == [(True,)]
    deadline = time.monotonic() + 30  # the backend exits asynchronously: wait until it is gone
    while admin_query(db.admin, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)):
        assert time.monotonic() < deadline, "the terminated backend is still there"
        time.sleep(0.02)
    assert s.execute("SELECT 1").error.kind is ErrorKind.SESSION_LOST
    assert s.execute("SELECT 2").error.kind is ErrorKind.SESSION_LOST
    assert s.lost
    s.close()
    s.close()
    assert s.execute("SELECT 1").error.kind is ErrorKind.SESSION_LOST


def test_ping_and_close(db):
    adapter = pg_adapter.PostgreSQLDialect()
    conn = adapter.connect(parse_url(db.url), Limits())
    assert adapter.ping(conn)
    adapter.close(conn)
    assert SCRATCH.settle()  # closed (and its clone dropped) in the background
    assert not adapter.ping(conn)


def test_sessions_from_many_threads(db):
    failures = []

    def worker(k):
        try:
            with open_session(db.url) as s:
                ok(s.execute(f"INSERT INTO customers VALUES ({500 + k}, 'w', NULL)"))
                assert s.execute("SELECT count(*) FROM customers").rows == ((21,),)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
