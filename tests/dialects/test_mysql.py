"""What MariaDB/MySQL sessions do their own way, on a real server (what every server engine does
is in test_server_sessions.py, run on MariaDB too): the scratch database that copies indexes,
generated columns and views, a database and an account per session, deep recursion, the
comment-aware denial and the privileged-account check.

Each test gets its own small database made through ``sqlrl.db.provisioning.provision`` (the base of
``server_cases.MYSQL``) and opens sessions with the unprivileged agent URL, exactly as users do.
"""

import pytest

from sqlrl.db import ErrorKind, Limits, PoolConfig, SessionPool, open_session
from sqlrl.db.dialects import mysql as my_adapter
from sqlrl.db.provisioning.scratch import SCRATCH
from tests.dialects.server_cases import MYSQL, leftovers, make_db, mysql_admin_query, ok

pytestmark = pytest.mark.mysql


@pytest.fixture
def db(mysql_admin_url, request):
    yield from make_db(MYSQL, mysql_admin_url, request)


# --- the scratch database ------------------------------------------------------------------------

def test_the_clone_keeps_indexes_generated_columns_and_views(db):
    with open_session(db.url) as s:
        assert ok(s.execute("SELECT count(*) FROM big_customers")).rows[0][0] > 0
        assert ok(s.execute("SELECT max(total) FROM orders")).rows == ((50,),)
        keys = ok(s.execute("SHOW INDEX FROM orders")).rows
        assert {k[4] for k in keys} >= {"id", "customer_id"}
        ok(s.execute("INSERT INTO orders (customer_id, product_id, qty, placed) "
                     "VALUES (1, 1, 7, '2024-05-05')"))
        assert ok(s.execute("SELECT id, total FROM orders WHERE qty = 7")).rows == ((61, 70),)
        assert s.execute("SELECT DATABASE()").rows[0][0].startswith("sqlrl_s_")
        # error messages name the base database, not the scratch copy
        e = s.execute("SELECT * FROM nosuch").error
        assert e.kind is ErrorKind.RUNTIME and f"{db.name}.nosuch" in e.message


def test_ddl_on_a_base_table_is_private_and_each_session_has_its_own_database(db):
    before = MYSQL.checksum(db)
    with open_session(db.url) as a, open_session(db.url) as b:
        ok(a.execute("ALTER TABLE customers ADD COLUMN vip BOOL DEFAULT TRUE"))
        assert a.execute("SELECT min(vip) FROM customers").rows == ((1,),)
        # the concurrently open session does not see it and is not blocked by a's DDL
        assert b.execute("SELECT vip FROM customers").error.kind is ErrorKind.RUNTIME
        ((da,),), ((dbb,),) = a.execute("SELECT DATABASE()").rows, b.execute("SELECT DATABASE()").rows
        assert da != dbb and {da, dbb} <= SCRATCH.held_names()  # one database each
    assert leftovers(db) == []
    with open_session(db.url) as c:
        assert c.execute("SELECT vip FROM customers").error is not None
    assert MYSQL.checksum(db) == before


def test_recursion_deeper_than_the_server_default_is_not_cut_off(db):
    with open_session(db.url, limits=Limits(timeout_s=1)) as s:
        # recursion deeper than MariaDB's default 1000 iterations is not silently cut off
        r = ok(s.execute("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r "
                         "WHERE n < 5000) SELECT count(*) FROM r"))
        assert r.rows == ((5000,),)


# --- isolation -----------------------------------------------------------------------------------

