"""The servers alone contain a session: hostile SQL with the text filter switched OFF.

``executor.set_text_filter(False)`` (test-only) sends every statement to the server unread. What
must still hold, on PostgreSQL and MariaDB, is what the servers enforce (docs/sessions.md):
- the base database is checksum-identical afterwards (and its sequences untouched);
- another live session is unreachable: its query text is hidden, it cannot be killed, its
  tables cannot be read;
- the agent cannot lift its own time limit (the watchdog stops the call: a timeout);
- no file appears outside the data directories; no database or role is left behind;
- the accounts stay usable: later sessions open and work.
"""

from __future__ import annotations

import os

import pytest

from sqlrl.db import ErrorKind, Limits, open_session
from sqlrl.db.provisioning import provision
from sqlrl.db.sessions.executor import set_text_filter
from sqlrl.db.provisioning.scratch import SCRATCH
from tests.conftest import sealed_base

PID = os.getpid()
TARGET = f"/tmp/sqlrl_filter_off_{PID}"  # no file or directory may appear here


@pytest.fixture
def filter_off():
    previous = set_text_filter(False)
    yield
    set_text_filter(previous)


def _run_all(session, statements):
    """Run every statement; return {sql: QueryResult} (the session must survive them all)."""
    results = {}
    for sql in statements:
        results[sql] = session.execute(sql)
        assert results[sql].error is None or results[sql].error.kind is not ErrorKind.SESSION_LOST, \
            (sql, results[sql].error)
    return results


def _refused(result):
    return result.error is not None and result.error.kind in (ErrorKind.PERMISSION, ErrorKind.RUNTIME)


# --- PostgreSQL ----------------------------------------------------------------------------------

@pytest.fixture
def pg_base(pg_admin_url):
    from tests.dialects.server_cases import PG_BASE_SQL as BASE_SQL
    yield from sealed_base(pg_admin_url, f"sqlrl_off_{PID}", BASE_SQL)


