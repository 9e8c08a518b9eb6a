"""Sessions sealed, second round (issue 46): seven ways a hostile session got out of its box on
PostgreSQL 15 and MariaDB 10.11, each contained by what the server enforces. Every test runs with
the text filter on and again with it switched off (``executor.set_text_filter``), so the filter's
friendly refusals cannot be what passes them.

1. PostgreSQL: no session can SET ROLE to the shared owner role (it is a member of no role; its
   clone's tables are its own) and so cannot change that role.
2. PostgreSQL: a grant to another session's role does not keep that role alive after its session.
3. PostgreSQL: no session can take advisory locks (the shared lock table is everyone's).
4. PostgreSQL: one wide value does not break the client's memory bound.
5. Both: text that is not valid Unicode is an error, and the session goes on.
6. MariaDB: a large write stopped by the deadline returns within the deadline's guarantee.
7. MariaDB: InnoDB temporary tables cannot grow the server's temp space without bound, no
   temporary table escapes InnoDB, and no session lifts the cap on one statement's internal
   temporary tables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sqlrl.db import ErrorKind, Limits, open_session
from sqlrl.db.provisioning import provision
from sqlrl.db.provisioning.scratch import SCRATCH
from sqlrl.db.types import SessionError
from tests.conftest import sealed_base
from tests.dialects.server_cases import ok

PID = os.getpid()
REFUSED = (ErrorKind.PERMISSION, ErrorKind.RUNTIME)


def refused(result, kinds=REFUSED):
    assert result.error is not None and result.error.kind in kinds, result
    return result


def on_time_or_says_so(elapsed_s, message, timeout_s, context):
    """A call ends within its deadline's guarantee (``timeout_s + 1 s``), or -- when the server
    could not stop it sooner (an undo, one uninterruptible function, a machine at load 36) -- its
    timeout error says how long after the deadline it ended."""
    if elapsed_s >= timeout_s + 1.0:
        assert message and "after the deadline" in message, context


# --- PostgreSQL -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pg_base(pg_admin_url):
    from tests.dialects.server_cases import PG_BASE_SQL as BASE_SQL
    provision.prepare_server(pg_admin_url)
    for admin_db, url in sealed_base(pg_admin_url, f"sqlrl_seal2_{PID}", BASE_SQL):
        yield f"sqlrl_seal2_{PID}", admin_db, url


def pg_query(url, sql, args=None):
    from tests.dialects.server_cases import pg_admin_query as admin_query
    return admin_query(url, sql, args)


@pytest.mark.postgres
def test_1_pg_the_owner_role_cannot_be_taken_over(pg_admin_url, pg_base, text_filter):
    name, _, url = pg_base
    with open_session(url) as s:
        for sql in ("SET ROLE sqlrl_owner",
                    "DO $$ BEGIN EXECUTE 'SET ROLE sqlrl_owner'; END $$",
                    "DO $$ BEGIN EXECUTE 'SET ROLE sqlrl_owner'; "
                    "EXECUTE 'ALTER ROLE sqlrl_owner SET work_mem = ''64kB'''; END $$",
                    "ALTER ROLE sqlrl_owner SET work_mem = '64kB'",
                    "ALTER ROLE sqlrl_owner PASSWORD 'x'",
                    f'ALTER ROLE sqlrl_owner IN DATABASE "{name}" SET default_transaction_read_only = on',
                    "GRANT sqlrl_owner TO CURRENT_USER"):
            refused(s.execute(sql))
        assert ok(s.execute("SELECT current_user = session_user, pg_has_role('sqlrl_owner', 'MEMBER'), "
                            "(SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member "
                            "WHERE r.rolname = current_user)")).rows == ((True, False, 0),)
        # the clone's tables, sequences and schema are the session's own
        ok(s.execute("ALTER TABLE orders ADD COLUMN note text"))
        ok(s.execute("SELECT nextval('orders_id_seq')"))
        ok(s.execute("DROP TABLE products CASCADE"))
        ok(s.execute("CREATE TABLE mine (x int); INSERT INTO mine VALUES (1)"))
    assert SCRATCH.settle()
    assert pg_query(pg_admin_url, "SELECT rolcanlogin, rolpassword IS NULL FROM pg_authid "
                    "WHERE rolname = 'sqlrl_owner'") == [(False, True)]
    assert pg_query(pg_admin_url, "SELECT count(*) FROM pg_db_role_setting WHERE setrole = "
                    "(SELECT oid FROM pg_roles WHERE rolname = 'sqlrl_owner')") == [(0,)]
    with open_session(url) as later:
        assert ok(later.execute("SELECT count(*) FROM products")).rows == ((10,),)


@pytest.mark.postgres
def test_1_pg_prepare_server_takes_older_session_roles_out_of_the_owner_role(pg_admin_url, pg_base):
    import psycopg2
    legacy = f"sqlrl_s_legacy{PID}"  # as an older sqlrl made them: a member of the owner role
    conn = psycopg2.connect(pg_admin_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE ROLE "{legacy}" LOGIN IN ROLE sqlrl_owner')
            cur.execute("ALTER ROLE sqlrl_owner SET work_mem = '64kB'")
        provision.prepare_server(pg_admin_url)
        assert pg_query(pg_admin_url, "SELECT count(*) FROM pg_auth_members WHERE roleid = "
                        "'sqlrl_owner'::regrole AND member = %s::regrole", (legacy,)) == [(0,)]
        assert pg_query(pg_admin_url, "SELECT count(*) FROM pg_db_role_setting WHERE setrole = "
                        "'sqlrl_owner'::regrole") == [(0,)]
    finally:
        with conn.cursor() as cur:
            cur.execute(f'DROP ROLE IF EXISTS "{legacy}"')
        conn.close()


@pytest.mark.postgres
def test_2_pg_a_grant_does_not_keep_another_sessions_role(pg_admin_url, pg_base, text_filter):
    _, _, url = pg_base
    with open_session(url) as attacker:
        (attacker_role, attacker_db), = ok(attacker.execute("SELECT current_user, current_database()")).rows
        with open_session(url) as victim:
            (role,), = ok(victim.execute("SELECT current_user")).rows
            for sql in (f'GRANT SELECT ON customers TO "{role}"',
                        f'GRANT UPDATE (name) ON customers TO "{role}" WITH GRANT OPTION',
                        f'ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO "{role}"',
                        f'CREATE POLICY p ON orders TO "{role}" USING (true)',
                        "DO $$ DECLARE r text; BEGIN FOR r IN SELECT rolname FROM pg_roles "
                        "WHERE rolname LIKE 'sqlrl\\_s\\_%' AND rolname <> current_user LOOP "
                        "EXECUTE format('GRANT SELECT ON products TO %I', r); END LOOP; END $$"):
                ok(attacker.execute(sql))
        assert SCRATCH.settle()
        assert pg_query(pg_admin_url, "SELECT count(*) FROM pg_roles WHERE rolname = %s",
                        (role,)) == [(0,)]  # dropped while the attacker's clone still exists
        assert ok(attacker.execute("SELECT count(*) FROM customers")).rows == ((20,),)
    assert SCRATCH.settle()
    # both sessions' clones were dropped, role and database (checked on the server: the scratch
    # manager's drop_errors counter is process-wide, and background drops of earlier tests'
    # clones may still be finishing while this test runs)
    assert pg_query(pg_admin_url, "SELECT (SELECT count(*) FROM pg_roles WHERE rolname IN (%s, %s)), "
                    "(SELECT count(*) FROM pg_database WHERE datname = %s)",
                    (attacker_role, role, attacker_db)) == [(0, 0)]


@pytest.mark.postgres
def test_3_pg_no_session_can_fill_the_shared_lock_table(pg_admin_url, pg_base, text_filter):
    _, _, url = pg_base
    with open_session(url, limits=Limits(timeout_s=5)) as s:
        (pid,), = ok(s.execute("SELECT pg_backend_pid()")).rows
        refused(s.execute("SELECT count(*) FROM (SELECT pg_advisory_lock(g) "
                          "FROM generate_series(1, 2000000) g) t"), (ErrorKind.PERMISSION,))
        for call in ("pg_try_advisory_lock(1)", "pg_advisory_lock_shared(1, 2)",
                     "pg_advisory_xact_lock(3)", "pg_try_advisory_xact_lock_shared(4)",
                     "pg_advisory_unlock_all()"):
            refused(s.execute(f"SELECT {call}"), (ErrorKind.PERMISSION,))
        assert pg_query(pg_admin_url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND pid = %s", (pid,)) == [(0,)]
        with open_session(url) as other:  # new clones and plain queries still work
            assert ok(other.execute("SELECT count(*) FROM orders")).rows == ((60,),)
    (locks,), = pg_query(pg_admin_url, "SELECT current_setting('max_locks_per_transaction')::int")
    assert locks >= 256


_MEMORY_PROBE = textwrap.dedent("""
    import json, resource, sys, time
    from sqlrl.db import Limits, open_session
    from sqlrl.db.sessions.executor import set_text_filter
    url, filter_on, sqls = sys.argv[1], sys.argv[2] == "filter-on", sys.argv[3:]
    set_text_filter(filter_on)
    out = []
    with open_session(url, limits=Limits(timeout_s=2.0, max_bytes=4 * 1024 * 1024)) as s:
        s.execute("SELECT 1")
        for sql in sqls:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            t0 = time.monotonic()
            r = s.execute(sql)
            elapsed = time.monotonic() - t0
            after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            out.append({"growth_kib": after - before, "elapsed": elapsed, "rows": r.row_count,
                        "truncated": r.truncated, "kind": r.error.kind.value if r.error else None,
                        "error": r.error.message[:300] if r.error else None})
        out.append({"after": s.execute("SELECT count(*) FROM orders").rows[0][0]})
    print(json.dumps(out))
