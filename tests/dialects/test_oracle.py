"""Oracle sessions against a real server: the same properties as the other engines.

Runs only when SQLRL_ORACLE_URL names a non-privileged user, e.g.
``oracle://sqlrl:sqlrl@127.0.0.1:1521/?service_name=FREEPDB1`` (docs/unverified_dialects.md has a
docker command). The user needs CREATE TABLE and a tablespace quota: the module (re)creates its
base tables ``sqlrl_t_*`` in its schema with a direct connection before the tests. Private
temporary tables need Oracle 18c or later. Optional: SQLRL_ORACLE_ADMIN_URL (a DBA account) to
check that DBA accounts are refused.
"""

from __future__ import annotations

import hashlib
import os
import random
import time

import pytest

from sqlrl.db import ErrorKind, Limits, PoolConfig, SessionError, SessionPool, open_session
from sqlrl.db.url import parse_url

URL = os.environ.get("SQLRL_ORACLE_URL")
pytestmark = pytest.mark.skipif(not URL, reason="no Oracle: set SQLRL_ORACLE_URL to run; adapter unverified")

TABLES = ("SQLRL_T_CUSTOMERS", "SQLRL_T_ORDERS")


def direct():
    import oracledb

    from sqlrl.db.dialects.oracle import connect_params
    return oracledb.connect(**connect_params(parse_url(URL)))


@pytest.fixture(scope="module")
def base():
    import oracledb
    conn = direct()
    cur = conn.cursor()
    for t in TABLES:
        try:
            cur.execute(f"DROP TABLE {t} PURGE")
        except oracledb.DatabaseError:
            pass
    cur.execute("CREATE TABLE sqlrl_t_customers (customer_id NUMBER PRIMARY KEY, "
                "name VARCHAR2(100) NOT NULL, joined DATE, note CLOB)")
    cur.execute("CREATE TABLE sqlrl_t_orders (order_id NUMBER PRIMARY KEY, customer_id NUMBER NOT NULL, "
                "status VARCHAR2(20) NOT NULL, total NUMBER(10, 2))")
    rng = random.Random(0)
    cur.executemany("INSERT INTO sqlrl_t_customers VALUES (:1, :2, DATE '2020-01-01' + :3, :4)",
                    [(i, f"customer {i}", i % 28, "x" * rng.randint(1, 300)) for i in range(1, 61)])
    cur.executemany("INSERT INTO sqlrl_t_orders VALUES (:1, :2, :3, :4)",
                    [(i, 1 + i % 60, rng.choice(["new", "shipped", "delivered", "cancelled"]),
                      rng.randint(100, 99999) / 100) for i in range(1, 301)])
    conn.commit()
    conn.close()


def checksum():
    conn = direct()
    cur = conn.cursor()
    h = hashlib.sha256()
    for (name, kind) in cur.execute("SELECT object_name, object_type FROM user_objects "
                                    "ORDER BY object_name, object_type").fetchall():
        h.update(f"{name}:{kind}".encode())
    for t in TABLES:
        for row in cur.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall():
            h.update(repr(tuple(v.read() if hasattr(v, "read") else v for v in row)).encode())
    conn.close()
    return h.hexdigest()


def count(session, table="sqlrl_t_orders"):
    return session.execute(f"SELECT COUNT(*) FROM {table}").rows[0][0]


def test_state_persists_is_private_and_gone_after_close(base):
    before = checksum()
    with open_session(URL) as a, open_session(URL) as b:
        n_orders = count(b)
        assert a.execute("CREATE PRIVATE TEMPORARY TABLE ora$ptt_t (x NUMBER)").ok
        assert a.execute("INSERT INTO ora$ptt_t VALUES (1)").affected_rows == 1
        assert a.execute("INSERT INTO ora$ptt_t VALUES (2)").ok
        assert a.execute("DELETE FROM sqlrl_t_orders WHERE status = 'cancelled'").ok
        assert a.execute("UPDATE sqlrl_t_customers SET name = 'changed'").affected_rows == 60
        assert a.execute("SELECT SUM(x) FROM ora$ptt_t").rows == ((3,),)
        n_a = count(a)
        assert n_a < n_orders
        # the other session sees none of it
        assert b.execute("SELECT * FROM ora$ptt_t").error.kind is ErrorKind.RUNTIME
        assert count(b) == n_orders
        assert b.execute("SELECT COUNT(*) FROM sqlrl_t_customers WHERE name = 'changed'").rows == ((0,),)
    with open_session(URL) as c:  # and it is gone after close
        assert c.execute("SELECT * FROM ora$ptt_t").error.kind is ErrorKind.RUNTIME
        assert count(c) == n_orders
    assert checksum() == before