@pytest.mark.postgres
def test_postgresql_contains_a_session_with_the_filter_off(pg_admin_url, pg_base, filter_off):
    from tests.dialects.server_cases import pg_admin_query as admin_query, pg_checksum as checksum
    admin_db, url = pg_base
    before = checksum(admin_db)
    seq_before = admin_query(admin_db, "SELECT last_value FROM orders_id_seq")
    with open_session(url, limits=Limits(timeout_s=1.5)) as attacker, open_session(url) as victim:
        victim_pid, victim_role, victim_db = victim.execute(
            "SELECT pg_backend_pid(), current_user, current_database()").rows[0]
        assert victim.execute("SELECT 'gold-secret-42' AS gold").error is None
        r = _run_all(attacker, [
            "DELETE FROM orders", "DROP TABLE products CASCADE", "COMMIT", "BEGIN", "ROLLBACK",
            "SELECT setval('orders_id_seq', 1000)",
            f"SELECT pg_terminate_backend({victim_pid})", f"SELECT pg_cancel_backend({victim_pid})",
            "SELECT query FROM pg_stat_activity WHERE query LIKE '%gold-secret%' "
            "AND pid <> pg_backend_pid()",
            f'SELECT count(*) FROM "{victim_db}".public.customers',
            f"ALTER ROLE {victim_role} PASSWORD 'x'", f"ALTER ROLE {victim_role} NOLOGIN",
            "ALTER ROLE CURRENT_USER SET statement_timeout = 0",
            "ALTER ROLE CURRENT_USER PASSWORD 'changed'",
            "CREATE DATABASE sqlrl_off_evil", "CREATE ROLE sqlrl_off_evil", "ALTER SYSTEM SET work_mem = '1MB'",
            f"COPY (SELECT 1) TO '{TARGET}'", f"COPY (SELECT 1) TO PROGRAM 'touch {TARGET}'",
            "SELECT pg_read_file('/etc/passwd')", f"SELECT lo_export(lo_from_bytea(0, 'x'), '{TARGET}')",
            "CREATE EXTENSION dblink", "CREATE EXTENSION pgcrypto", "LOAD 'auto_explain'",
            f"GRANT ALL ON DATABASE {provision.parse_url(url).database} TO CURRENT_USER",
            "SET ROLE sqlrl_owner", "CREATE TABLE owned_by_owner (x int)", "RESET ROLE",
            "SET ROLE postgres", "SET SESSION AUTHORIZATION postgres",
            "SELECT set_config('statement_timeout', '0', false)",
        ])
        for sql in (f"SELECT pg_terminate_backend({victim_pid})", f"SELECT pg_cancel_backend({victim_pid})",
                    f'SELECT count(*) FROM "{victim_db}".public.customers',
                    f"ALTER ROLE {victim_role} PASSWORD 'x'", f"ALTER ROLE {victim_role} NOLOGIN",
                    "CREATE DATABASE sqlrl_off_evil", "CREATE ROLE sqlrl_off_evil",
                    f"COPY (SELECT 1) TO '{TARGET}'", f"COPY (SELECT 1) TO PROGRAM 'touch {TARGET}'",
                    "SELECT pg_read_file('/etc/passwd')", "CREATE EXTENSION dblink",
                    "CREATE EXTENSION pgcrypto", "SET ROLE postgres", "ALTER SYSTEM SET work_mem = '1MB'"):
            assert _refused(r[sql]), (sql, r[sql])
        seen = r["SELECT query FROM pg_stat_activity WHERE query LIKE '%gold-secret%' "
                 "AND pid <> pg_backend_pid()"].rows
        assert seen == ()  # the victim's query text is hidden from another role
        t0 = attacker.execute("SET statement_timeout = 0; SET lock_timeout = 0; SELECT pg_sleep(60)")
        assert t0.error is not None and t0.error.kind is ErrorKind.TIMEOUT  # the watchdog's cancel
        assert attacker.execute("SELECT count(*) FROM orders").rows == ((0,),)  # its own clone
        # the victim was neither killed nor touched
        assert victim.execute("SELECT count(*) FROM orders").rows == ((60,),)
        assert victim.execute("SELECT count(*) FROM products").rows == ((10,),)
    assert SCRATCH.settle()
    assert checksum(admin_db) == before
    assert admin_query(admin_db, "SELECT last_value FROM orders_id_seq") == seq_before
    assert not os.path.exists(TARGET)
    assert admin_query(pg_admin_url, "SELECT count(*) FROM pg_database WHERE datname = 'sqlrl_off_evil' "
                       "OR datname = ANY(%s)", ([victim_db],)) == [(0,)]
    assert admin_query(pg_admin_url, "SELECT count(*) FROM pg_roles WHERE rolname = 'sqlrl_off_evil' "
                       "OR rolname = %s", (victim_role,)) == [(0,)]
    with open_session(url) as later:  # accounts and settings are usable: nothing outlived them
        assert later.execute("SELECT current_setting('statement_timeout'), count(*) FROM orders").rows \
            == (("5s", 60),)


# --- MariaDB --------------------------------------------------------------------------------------

@pytest.fixture
def my_base(mysql_admin_url):
    from tests.dialects.server_cases import MYSQL_BASE_SQL as BASE_SQL
    name = f"sqlrl_off_{PID}"
    for _, url in sealed_base(mysql_admin_url, name, BASE_SQL):
        yield name, url


