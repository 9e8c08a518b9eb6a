"""SQL Server sessions against a real server: the same properties as the other engines.

Runs only when SQLRL_MSSQL_URL names a non-privileged login's database, e.g.
``mssql+pyodbc://sqlrl:Sqlrl-pw1@127.0.0.1:1433/sqlrl?driver=FreeTDS`` (docs/unverified_dialects.md
has a docker command and the grants). The login needs CREATE TABLE in that database: the module
(re)creates its base tables ``sqlrl_t_*`` there with a direct connection before the tests.
Optional: SQLRL_MSSQL_ADMIN_URL (a sysadmin login) to check that sysadmin is refused.
"""

from __future__ import annotations

import hashlib
import os
import random
import time

import pytest

from sqlrl.db import ErrorKind, Limits, PoolConfig, SessionError, SessionPool, open_session
from sqlrl.db.url import parse_url

URL = os.environ.get("SQLRL_MSSQL_URL")
pytestmark = pytest.mark.skipif(not URL, reason="no SQL Server: set SQLRL_MSSQL_URL to run; adapter unverified")

TABLES = ("sqlrl_t_customers", "sqlrl_t_orders")


def direct():
    import pyodbc

    from sqlrl.db.dialects.mssql import odbc_connection_string
    return pyodbc.connect(odbc_connection_string(parse_url(URL), pyodbc.drivers()), autocommit=True, timeout=10)


@pytest.fixture(scope="module")
def base():
    conn = direct()
    cur = conn.cursor()
    for t in reversed(TABLES):
        cur.execute(f"DROP TABLE IF EXISTS {t}")
    cur.execute("CREATE TABLE sqlrl_t_customers (customer_id int PRIMARY KEY, name nvarchar(100) NOT NULL, "
                "joined date, note nvarchar(max))")
    cur.execute("CREATE TABLE sqlrl_t_orders (order_id int PRIMARY KEY, customer_id int NOT NULL, "
                "status varchar(20) NOT NULL, total decimal(10, 2))")
    rng = random.Random(0)
    cur.executemany("INSERT INTO sqlrl_t_customers VALUES (?, ?, ?, ?)",
                    [(i, f"customer {i}", f"2020-01-{1 + i % 28:02d}", "x" * rng.randint(0, 300))
                     for i in range(1, 61)])
    cur.executemany("INSERT INTO sqlrl_t_orders VALUES (?, ?, ?, ?)",
                    [(i, 1 + i % 60, rng.choice(["new", "shipped", "delivered", "cancelled"]),
                      rng.randint(100, 99999) / 100) for i in range(1, 301)])
    rcsi = cur.execute("SELECT is_read_committed_snapshot_on FROM sys.databases "
                       "WHERE name = DB_NAME()").fetchone()[0]
    conn.close()
    return {"rcsi": bool(rcsi)}


def checksum():
    conn = direct()
    cur = conn.cursor()
    h = hashlib.sha256()
    for (name,) in cur.execute("SELECT name FROM sys.objects WHERE is_ms_shipped = 0 "
                               "ORDER BY name").fetchall():
        h.update(name.encode())
    for t in TABLES:
        for row in cur.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall():
            h.update(repr(tuple(row)).encode())
    conn.close()
    return h.hexdigest()


def count(session, table="sqlrl_t_orders"):
    return session.execute(f"SELECT COUNT(*) FROM {table}").rows[0][0]


def test_state_persists_is_private_and_gone_after_close(base):
    before = checksum()
    with open_session(URL, limits=Limits(timeout_s=2)) as a, open_session(URL, limits=Limits(timeout_s=2)) as b:
        n_orders = count(b)
        assert a.execute("CREATE TABLE #t (x int)").ok
        assert a.execute("INSERT INTO #t VALUES (1), (2)").affected_rows == 2
        assert a.execute("CREATE TABLE sqlrl_s_notes (id int, body nvarchar(20))").ok
        assert a.execute("INSERT INTO sqlrl_s_notes VALUES (1, N'hi')").ok
        assert a.execute("DELETE FROM sqlrl_t_orders WHERE status = 'cancelled'").ok
        assert a.execute("UPDATE sqlrl_t_customers SET name = N'changed'").affected_rows == 60
        assert a.execute("CREATE VIEW sqlrl_s_v AS SELECT COUNT(*) AS n FROM sqlrl_t_orders").ok
        assert a.execute("SELECT SUM(x) FROM #t").rows == ((3,),)
        assert a.execute("SELECT body FROM sqlrl_s_notes").rows == (("hi",),)
        n_a = a.execute("SELECT n FROM sqlrl_s_v").rows[0][0]
        assert n_a < n_orders
        # the other session sees none of it
        assert b.execute("SELECT * FROM #t").error.kind is ErrorKind.RUNTIME
        r = b.execute("SELECT * FROM sqlrl_s_notes")
        assert r.error is not None and r.error.kind in (ErrorKind.RUNTIME, ErrorKind.TIMEOUT)
        r = b.execute("SELECT COUNT(*) FROM sqlrl_t_orders")
        if base["rcsi"]:  # readers see the last committed version
            assert r.rows == ((n_orders,),)
        else:  # readers block on a's uncommitted changes until the lock timeout
            assert r.error.kind is ErrorKind.TIMEOUT
    with open_session(URL) as c:  # and it is gone after close
        assert c.execute("SELECT * FROM sqlrl_s_notes").error.kind is ErrorKind.RUNTIME
        assert count(c) == n_orders
    assert checksum() == before