def test_every_session_gets_a_fresh_database_and_account(db):
    with SessionPool(PoolConfig(max_size=1)) as pool:
        with pool.session(db.url) as s:
            cid, user = s.execute("SELECT CONNECTION_ID(), CURRENT_USER()").rows[0]
            ok(s.execute("SET @x = 5"))
            ok(s.execute("CREATE TEMPORARY TABLE tt(a INT)"))
            assert ok(s.execute("SELECT GET_LOCK('sqlrl-test-lock', 0)")).rows == ((1,),)
            ok(s.execute("SET SESSION group_concat_max_len = 4"))
            assert s.execute("SET NAMES gbk").error.kind is ErrorKind.PERMISSION
        with pool.session(db.url) as s:
            cid2, user2 = s.execute("SELECT CONNECTION_ID(), CURRENT_USER()").rows[0]
            assert cid2 != cid and user2 != user and user2.startswith("sqlrl_s_")
            assert ok(s.execute("SELECT @x, IS_FREE_LOCK('sqlrl-test-lock'), @@group_concat_max_len, "
                                "@@character_set_client")).rows == ((None, 1, 1048576, "utf8mb4"),)
            assert s.execute("SELECT * FROM tt").error.kind is ErrorKind.RUNTIME
            assert ok(s.execute("SELECT 'ünïcødé ✓'")).rows == (("ünïcødé ✓",),)
            limits = ok(s.execute(
                "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.SESSION_VARIABLES "
                "WHERE VARIABLE_NAME IN (CONCAT('MAX_STATEMENT', '_TIME'), 'SQL_SELECT_LIMIT') "
                "ORDER BY 1")).rows
            assert limits == (("MAX_STATEMENT_TIME", "5.000000"), ("SQL_SELECT_LIMIT", "10001"))
    assert leftovers(db) == []
    assert mysql_admin_query(db.server, "SELECT count(*) FROM mysql.user WHERE User = %s",
                       (user.split("@")[0],)) == ((0,),)


# --- the sandbox ---------------------------------------------------------------------------------

def test_denial_sees_through_comments():
    denial = my_adapter.denial
    assert denial("/* hi */ USE mysql")
    assert denial("SELECT 1 /*!50000 INTO OUTFILE '/tmp/x' */")
    assert denial("SELECT 1 /*M!100000 INTO DUMPFILE '/tmp/x' */")
    assert denial("# c\nLOCK TABLES t WRITE")
    assert denial("SELECT * FROM SQLRL_S_abc.t")
    assert denial("SELECT 'INTO OUTFILE'") is not None  # conservative: strings are not parsed
    for fine in ("SELECT 1 /* USE mysql */", "SELECT 'use'", "-- LOCK\nSELECT 1",
                 "CREATE TABLE user_data(x INT)", "CREATE OR REPLACE VIEW v AS SELECT 1",
                 "CREATE TEMPORARY TABLE t(x INT)", "SELECT `execute` FROM t", "SET @a := 1",
                 "DROP TABLE IF EXISTS t", "ALTER TABLE t ADD COLUMN function_name TEXT"):
        assert denial(fine) is None, fine


def test_privileged_account_detection():
    problem = my_adapter.privilege_problem
    own = "sqlrl_s_0123abcd"
    mine = "GRANT SELECT, INSERT, DROP ON `sqlrl\\_s\\_0123abcd`.* TO `sqlrl_s_0123abcd`@`%`"
    assert problem(["GRANT ALL PRIVILEGES ON *.* TO `a`@`%` WITH GRANT OPTION"], own)
    assert problem(["GRANT FILE ON *.* TO `a`@`%`"], own)
    assert problem(["GRANT USAGE ON *.* TO `a`@`%`", "GRANT SELECT ON `shop`.* TO `a`@`%`"], own)
    assert problem(["GRANT USAGE ON *.* TO `a`@`%`", "GRANT `admins` TO `a`@`%`"], own)
    assert problem(["GRANT USAGE ON *.* TO `a`@`%`",
                    "GRANT SELECT, INSERT, CREATE ON `test\\_%`.* TO PUBLIC"], own)
    assert problem(["GRANT USAGE ON *.* TO `a`@`%`", mine,
                    "GRANT SELECT (name) ON `shop`.`t` TO `a`@`%`"], own)
    assert problem(["GRANT USAGE ON *.* TO `a`@`%`", "GRANT SELECT ON `sqlrl\\_s\\_%`.* TO `a`@`%`"],
                   own)  # a pattern covering other sessions' databases
    assert problem(["GRANT USAGE ON *.* TO `a`@`%`", mine], own) is None


def test_the_agent_cannot_read_the_base_itself(db):
    with open_session(db.url) as s:
        assert s.execute(f"SELECT count(*) FROM `{db.name}`.customers").error.kind \
            is ErrorKind.PERMISSION  # not even the base
