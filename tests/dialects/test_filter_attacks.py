"""Smuggling statements past the keyword filter with comment and quote tricks, through
``open_session`` on the real servers: every attempt is refused (or rejected whole by the server
as a syntax error), the session stays usable, and the smuggled action did not happen — no COMMIT
reached the base, no limit was lifted, no database or role setting was created, no other session
was killed, the agent account still logs in. (The servers alone contain a session even with the
filter off: tests/dialects/test_filter_off.py.)"""

from __future__ import annotations

import os
import time

import pytest

from sqlrl.db import ErrorKind, Limits, open_session
from sqlrl.db.provisioning import provision
from sqlrl.db.url import parse_url

NAME = f"sqlrl_attack_{os.getpid()}"


def _refused(session, sql, allowed=(ErrorKind.PERMISSION,)):
    r = session.execute(sql)
    assert r.error is not None and r.error.kind in allowed, (sql, r)
    return r


# --- PostgreSQL -----------------------------------------------------------------------------------

PG_ATTACKS = [
    "-- x\rCOMMIT", "SELECT 1 -- x\r; COMMIT", "SELECT 1; -- x\rCOMMIT", "/* a /* b */ c */ COMMIT",
    "SELECT $a$ ; $a$; COMMIT", "SELECT '\\'; COMMIT; --'", "SELECT 1 AS a$b$; COMMIT --$b$",
    "-- x\rEND", "-- x\r\tABORT", "-- x\rPREPARE TRANSACTION 'x'",
    "-- x\rSET statement_timeout = 0", "SELECT 1; /* x */ SET LOCAL lock_timeout TO DEFAULT",
    "-- \rALTER ROLE CURRENT_USER SET statement_timeout = 0",
    "-- \rALTER USER CURRENT_USER SET search_path = nowhere",
    f"-- \rCREATE DATABASE {NAME}_evil", f"/* */ CREATE DATABASE {NAME}_evil",
    "SELECT pg_terminate_backend/**/(pg_backend_pid())", "-- \rSET ROLE postgres",
    "-- \rSET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE", "-- \rDISCARD ALL",
    'SET U&"statement\\005ftimeout" = 0', 'SET U&"rol\\0065" = postgres',  # decoded by the parser
    'SELECT U&"pg\\005fterminate\\005fbackend"(pg_backend_pid())',
]


@pytest.mark.postgres
def test_postgresql_filter_cannot_be_smuggled_past(pg_admin_url):
    import psycopg2

    provision.prepare_server(pg_admin_url)
    admin_db = provision.create_database(pg_admin_url, NAME, replace=True)
    conn = psycopg2.connect(admin_db)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE t AS SELECT generate_series(1, 10) AS x")
        conn.close()  # sessions clone the base: PostgreSQL needs it free of connections
        provision.seal_database(pg_admin_url, NAME)
        url = provision.session_url(pg_admin_url, NAME)
        with open_session(url, limits=Limits(timeout_s=1)) as s:
            assert s.execute("DELETE FROM t").affected_rows == 10
            for sql in PG_ATTACKS:
                _refused(s, sql)
            # the scanner rejects "1E": the server runs none of the text (a syntax error)
            _refused(s, "SELECT 1E'x'; COMMIT", (ErrorKind.SYNTAX,))
            assert s.execute("SELECT count(*) FROM t").rows == ((0,),)  # in its own clone
            r = s.execute("SELECT pg_sleep(60)")  # the limit still holds (a timeout, not 60 s)
            assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT
            (role,), = s.execute("SELECT current_user").rows
        conn = psycopg2.connect(admin_db)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM t")
            assert cur.fetchone() == (10,)  # nothing reached the base
            cur.execute("SELECT count(*) FROM pg_db_role_setting s JOIN pg_roles r "
                        "ON r.oid = s.setrole WHERE r.rolname = %s", (role,))
            assert cur.fetchone() == (0,)
            cur.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (f"{NAME}_evil",))
            assert cur.fetchone() == (0,)
    finally:
        conn.close()
        provision.drop_database(pg_admin_url, NAME)