@pytest.mark.mysql
def test_mariadb_contains_a_session_with_the_filter_off(mysql_admin_url, my_base, filter_off):
    from tests.dialects.server_cases import mysql_admin_query as admin_query, mysql_checksum as checksum
    name, url = my_base
    before = checksum(mysql_admin_url, name)
    with open_session(url, limits=Limits(timeout_s=1.5)) as attacker, open_session(url) as victim:
        victim_id, victim_db = victim.execute("SELECT CONNECTION_ID(), DATABASE()").rows[0]
        victim_user = victim_db  # the session's account is named after its database
        assert victim.execute("SELECT 'gold-secret-77' AS gold").error is None
        r = _run_all(attacker, [
            "DELETE FROM orders", "DROP TABLE products", "COMMIT", "START TRANSACTION", "ROLLBACK",
            f"KILL {victim_id}", f"KILL QUERY {victim_id}",
            "SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()",
            f"SELECT count(*) FROM `{victim_db}`.customers", f"SELECT count(*) FROM `{name}`.customers",
            f"PREPARE s FROM 'SELECT count(*) FROM `{victim_db}`.customers'", "EXECUTE s",
            f"USE `{name}`", "USE mysql", f"ALTER USER `{victim_user}`@'%' ACCOUNT LOCK",
            "SET PASSWORD = PASSWORD('changed')", "SET GLOBAL max_connections = 1",
            "CREATE DATABASE sqlrl_off_evil", "CREATE USER sqlrl_off_evil",
            "GRANT ALL ON *.* TO CURRENT_USER()", "FLUSH PRIVILEGES", "LOCK TABLES customers WRITE",
            f"SELECT 1 INTO OUTFILE '{TARGET}'", "SELECT LOAD_FILE('/etc/passwd')",
            f"CREATE TABLE dd (x INT) ENGINE=InnoDB DATA DIRECTORY='{TARGET}'",
            f"CREATE TABLE dd2 (x INT) ENGINE=MyISAM DATA DIRECTORY='{TARGET}' INDEX DIRECTORY='{TARGET}'",
            f"CREATE TABLE dd3 (x INT) ENGINE=Aria DATA DIRECTORY='{TARGET}'",
            "SET SESSION max_statement_time = 0", "SET SESSION sql_select_limit = DEFAULT",
        ])
        for sql in (f"KILL {victim_id}", f"KILL QUERY {victim_id}",
                    f"SELECT count(*) FROM `{victim_db}`.customers", f"SELECT count(*) FROM `{name}`.customers",
                    f"PREPARE s FROM 'SELECT count(*) FROM `{victim_db}`.customers'", f"USE `{name}`",
                    "USE mysql", f"ALTER USER `{victim_user}`@'%' ACCOUNT LOCK", "SET GLOBAL max_connections = 1",
                    "CREATE DATABASE sqlrl_off_evil", "CREATE USER sqlrl_off_evil",
                    "GRANT ALL ON *.* TO CURRENT_USER()", "FLUSH PRIVILEGES",
                    "LOCK TABLES customers WRITE", f"SELECT 1 INTO OUTFILE '{TARGET}'"):
            assert _refused(r[sql]), (sql, r[sql])
        assert r["SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()"
                 ].rows == ((0,),)  # no other connection (or its query text) is visible
        assert r["SELECT LOAD_FILE('/etc/passwd')"].rows == ((None,),)  # no FILE privilege
        t0 = attacker.execute("DO SLEEP(60)")  # its own max_statement_time was lifted above
        assert t0.error is not None and t0.error.kind is ErrorKind.TIMEOUT  # the watchdog's KILL QUERY
        assert attacker.execute("SELECT count(*) FROM orders").rows == ((0,),)  # its own clone
        assert victim.execute("SELECT count(*) FROM orders").rows == ((60,),)
        assert victim.execute("SELECT count(*) FROM products").rows == ((10,),)
    assert SCRATCH.settle()
    assert checksum(mysql_admin_url, name) == before
    assert not os.path.exists(TARGET)  # DATA DIRECTORY was ignored (symbolic links are off)
    assert admin_query(mysql_admin_url, "SHOW DATABASES LIKE 'sqlrl\\_off\\_evil'") == ()
    assert admin_query(mysql_admin_url, "SELECT count(*) FROM mysql.user WHERE User IN "
                       "('sqlrl_off_evil', %s)", (victim_user,)) == ((0,),)
    with open_session(url) as later:  # accounts usable, limits in force
        assert later.execute("SELECT @@max_statement_time, count(*) FROM orders").rows == ((5.0, 60),)