def _random_statement(rng):
    table = rng.choice(TABLES)
    return rng.choice([
        f"DELETE FROM {table} WHERE {'order_id' if 'orders' in table else 'customer_id'} % {rng.randint(2, 5)} = 0",
        "UPDATE sqlrl_t_orders SET total = total * 2, status = 'x'",
        f"INSERT INTO sqlrl_t_customers (customer_id, name) VALUES ({rng.randint(1000, 9999)}, N'new')",
        f"INSERT INTO sqlrl_t_customers (customer_id, name) VALUES ({rng.randint(1, 60)}, N'dup')",
        f"DROP TABLE {table}",
        f"TRUNCATE TABLE {table}",
        f"ALTER TABLE {table} ADD c{rng.randint(0, 99)} int",
        f"EXEC sp_rename '{table}', '{table}_old'",
        f"CREATE TABLE sqlrl_s_t{rng.randint(0, 9)} (x int)",
        f"SELECT * INTO sqlrl_s_copy{rng.randint(0, 9)} FROM {table}",
        f"CREATE VIEW sqlrl_s_v{rng.randint(0, 9)} AS SELECT 1 AS x",
        f"CREATE INDEX i{rng.randint(0, 9)} ON sqlrl_t_orders (status)",
        "CREATE TABLE #tmp (x int)",
        "SELECT 1 COMMIT",
        "COMMIT TRAN",
        "SAVE TRANSACTION sqlrl_sp",
        "SET IMPLICIT_TRANSACTIONS ON",
        "SET XACT_ABORT ON",
        "SELECT 1/0",
        "SELECT FROM",
    ])


def test_many_random_ddl_dml_sessions_leave_the_base_unchanged(base):
    before = checksum()
    rng = random.Random(7)
    ok = 0
    for _ in range(200):
        with open_session(URL) as s:
            for _ in range(rng.randint(1, 4)):
                ok += s.execute(_random_statement(rng)).ok
            assert s.execute("SELECT @@TRANCOUNT").rows == ((1,),) or s.lost
    assert ok > 150
    assert checksum() == before


def test_timeout_stops_work_and_the_session_survives(base):
    with open_session(URL, limits=Limits(timeout_s=1.0)) as s:
        assert s.execute("CREATE TABLE #keep (x int)").ok
        assert s.execute("INSERT INTO #keep VALUES (1)").ok
        for sql in ("WAITFOR DELAY '00:01:00'",  # 60 s: the bound below tells it from 1 s
                    "SELECT COUNT_BIG(*) FROM sys.all_objects a CROSS JOIN sys.all_objects b "
                    "CROSS JOIN sys.all_objects c"):
            t0 = time.monotonic()
            r = s.execute(sql)
            assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT, r
            assert time.monotonic() - t0 < 30
            assert s.execute("SELECT x FROM #keep").rows == ((1,),)
            assert s.execute("SELECT @@TRANCOUNT").rows == ((1,),)


def test_lock_waits_time_out_and_the_session_survives(base):
    with open_session(URL) as a, open_session(URL, limits=Limits(timeout_s=1.0)) as b:
        assert a.execute("UPDATE sqlrl_t_customers SET name = N'a' WHERE customer_id = 1").ok
        t0 = time.monotonic()
        r = b.execute("UPDATE sqlrl_t_customers SET name = N'b' WHERE customer_id = 1")
        assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT, r  # not a wait forever
        assert time.monotonic() - t0 < 30  # only a guard against hanging
        assert b.execute("SELECT 1").rows == ((1,),)


def test_row_and_byte_caps(base):
    with open_session(URL, limits=Limits(max_rows=7)) as s:
        r = s.execute("SELECT * FROM sqlrl_t_orders")
        assert r.truncated and r.row_count == 7
        r = s.execute("SELECT TOP 7 * FROM sqlrl_t_orders")
        assert not r.truncated and r.row_count == 7
        assert s.execute("SELECT 1").rows == ((1,),)  # the capped batch was cancelled cleanly
    with open_session(URL, limits=Limits(max_bytes=2000)) as s:
        r = s.execute("SELECT * FROM sqlrl_t_customers")
        assert r.truncated and 0 < r.row_count < 60
        r = s.execute("SELECT REPLICATE(CAST('x' AS varchar(max)), 100000)")
        assert r.truncated and r.row_count == 0