# --- MariaDB --------------------------------------------------------------------------------------

def _my_admin(url, database=None):
    import pymysql

    u = parse_url(url)
    return pymysql.connect(host=u.host, port=u.port, user=u.username, password=u.password or "",
                           database=database, autocommit=True, ssl_disabled=True)


def _my_attacks(victim_id: int) -> list[str]:
    return [
        f"--\x01 x\nKILL {victim_id}", f"--\x1f\nKILL QUERY {victim_id}", f"#\nKILL {victim_id}",
        f"/*!KILL {victim_id}*/", f"/*M!100000 KILL {victim_id} */", f"SELECT 1; --\x05\nKILL {victim_id}",
        f"--\x00\nKILL {victim_id}",
        "--\x7f\nSET max_statement_time = 0", "/*!40101 SET max_statement_time = 0 */",
        "--\x0b\nSET STATEMENT max_statement_time = 0 FOR SELECT 1", "--\x0c\nSET @@max_statement_time = 0",
        "--\x0b\nPREPARE s FROM 'SELECT 1'", "/*!99999 x */ PREPARE s FROM 'SELECT 1'",
        "--\x1b\nEXECUTE IMMEDIATE 'SELECT 1'",
        f"--\x02\nCREATE DATABASE {NAME}_evil", f"/*!CREATE DATABASE {NAME}_evil*/",
        "--\x03\nSET PASSWORD = PASSWORD('x')", "/*M! SET PASSWORD = PASSWORD('x') */",
        "--\x04\nCOMMIT", "--\x06\nSTART TRANSACTION", "/*!BEGIN*/", "--\x07\nSHOW PROCESSLIST",
    ]


@pytest.mark.mysql
def test_mariadb_filter_cannot_be_smuggled_past(mysql_admin_url):
    provision.prepare_server(mysql_admin_url)
    provision.create_database(mysql_admin_url, NAME, replace=True)
    admin = _my_admin(mysql_admin_url, NAME)
    try:
        with admin.cursor() as cur:
            cur.execute("CREATE TABLE t (x INT)")
            cur.execute("INSERT INTO t VALUES (1), (2)")
        provision.seal_database(mysql_admin_url, NAME)
        url = provision.session_url(mysql_admin_url, NAME)
        with open_session(url, limits=Limits(timeout_s=1)) as s, open_session(url) as victim:
            victim_id = victim.execute("SELECT CONNECTION_ID()").rows[0][0]
            for sql in _my_attacks(victim_id):
                _refused(s, sql)
            # MariaDB does not end a -- comment at CR: all of this is a comment
            _refused(s, f"-- \rKILL {victim_id}", (ErrorKind.SYNTAX,))
            # a ';' inside an executable comment ends the statement there; the server then
            # rejects the unterminated comment: nothing after it runs
            _refused(s, f"SELECT 1 /*!; KILL {victim_id} */", (ErrorKind.SYNTAX, ErrorKind.PERMISSION))
            assert victim.execute("SELECT count(*) FROM t").rows == ((2,),)  # not killed
            t0 = time.monotonic()
            r = s.execute("DO SLEEP(60)")  # the limit still holds
            assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT
            assert time.monotonic() - t0 < 30  # 1 s, not 60 s, whatever the machine load
            assert s.execute("SELECT 1").rows == ((1,),)
        with open_session(url) as again:  # the password is unchanged
            assert again.execute("SELECT count(*) FROM t").rows == ((2,),)
        with admin.cursor() as cur:
            cur.execute("SHOW DATABASES LIKE %s", (f"{NAME}_evil",))
            assert cur.fetchall() == ()
    finally:
        admin.close()
        provision.drop_database(mysql_admin_url, NAME)