""")


@pytest.mark.postgres
def test_4_pg_one_wide_value_stays_within_the_client_memory_bound(pg_base, text_filter):
    _, _, url = pg_base
    wide = ["SELECT string_agg(repeat('x', 1000), '') FROM generate_series(1, 150000)",
            "SELECT repeat('x', 300000000)",
            "SELECT 1 AS id, repeat('y', 5000000) AS pad, 2 AS other"]
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, url, text_filter, *wide],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    *probes, after = json.loads(out.stdout.strip().splitlines()[-1])
    for sql, probe in zip(wide, probes):
        # a row wider than max_bytes never reaches the client: an error (or the deadline, on a
        # busy server), or an empty capped result
        assert probe["kind"] in ("runtime", "timeout") or (probe["truncated"] and probe["rows"] == 0), \
            (sql, probe)
        assert probe["growth_kib"] < 64 * 1024, (sql, probe)
        on_time_or_says_so(probe["elapsed"], probe["error"], 2.0, (sql, probe))
    assert probes[-1]["kind"] == "runtime" and "more than the byte limit on one row" in probes[-1]["error"]
    assert after == {"after": 60}  # the session goes on


# --- both engines ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def my_base(mysql_admin_url):
    from tests.dialects.server_cases import MYSQL_BASE_SQL as BASE_SQL
    provision.prepare_server(mysql_admin_url)
    for _, url in sealed_base(mysql_admin_url, f"sqlrl_seal2_{PID}", BASE_SQL):
        yield url


@pytest.fixture(params=[pytest.param("postgresql", marks=pytest.mark.postgres),
                        pytest.param("mysql", marks=pytest.mark.mysql)])
def any_base(request):
    if request.param == "postgresql":
        return request.getfixturevalue("pg_base")[2]
    return request.getfixturevalue("my_base")


def test_5_text_that_is_not_unicode_is_an_error_and_the_session_goes_on(any_base, text_filter):
    with open_session(any_base) as s:
        for sql in ("SELECT '\ud800'", "SELECT 1; SELECT '\udfff' AS x", "SELECT 1 -- \ud800"):
            r = s.execute(sql)
            assert r.error is not None and r.error.kind in (ErrorKind.SYNTAX, ErrorKind.RUNTIME), r
        assert not s.lost
        assert ok(s.execute("SELECT count(*) FROM orders")).rows == ((60,),)


# --- MariaDB --------------------------------------------------------------------------------------

def my_query(url, sql):
    from tests.dialects.server_cases import mysql_admin_query as admin_query
    return admin_query(url, sql)


@pytest.mark.mysql
def test_6_mariadb_a_large_write_returns_within_the_deadline(my_base, text_filter):
    timeout = 2.0
    with open_session(my_base, limits=Limits(timeout_s=timeout)) as s:
        ok(s.execute("CREATE TABLE big (id INT PRIMARY KEY, pad VARCHAR(1000)) ENGINE=InnoDB"))
        rows = 0
        while rows < 320_000:  # built in calls that each fit the limit
            r = s.execute(f"INSERT INTO big SELECT seq, REPEAT('x', 1000) FROM "
                          f"seq_{rows + 1}_to_{rows + 10_000}")
            if r.error is None:
                rows += 10_000
            else:
                assert r.error.kind is ErrorKind.TIMEOUT, r
        for sql in ("UPDATE big SET pad = REPEAT('y', 1000)", "DELETE FROM big",
                    "UPDATE big SET pad = REPEAT('z', 1000) ORDER BY id DESC"):
            r = s.execute(sql)
            assert r.error is None or r.error.kind is ErrorKind.TIMEOUT, (sql, r)
            on_time_or_says_so(r.elapsed_ms / 1000, r.error and r.error.message, timeout, (sql, r))
        assert ok(s.execute("SELECT count(*) FROM customers")).rows == ((20,),)


@pytest.mark.mysql
def test_7_mariadb_temp_tables_cannot_grow_temp_space_without_bound(mysql_admin_url, my_base,
                                                                      text_filter):
    from sqlrl.db.dialects.mysql_admin import temp_space_bound
    ((path,),) = my_query(mysql_admin_url, "SELECT @@innodb_temp_data_file_path")
    bound = temp_space_bound(path)
    assert bound is not None, f"innodb_temp_data_file_path = {path!r} has no max"
    with open_session(my_base, limits=Limits(timeout_s=60)) as s:
        errors = 0
        for i in range(4):
            r = s.execute(f"CREATE TEMPORARY TABLE t{i} ENGINE=InnoDB AS "
                          f"SELECT seq, REPEAT('x', 1000) AS pad FROM seq_1_to_100000")
            if r.error is not None:
                assert r.error.kind is ErrorKind.RUNTIME and "full" in r.error.message, r
                errors += 1
        assert errors or bound > 400 * 2**20  # 4 x ~100 MB cannot fit a smaller bound
        ((size,),) = my_query(mysql_admin_url, "SELECT FILE_SIZE FROM information_schema."
                              "INNODB_SYS_TABLESPACES WHERE SPACE = 4294967294")
        assert size <= bound
        assert ok(s.execute("SELECT count(*) FROM customers")).rows == ((20,),)


@pytest.mark.mysql
def test_7_mariadb_no_temp_table_escapes_the_bounds_and_no_session_lifts_them(my_base, text_filter):
    """Every temporary table of a session is InnoDB (the bounded ibtmp1 above): another engine
    is refused or replaced (``enforce_storage_engine``, which a session cannot change without
    SUPER); and the cap on one statement's internal temporary table (``tmp_disk_table_size``)
    cannot be raised past the server's ``--maximum-`` or reset to an unbounded default."""
    with open_session(my_base, limits=Limits(timeout_s=30)) as s:
        for i, engine in enumerate(("Aria", "MyISAM", "MEMORY", "CSV")):
            r = s.execute(f"CREATE TEMPORARY TABLE e{i} ENGINE={engine} AS SELECT 1 AS x")
            if r.error is None:  # substituted: it must have become InnoDB
                shown = ok(s.execute(f"SHOW CREATE TABLE e{i}")).rows[0][1]
                assert "ENGINE=InnoDB" in shown, (engine, shown)
            else:
                assert r.error.kind in REFUSED, (engine, r)
        refused(s.execute("SET SESSION enforce_storage_engine = NULL"))
        refused(s.execute("SET @@session.enforce_storage_engine = 'Aria'"))
        s.execute(f"SET SESSION tmp_disk_table_size = {2**64 - 1}")  # cut to the maximum, or refused
        ((cap,),) = ok(s.execute("SELECT @@session.tmp_disk_table_size")).rows
        assert int(cap) <= 2**30, cap
        s.execute("SET SESSION tmp_disk_table_size = DEFAULT")  # the global: bounded too
        ((cap,),) = ok(s.execute("SELECT @@session.tmp_disk_table_size")).rows
        assert int(cap) <= 2**30, cap
        # the cap stops a statement whose internal temporary table outgrows it (the session may
        # lower its own cap; here it does, so the statement stays small)
        if s.execute("SET SESSION tmp_disk_table_size = 1048576").error is None:
            r = s.execute("SELECT count(*) FROM (SELECT seq, REPEAT('x', 100) AS p FROM "
                          "seq_1_to_200000 GROUP BY seq, p) q")
            assert r.error is not None and r.error.kind is ErrorKind.RUNTIME and "full" in r.error.message, r
        assert ok(s.execute("SELECT count(*) FROM customers")).rows == ((20,),)