@pytest.mark.parametrize("sql", [
    "EXEC xp_cmdshell 'whoami'", "xp_cmdshell 'whoami'", "EXEC('SELECT 1')",
    "EXEC sp_executesql N'SELECT 1'", "SELECT * FROM OPENROWSET(BULK '/etc/passwd', SINGLE_CLOB) AS x",
    "BULK INSERT sqlrl_t_orders FROM '/etc/passwd'", "BACKUP DATABASE master TO DISK = '/tmp/x.bak'",
    "USE master", "SELECT 1 USE master", "COMMIT", "COMMIT TRAN", "SELECT 1 COMMIT", "PRINT 1 COMMIT",
    "BEGIN TRAN", "ROLLBACK", "SAVE TRAN x", "SET IMPLICIT_TRANSACTIONS ON", "SET XACT_ABORT ON",
    "SET LOCK_TIMEOUT -1", "CREATE LOGIN evil WITH PASSWORD = 'Evil-pw-123'",
    "ALTER DATABASE CURRENT SET TRUSTWORTHY ON", "SHUTDOWN", "KILL 1", "DBCC CHECKDB",
    "RECONFIGURE", "EXECUTE AS USER = 'dbo'", "SELECT * INTO ##g FROM sqlrl_t_orders",
    "{call xp_cmdshell('whoami')}",
])
def test_hostile_statements_are_denied_and_the_session_survives(base, sql):
    with open_session(URL) as s:
        r = s.execute(sql)
        assert r.error is not None and r.error.kind is ErrorKind.PERMISSION, r
        assert s.execute("SELECT @@TRANCOUNT").rows == ((1,),)


@pytest.mark.parametrize("sql, kind", [
    ("SELECT FROM", ErrorKind.SYNTAX),
    ("SELECT * FROM sqlrl_t_orders WHERE", ErrorKind.SYNTAX),
    ("SELECT 'unterminated", ErrorKind.SYNTAX),
    ("SELECT * FROM missing_table", ErrorKind.RUNTIME),
    ("SELECT nope FROM sqlrl_t_orders", ErrorKind.RUNTIME),
    ("SELECT 1/0", ErrorKind.RUNTIME),
    ("INSERT INTO sqlrl_t_customers (customer_id, name) VALUES (1, N'dup')", ErrorKind.RUNTIME),
    ("SELECT * FROM sys.dm_os_sys_info", ErrorKind.PERMISSION),
    ("", ErrorKind.SYNTAX),
])
def test_errors_are_typed_and_the_session_survives(base, sql, kind):
    with open_session(URL) as s:
        s.execute("CREATE TABLE #keep (x int)")
        r = s.execute(sql)
        assert r.error is not None and r.error.kind is kind, r
        assert s.execute("SELECT COUNT(*) FROM #keep").rows == ((0,),)


def test_multi_statement_calls_stop_at_the_first_error_and_keep_earlier_effects(base):
    with open_session(URL) as s:
        r = s.execute("CREATE TABLE #a (x int); INSERT INTO #a VALUES (1); SELECT FROM; INSERT INTO #a VALUES (2)")
        assert r.error.kind is ErrorKind.SYNTAX and r.error.statement_index == 2
        assert s.execute("SELECT x FROM #a").rows == ((1,),)
        r = s.execute("INSERT INTO #a VALUES (5); SELECT SUM(x) FROM #a;")
        assert r.ok and r.rows == ((6,),)


def test_values_are_normalised(base):
    with open_session(URL) as s:
        r = s.execute("SELECT CAST(2.50 AS decimal(5, 2)), CAST(7 AS bigint), CAST('2024-01-02' AS date), "
                      "CAST('2024-01-02T03:04:05.5' AS datetime2), "
                      "CAST('2024-01-02 03:04:05 +01:00' AS datetimeoffset), 0x00ff, N'\u00fc', "
                      "CAST(1 AS bit), CAST(NULL AS int)")
        assert r.ok, r
        assert r.rows == ((2.5, 7, "2024-01-02", "2024-01-02 03:04:05.500000", "2024-01-02 03:04:05+01:00",
                           "0x00ff", "\u00fc", True, None),)
        assert len(s.execute("SELECT NEWID()").rows[0][0]) == 36


def test_pooled_connections_are_reset_between_sessions(base):
    with SessionPool(PoolConfig(max_size=1)) as pool:
        with pool.session(URL) as s:
            assert s.execute("CREATE TABLE #mine (x int)").ok
            assert s.execute("DELETE FROM sqlrl_t_orders").ok
        with pool.session(URL) as s:
            assert s.execute("SELECT * FROM #mine").error.kind is ErrorKind.RUNTIME
            assert count(s) == 300
        assert pool.stats().resets >= 1


def test_closed_session_reports_session_lost(base):
    s = open_session(URL)
    s.close()
    s.close()
    assert s.execute("SELECT 1").error.kind is ErrorKind.SESSION_LOST


@pytest.mark.skipif(bool(URL) and not os.environ.get("SQLRL_MSSQL_ADMIN_URL"), reason="SQLRL_MSSQL_ADMIN_URL is unset")
def test_sysadmin_logins_are_refused():
    with pytest.raises(SessionError, match="sysadmin"):
        open_session(os.environ["SQLRL_MSSQL_ADMIN_URL"])