def _random_statement(rng):
    table = rng.choice(TABLES)
    key = "order_id" if "ORDERS" in table else "customer_id"
    return rng.choice([
        f"DELETE FROM {table} WHERE MOD({key}, {rng.randint(2, 5)}) = 0",
        "UPDATE sqlrl_t_orders SET total = total * 2, status = 'x'",
        f"INSERT INTO sqlrl_t_customers (customer_id, name) VALUES ({rng.randint(1000, 9999)}, 'new')",
        f"INSERT INTO sqlrl_t_customers (customer_id, name) VALUES ({rng.randint(1, 60)}, 'dup')",
        "MERGE INTO sqlrl_t_orders o USING (SELECT 1 AS id FROM dual) s ON (o.order_id = s.id) "
        "WHEN MATCHED THEN UPDATE SET o.status = 'merged'",
        f"CREATE PRIVATE TEMPORARY TABLE ora$ptt_r{rng.randint(0, 9)} AS SELECT * FROM {table}",
        f"DROP TABLE {table}",
        f"TRUNCATE TABLE {table}",
        f"ALTER TABLE {table} ADD c{rng.randint(0, 99)} NUMBER",
        f"CREATE TABLE sqlrl_s_t{rng.randint(0, 9)} (x NUMBER)",
        "CREATE PRIVATE TEMPORARY TABLE ora$ptt_p (x NUMBER) ON COMMIT PRESERVE DEFINITION",
        "COMMIT",
        "BEGIN COMMIT; END",
        "SELECT 1/0 FROM dual",
        "SELEC 1",
    ])


def test_many_random_dml_sessions_leave_the_base_unchanged(base):
    before = checksum()
    rng = random.Random(7)
    ok = 0
    for _ in range(200):
        with open_session(URL) as s:
            for _ in range(rng.randint(1, 4)):
                ok += s.execute(_random_statement(rng)).ok
    assert ok > 100
    assert checksum() == before


def test_timeout_stops_work_and_the_session_survives(base):
    with open_session(URL, limits=Limits(timeout_s=1.0)) as s:
        assert s.execute("CREATE PRIVATE TEMPORARY TABLE ora$ptt_keep (x NUMBER)").ok
        assert s.execute("INSERT INTO ora$ptt_keep VALUES (1)").ok
        t0 = time.monotonic()
        r = s.execute("SELECT COUNT(*) FROM all_objects a, all_objects b, all_objects c")
        assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT, r
        assert time.monotonic() - t0 < 30  # only a guard against hanging
        assert s.execute("SELECT x FROM ora$ptt_keep").rows == ((1,),)


def test_lock_waits_time_out_and_the_session_survives(base):
    with open_session(URL) as a, open_session(URL, limits=Limits(timeout_s=1.0)) as b:
        assert a.execute("UPDATE sqlrl_t_customers SET name = 'a' WHERE customer_id = 1").ok
        t0 = time.monotonic()
        r = b.execute("UPDATE sqlrl_t_customers SET name = 'b' WHERE customer_id = 1")
        assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT, r  # not a wait forever
        assert time.monotonic() - t0 < 30  # only a guard against hanging
        assert b.execute("SELECT 1 FROM dual").rows == ((1,),)


def test_row_and_byte_caps(base):
    with open_session(URL, limits=Limits(max_rows=7)) as s:
        r = s.execute("SELECT * FROM sqlrl_t_orders")
        assert r.truncated and r.row_count == 7
        r = s.execute("SELECT * FROM sqlrl_t_orders FETCH FIRST 7 ROWS ONLY")
        assert not r.truncated and r.row_count == 7
    with open_session(URL, limits=Limits(max_bytes=2000)) as s:
        r = s.execute("SELECT * FROM sqlrl_t_customers")
        assert r.truncated and 0 < r.row_count < 60