@pytest.mark.mysql
def test_7_mariadb_a_base_table_of_another_engine_is_cloned_as_innodb(mysql_admin_url):
    """A user's base may hold a MyISAM table (made before the server enforced InnoDB): its clone
    is InnoDB with the same rows, not a failed clone."""
    statements = ["SET SESSION enforce_storage_engine = NULL",  # the admin's SUPER; no session has it
                  "CREATE TABLE legacy (id INT PRIMARY KEY, v VARCHAR(10)) ENGINE=MyISAM",
                  "INSERT INTO legacy VALUES (1, 'a'), (2, 'b')"]
    for _, url in sealed_base(mysql_admin_url, f"sqlrl_myisam_{PID}", statements):
        with open_session(url) as s:
            assert ok(s.execute("SELECT count(*) FROM legacy")).rows == ((2,),)
            shown = ok(s.execute("SHOW CREATE TABLE legacy")).rows[0][1]
            assert "ENGINE=InnoDB" in shown, shown


# --- the servers' settings are checked ------------------------------------------------------------

class _FakeCursor:
    def __init__(self, answers):
        self.answers, self.row = answers, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, sql, args=None):
        self.row = next((a for key, a in self.answers.items() if key in sql), None)

    def fetchone(self):
        return self.row

    def fetchall(self):
        return [self.row] if self.row else []