@pytest.mark.parametrize("sql", [
    "CREATE TABLE evil (x NUMBER)", "DROP TABLE sqlrl_t_orders", "TRUNCATE TABLE sqlrl_t_orders",
    "ALTER SYSTEM FLUSH SHARED_POOL", "CREATE DIRECTORY d AS '/tmp'", "GRANT DBA TO PUBLIC",
    "COMMIT", "ROLLBACK", "SAVEPOINT sqlrl_sp", "BEGIN NULL; END", "DECLARE x NUMBER",
    "CALL dbms_lock.sleep(1)", "SELECT utl_http.request('http://127.0.0.1:1/') FROM dual",
    "SELECT dbms_xmlgen.getxml('SELECT 1 FROM dual') FROM dual", "SELECT * FROM dual@loopback",
    "CREATE PRIVATE TEMPORARY TABLE ora$ptt_p (x NUMBER) ON COMMIT PRESERVE DEFINITION",
    "ALTER SESSION SET CURRENT_SCHEMA = SYS", "LOCK TABLE sqlrl_t_orders IN EXCLUSIVE MODE",
])
def test_hostile_statements_are_denied_and_the_session_survives(base, sql):
    with open_session(URL) as s:
        r = s.execute(sql)
        assert r.error is not None and r.error.kind is ErrorKind.PERMISSION, r
        assert s.execute("SELECT 1 FROM dual").rows == ((1,),)


@pytest.mark.parametrize("sql, kind", [
    ("SELEC 1", ErrorKind.SYNTAX),
    ("SELECT * FROM dual WHERE", ErrorKind.SYNTAX),
    ("SELECT 'unterminated FROM dual", ErrorKind.SYNTAX),
    ("SELECT * FROM missing_table", ErrorKind.RUNTIME),
    ("SELECT nope FROM dual", ErrorKind.RUNTIME),
    ("SELECT 1/0 FROM dual", ErrorKind.RUNTIME),
    ("INSERT INTO sqlrl_t_customers (customer_id, name) VALUES (1, 'dup')", ErrorKind.RUNTIME),
    ("", ErrorKind.SYNTAX),
])
def test_errors_are_typed_and_the_session_survives(base, sql, kind):
    with open_session(URL) as s:
        assert s.execute("UPDATE sqlrl_t_customers SET name = 'kept' WHERE customer_id = 2").ok
        r = s.execute(sql)
        assert r.error is not None and r.error.kind is kind, r
        assert s.execute("SELECT name FROM sqlrl_t_customers WHERE customer_id = 2").rows == (("kept",),)


def test_multi_statement_calls_stop_at_the_first_error_and_keep_earlier_effects(base):
    with open_session(URL) as s:
        r = s.execute("CREATE PRIVATE TEMPORARY TABLE ora$ptt_a (x NUMBER); INSERT INTO ora$ptt_a VALUES (1); "
                      "SELEC oops; INSERT INTO ora$ptt_a VALUES (2)")
        assert r.error.kind is ErrorKind.SYNTAX and r.error.statement_index == 2
        assert s.execute("SELECT x FROM ora$ptt_a").rows == ((1,),)
        r = s.execute("INSERT INTO ora$ptt_a VALUES (5); SELECT SUM(x) FROM ora$ptt_a;")
        assert r.ok and r.rows == ((6,),)


def test_values_and_lobs_are_normalised(base):
    with open_session(URL) as s:
        r = s.execute("SELECT 2.5, 7, DATE '2024-01-02', TIMESTAMP '2024-01-02 03:04:05.5', "
                      "TO_CLOB('abc'), TO_BLOB(HEXTORAW('00FF')), NULL FROM dual")
        assert r.ok, r
        assert r.rows == ((2.5, 7, "2024-01-02 00:00:00", "2024-01-02 03:04:05.500000", "abc", "0x00ff", None),)
        r = s.execute("SELECT note FROM sqlrl_t_customers WHERE customer_id = 1")
        assert isinstance(r.rows[0][0], str)


def test_pooled_connections_are_reset_between_sessions(base):
    with SessionPool(PoolConfig(max_size=1)) as pool:
        with pool.session(URL) as s:
            assert s.execute("CREATE PRIVATE TEMPORARY TABLE ora$ptt_mine (x NUMBER)").ok
            assert s.execute("DELETE FROM sqlrl_t_orders").ok
        with pool.session(URL) as s:
            assert s.execute("SELECT * FROM ora$ptt_mine").error.kind is ErrorKind.RUNTIME
            assert count(s) == 300
        assert pool.stats().resets >= 1


def test_closed_session_reports_session_lost(base):
    s = open_session(URL)
    s.close()
    s.close()
    assert s.execute("SELECT 1 FROM dual").error.kind is ErrorKind.SESSION_LOST


@pytest.mark.skipif(bool(URL) and not os.environ.get("SQLRL_ORACLE_ADMIN_URL"), reason="SQLRL_ORACLE_ADMIN_URL is unset")
def test_dba_accounts_are_refused():
    with pytest.raises(SessionError, match="privileged"):
        open_session(os.environ["SQLRL_ORACLE_ADMIN_URL"])