class _FakeConnection:
    def __init__(self, answers):
        self.answers = answers

    def cursor(self):
        return _FakeCursor(self.answers)

    def close(self):
        pass


def test_prepare_server_refuses_a_postgresql_server_with_a_small_lock_table(monkeypatch):
    from sqlrl.db.dialects.postgresql_admin import PostgresAdmin
    fake = _FakeConnection({"max_locks_per_transaction": (True, False, False, 64)})
    monkeypatch.setattr(PostgresAdmin, "connect", lambda self, url, database=None: fake)
    with pytest.raises(SessionError, match="max_locks_per_transaction = 64.*at least 256"):
        PostgresAdmin().prepare_server(None)


def test_prepare_server_refuses_a_mariadb_server_with_unbounded_temp_space(monkeypatch):
    from sqlrl.db.dialects.mysql_admin import MySQLAdmin, temp_space_bound
    assert temp_space_bound("ibtmp1:12M:autoextend") is None
    assert temp_space_bound("ibtmp1:12M:autoextend:max:256M") == 256 * 2**20
    assert temp_space_bound("ibtmp1:12M") == 12 * 2**20  # no autoextend: fixed size
    assert temp_space_bound("ibtmp1:50M;ibtmp2:12M:autoextend:max:1G") == 50 * 2**20 + 2**30
    fake = _FakeConnection({"@@version": ("10.11.19-MariaDB", "NO", "ibtmp1:12M:autoextend")})
    monkeypatch.setattr(MySQLAdmin, "connect", lambda self, url, database=None: fake)
    with pytest.raises(SessionError, match="innodb_temp_data_file_path"):
        MySQLAdmin().prepare_server(None)


@pytest.mark.parametrize("answers,message", [
    ({"enforce_storage_engine": (None,)}, "--enforce-storage-engine=InnoDB"),
    ({"enforce_storage_engine": ("InnoDB",), "@@session.tmp_disk_table_size": (2**64 - 1,)},
     "--maximum-tmp-disk-table-size"),
])
def test_prepare_server_refuses_a_mariadb_server_whose_temp_tables_a_session_can_unbound(
        monkeypatch, answers, message):
    from sqlrl.db.dialects.mysql_admin import MySQLAdmin
    fake = _FakeConnection({"@@version": ("10.11.19-MariaDB", "NO", "ibtmp1:12M:autoextend:max:256M"),
                            **answers})
    monkeypatch.setattr(MySQLAdmin, "connect", lambda self, url, database=None: fake)
    with pytest.raises(SessionError, match=message):
        MySQLAdmin().prepare_server(None)
