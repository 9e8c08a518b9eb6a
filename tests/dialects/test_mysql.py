"""MariaDB/MySQL sessions on a real server: scratch-database isolation, limits, the sandbox, errors.

Each test gets its own small database made through ``sqlrl.db.provision``; the module uses its own
agent user so that counting scratch databases is not disturbed by other users of the server.
"""

import hashlib
import os
import random
import threading
import time
from types import SimpleNamespace

import pymysql
import pytest

from sqlrl.db import ErrorKind, Limits, PoolConfig, SessionError, SessionPool, open_session
from sqlrl.db import provision
from sqlrl.db.dialects import mysql as my_adapter
from sqlrl.db.scratch import SCRATCH
from sqlrl.db.url import parse_url
from tests.conftest import scratch_names, sealed_base

pytestmark = pytest.mark.mysql


BASE_SQL = [
    "CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(50) NOT NULL, city VARCHAR(20))",
    "CREATE TABLE products (id INT PRIMARY KEY, name VARCHAR(50) NOT NULL, "
    "price DECIMAL(10,2) NOT NULL, code VARBINARY(4))",
    "CREATE TABLE orders (id INT AUTO_INCREMENT PRIMARY KEY, customer_id INT NOT NULL, "
    "product_id INT NOT NULL, qty INT NOT NULL, placed DATE NOT NULL, total INT AS (qty * 10) VIRTUAL, "
    "INDEX (customer_id), FOREIGN KEY (customer_id) REFERENCES customers(id))",
    "CREATE VIEW big_orders AS SELECT id, customer_id, qty FROM orders WHERE qty >= 3",
    "CREATE VIEW big_customers AS SELECT DISTINCT customer_id FROM big_orders",
    "INSERT INTO customers VALUES " + ", ".join(
        f"({g}, 'customer {g}', '{['Oslo', 'Lima', 'Pune'][g % 3]}')" for g in range(1, 21)),
    "INSERT INTO products VALUES " + ", ".join(
        f"({g}, 'product {g}', {g * 1.25:.2f}, 0x{g:04x})" for g in range(1, 11)),
    "INSERT INTO orders (customer_id, product_id, qty, placed) VALUES " + ", ".join(
        f"({1 + g % 20}, {1 + g % 10}, {1 + g % 5}, DATE '2024-01-01' + INTERVAL {g} DAY)"
        for g in range(1, 61)),
]
TABLES = ("customers", "products", "orders")


def _admin(url, database=None):
    u = parse_url(url)
    return pymysql.connect(host=u.host, port=u.port, user=u.username, password=u.password or "",
                           database=database, autocommit=True, ssl_disabled=True, charset="utf8mb4")


def admin_query(url, sql, args=None, database=None):
    conn = _admin(url, database)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall()
    finally:
        conn.close()


def checksum(server, name):
    """Hash of the table list, every table's and view's definition and every table's sorted rows."""
    conn = _admin(server, name)
    h = hashlib.sha256()
    with conn.cursor() as cur:
        cur.execute("SHOW FULL TABLES")
        tables = sorted(cur.fetchall())
        h.update(repr(tables).encode())
        for table, kind in tables:
            cur.execute(f"SHOW CREATE {'VIEW' if kind == 'VIEW' else 'TABLE'} `{table}`")
            h.update(repr(cur.fetchone()[:2]).encode())
            if kind != "VIEW":
                cur.execute(f"SELECT * FROM `{table}`")
                for row in sorted(map(repr, cur.fetchall())):
                    h.update(row.encode())
    conn.close()
    return h.hexdigest()


@pytest.fixture(scope="module")
def my(mysql_admin_url):
    provision.prepare_server(mysql_admin_url)
    return mysql_admin_url


@pytest.fixture
def db(my, request):
    tag = hashlib.md5(request.node.name.encode()).hexdigest()[:8]
    name = f"sqlrl_t_{os.getpid()}_{tag}"
    for _, url in sealed_base(my, name, BASE_SQL):
        yield SimpleNamespace(name=name, url=url, server=my, baseline=scratch_names(my))


def scratch_databases(db):
    """Scratch databases on the server that this process does not hold (ready or in use): the
    leftovers of sessions that ended. Waits for the background drops first."""
    assert SCRATCH.settle()
    return sorted(scratch_names(db.server) - db.baseline - SCRATCH.held_names())


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
        assert ok(s.execute("SELECT count(*) FROM big_customers")).rows[0][0] > 0
        assert ok(s.execute("SELECT max(total) FROM orders")).rows == ((50,),)


def test_values_are_normalised(db):
    with open_session(db.url) as s:
        r = ok(s.execute("SELECT price, CAST(2 AS DECIMAL(5,2)), placed, code, "
                         "TIMESTAMP '2020-01-31 12:00:00', TIME '00:01:30', 1.5e0, "
                         "JSON_OBJECT('a', 1), NULL FROM orders JOIN products p ON p.id = product_id "
                         "WHERE orders.id = 2"))
        assert r.rows == ((3.75, 2, "2024-01-03", "0x0003", "2020-01-31 12:00:00", 90.0, 1.5,
                           '{"a": 1}', None),)
        hash(r.rows)


def test_state_persists_across_calls_and_is_private(db):
    before = checksum(db.server, db.name)
    with open_session(db.url) as a, open_session(db.url) as b:
        ok(a.execute("CREATE TEMPORARY TABLE t(x INT)"))
        assert ok(a.execute("INSERT INTO t VALUES (1), (2)")).affected_rows == 2
        ok(a.execute("CREATE TABLE notes(id INT, body TEXT)"))
        ok(a.execute("INSERT INTO notes VALUES (1, 'hi')"))
        ok(a.execute("DELETE FROM orders WHERE qty = 1"))
        ok(a.execute("UPDATE products SET price = 0"))
        ok(a.execute("CREATE VIEW v AS SELECT count(*) AS n FROM orders"))
        ok(a.execute("ALTER TABLE customers ADD COLUMN vip BOOL DEFAULT TRUE"))
        assert a.execute("SELECT sum(x) FROM t").rows == ((3,),)
        assert a.execute("SELECT body FROM notes").rows == (("hi",),)
        assert a.execute("SELECT max(price) FROM products").rows == ((0,),)
        assert a.execute("SELECT min(vip) FROM customers").rows == ((1,),)
        n_a = a.execute("SELECT n FROM v").rows[0][0]
        # the concurrently open session sees none of it (and is not blocked by a's DDL)
        assert b.execute("SELECT * FROM t").error.kind is ErrorKind.RUNTIME
        assert b.execute("SELECT * FROM notes").error.kind is ErrorKind.RUNTIME
        assert b.execute("SELECT * FROM v").error.kind is ErrorKind.RUNTIME
        assert b.execute("SELECT vip FROM customers").error.kind is ErrorKind.RUNTIME
        assert b.execute("SELECT count(*) FROM orders").rows[0][0] > n_a
        assert b.execute("SELECT max(price) FROM products").rows[0][0] > 0
        ((da,),), ((dbb,),) = a.execute("SELECT DATABASE()").rows, b.execute("SELECT DATABASE()").rows
        assert da != dbb and {da, dbb} <= SCRATCH.held_names()  # one database each
    assert scratch_databases(db) == []
    with open_session(db.url) as c:  # and all of it is gone after close
        assert c.execute("SELECT * FROM notes").error is not None
        assert c.execute("SELECT count(*) FROM orders").rows == ((60,),)
    assert checksum(db.server, db.name) == before


def test_the_clone_keeps_indexes_generated_columns_and_views(db):
    with open_session(db.url) as s:
        assert ok(s.execute("SELECT count(*) FROM big_customers")).rows[0][0] > 0
        keys = ok(s.execute("SHOW INDEX FROM orders")).rows
        assert {k[4] for k in keys} >= {"id", "customer_id"}
        ok(s.execute("INSERT INTO orders (customer_id, product_id, qty, placed) "
                     "VALUES (1, 1, 7, '2024-05-05')"))
        assert ok(s.execute("SELECT id, total FROM orders WHERE qty = 7")).rows == ((61, 70),)
        assert s.execute("SELECT DATABASE()").rows[0][0].startswith("sqlrl_s_")
        # error messages name the base database, not the scratch copy
        e = s.execute("SELECT * FROM nosuch").error
        assert e.kind is ErrorKind.RUNTIME and f"{db.name}.nosuch" in e.message


def test_multi_statement_stops_at_first_error_and_keeps_earlier_effects(db):
    with open_session(db.url) as s:
        r = s.execute("INSERT INTO customers VALUES (100, 'a', NULL); SELEC 1; "
                      "INSERT INTO customers VALUES (101, 'b', NULL)")
        assert r.error.kind is ErrorKind.SYNTAX and r.error.statement_index == 1
        assert r.statements == 3
        assert s.execute("SELECT id FROM customers WHERE id >= 100").rows == ((100,),)
        r = ok(s.execute("SELECT 1 AS a; SELECT 2 AS b"))
        assert r.columns == ("b",) and r.rows == ((2,),) and r.statements == 2


def test_error_kinds(db):
    with open_session(db.url, limits=Limits(timeout_s=1)) as s:
        assert s.execute("SELEC 1").error.kind is ErrorKind.SYNTAX
        assert s.execute("SELECT * FROM nosuch").error.kind is ErrorKind.RUNTIME
        assert s.execute("INSERT INTO customers VALUES (1, 'dup', NULL)").error.kind is ErrorKind.RUNTIME
        assert s.execute("SELECT * FROM mysql.user").error.kind is ErrorKind.PERMISSION
        assert s.execute(f"UPDATE {db.name}.products SET price = 0").error.kind is ErrorKind.PERMISSION
        assert s.execute("CREATE TABLE test.t(x INT)").error.kind is ErrorKind.PERMISSION
        assert s.execute("SELECT SLEEP(3)").error.kind is ErrorKind.TIMEOUT
        assert ok(s.execute("SELECT 1")).rows == ((1,),)


def test_runaway_recursive_cte_times_out_and_the_session_survives(db):
    with open_session(db.url, limits=Limits(timeout_s=1)) as s:
        ok(s.execute("CREATE TEMPORARY TABLE kept AS SELECT 7 AS x"))
        t0 = time.monotonic()
        r = s.execute("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
                      "SELECT count(*) FROM r")
        assert r.error.kind is ErrorKind.TIMEOUT  # it never ends by itself
        assert time.monotonic() - t0 < 30  # only a guard against hanging
        assert s.execute("SELECT x FROM kept").rows == ((7,),)
        # recursion deeper than MariaDB's default 1000 iterations is not silently cut off
        r = ok(s.execute("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r "
                         "WHERE n < 5000) SELECT count(*) FROM r"))
        assert r.rows == ((5000,),)


def test_row_and_byte_caps_truncate(db):
    # a long timeout: without the server-side cap the unbuffered rest would be drained until it,
    # so the bound below tells "stopped at the cap" from "ran 60 s", whatever the machine load
    with open_session(db.url, limits=Limits(max_rows=5, timeout_s=60)) as s:
        r = ok(s.execute("SELECT id FROM orders ORDER BY id"))
        assert r.rows == tuple((i,) for i in range(1, 6)) and r.truncated
        t0 = time.monotonic()  # the server stops one row past the cap (sql_select_limit)
        r = ok(s.execute("SELECT a.id FROM orders a, orders b, orders c, orders d, orders e"))
        assert r.row_count == 5 and r.truncated and time.monotonic() - t0 < 30
        ok(s.execute("INSERT INTO customers SELECT id + 100, name, city FROM customers"))
        assert ok(s.execute("SELECT count(*) FROM customers")).rows == ((40,),)
    with open_session(db.url, limits=Limits(max_bytes=2000)) as s:
        r = ok(s.execute("SELECT REPEAT('x', 100) FROM orders"))
        assert r.truncated and 0 < r.row_count < 60


# --- isolation under load ------------------------------------------------------------------------

def _random_statement(rng, base):
    t = rng.choice(TABLES)
    n = rng.randint(0, 9)
    return rng.choice([
        f"DELETE FROM {t} WHERE id % {rng.randint(2, 5)} = 0",
        "UPDATE products SET price = price * 2",
        f"UPDATE customers SET name = 'x{n}' WHERE id = {n}",
        f"INSERT INTO customers VALUES ({1000 + n}, 'new', NULL)",
        "INSERT INTO orders (customer_id, product_id, qty, placed) VALUES (1, 1, 9, NOW())",
        f"DROP TABLE {t}",
        f"TRUNCATE {t}",
        f"ALTER TABLE {t} ADD COLUMN c{n} VARCHAR(5) DEFAULT 'z'",
        f"ALTER TABLE {t} DROP COLUMN name",
        f"RENAME TABLE {t} TO {t}_old",
        f"CREATE TABLE t{n} AS SELECT * FROM {t}",
        f"CREATE VIEW v{n} AS SELECT 1 AS x",
        "DROP VIEW big_orders",
        "CREATE OR REPLACE VIEW big_orders AS SELECT 1 AS id",
        f"CREATE INDEX i{n} ON {t}(id)",
        "CREATE TEMPORARY TABLE tt AS SELECT 1 AS x",
        "SET @x = 1",
        "SELECT GET_LOCK('k', 0)",
        "SET SESSION group_concat_max_len = 4",
        "SELECT nosuch FROM customers",
        "SELEC 1",
        "COMMIT", "ROLLBACK", "BEGIN", "START TRANSACTION",
        "USE mysql",
        f"DROP DATABASE {base}",
        "CREATE DATABASE evil",
        f"INSERT INTO {base}.customers VALUES (999, 'x', NULL)",
        f"UPDATE {base}.products SET price = 0",
        f"DELETE FROM {base}.orders",
        f"DROP TABLE {base}.orders",
        f"CREATE TABLE {base}.evil(x INT)",
        f"ALTER TABLE {base}.customers ADD COLUMN evil INT",
        f"RENAME TABLE customers TO {base}.stolen",
        "SET sql_mode = ''",
        "PREPARE s FROM 'SELECT 1'",
        "LOCK TABLES customers WRITE",
        "SELECT 1; COMMIT",
    ])


@pytest.mark.slow
def test_a_thousand_random_ddl_dml_sessions_leave_the_base_unchanged(db):
    before = checksum(db.server, db.name)
    rng = random.Random(11)
    pool = SessionPool(PoolConfig(max_size=2, limits=Limits(timeout_s=2)))
    errors = 0
    try:
        for i in range(1000):
            with pool.session(db.url) as s:
                # whatever the previous session on this connection did is gone
                assert ok(s.execute("SELECT count(*), @x FROM orders")).rows == ((60, None),), i
                for _ in range(rng.randint(1, 4)):
                    sql = "; ".join(_random_statement(rng, db.name) for _ in range(rng.randint(1, 3)))
                    r = s.execute(sql)
                    errors += r.error is not None
                    assert r.error is None or r.error.kind is not ErrorKind.SESSION_LOST, (sql, r.error)
        stats = pool.stats()
        assert stats.connects == stats.discards == 1000  # a fresh clone each, never reused
    finally:
        pool.close()
    assert 300 < errors < 3500
    assert checksum(db.server, db.name) == before
    assert scratch_databases(db) == []


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
    assert scratch_databases(db) == []
    assert admin_query(db.server, "SELECT count(*) FROM mysql.user WHERE User = %s",
                       (user.split("@")[0],)) == ((0,),)


# --- the sandbox ---------------------------------------------------------------------------------

def test_hostile_statements_are_errors_and_touch_nothing(db):
    target = f"/tmp/sqlrl_pwn_{os.getpid()}"
    before = checksum(db.server, db.name)
    with open_session(db.url, limits=Limits(timeout_s=2)) as s, open_session(db.url) as other:
        other_db = other.execute("SELECT DATABASE()").rows[0][0]
        ok(s.execute("DELETE FROM orders WHERE id > 10"))
        hostile = [
            "LOAD DATA INFILE '/etc/passwd' INTO TABLE customers",
            "LOAD DATA LOCAL INFILE '/etc/passwd' INTO TABLE customers",
            "LOAD XML INFILE '/etc/passwd' INTO TABLE customers",
            f"SELECT * FROM customers INTO OUTFILE '{target}'",
            f"SELECT * INTO OUTFILE '{target}' FROM customers",
            f"SELECT * FROM customers INTO/**/DUMPFILE '{target}'",
            f"SELECT * FROM customers /*!INTO OUTFILE '{target}' */",
            "SELECT LOAD_FILE('/etc/passwd')",
            "USE mysql", f"USE {other_db}",
            f"DROP DATABASE {db.name}", f"DROP SCHEMA {db.name}",
            "PREPARE s FROM CONCAT('SELECT ', '1')", "EXECUTE s", "DEALLOCATE PREPARE s",
            "EXECUTE IMMEDIATE 'SELECT 1'",
            "SET GLOBAL max_connections = 1", "SET @@global.max_connections = 1",
            "SET PERSIST max_connections = 1",
            "GRANT ALL ON *.* TO CURRENT_USER", "REVOKE SELECT ON *.* FROM CURRENT_USER",
            "CREATE USER evil IDENTIFIED BY 'x'", "DROP USER sqlrl_agent",
            "ALTER USER CURRENT_USER IDENTIFIED BY 'x'", "SET PASSWORD = PASSWORD('x')",
            "CREATE DATABASE evil", "CREATE DATABASE sqlrl_s_evil",
            f"SELECT * FROM {other_db}.customers", f"SELECT * FROM {other_db.upper()}.customers",
            f"DROP TABLE `{other_db}`.customers",
            "KILL 1", "KILL QUERY 1", "FLUSH PRIVILEGES", "LOCK TABLES customers WRITE",
            "UNLOCK TABLES", "SHUTDOWN", "HANDLER customers OPEN", "INSTALL PLUGIN x SONAME 'x.so'",
            "INSTALL SONAME 'ha_connect'", "XA START 'x'",
            "CREATE PROCEDURE p() SELECT 1", "CREATE DEFINER=root@localhost VIEW dv AS SELECT 1",
            "CREATE TRIGGER tr BEFORE INSERT ON customers FOR EACH ROW SET NEW.city = 'x'",
            "CREATE EVENT e ON SCHEDULE EVERY 1 SECOND DO SELECT 1",
            "BEGIN NOT ATOMIC SELECT 1; END",
            "IF 1 THEN SELECT 1; END IF", "lbl: LOOP LEAVE lbl; END LOOP",
            "SET sql_mode = 'NO_BACKSLASH_ESCAPES'", "SET STATEMENT max_statement_time = 0 FOR SELECT 1",
            "SET max_statement_time = 0", "SET @@session.max_statement_time = 0",
            "SET NAMES gbk", "SET CHARACTER SET sjis", "SET character_set_client = big5",
            "SELECT * FROM information_schema.PROCESSLIST", "SHOW PROCESSLIST",
            "COMMIT", "BEGIN", "ROLLBACK", "START TRANSACTION", "SAVEPOINT x",
            "SELECT 1; COMMIT",
        ]
        for sql in hostile:
            r = s.execute(sql)
            assert r.error is not None, sql
            assert r.error.kind is ErrorKind.PERMISSION, (sql, r.error)
        # writes to the base or other databases meet the account's privileges
        for sql in (f"INSERT INTO {db.name}.customers VALUES (99, 'x', NULL)",
                    f"DELETE FROM {db.name}.orders", f"CREATE TABLE {db.name}.evil(x INT)",
                    f"CREATE TEMPORARY TABLE {db.name}.evil(x INT)",
                    f"CREATE VIEW {db.name}.evil AS SELECT 1", "CREATE TABLE test.evil(x INT)",
                    "CREATE TABLE mysql.evil(x INT)", "SELECT * FROM mysql.user"):
            r = s.execute(sql)
            assert r.error is not None and r.error.kind is ErrorKind.PERMISSION, (sql, r.error)
        assert ok(s.execute("SELECT count(*) FROM orders")).rows == ((10,),)
        assert ok(other.execute("SELECT count(*) FROM orders")).rows == ((60,),)
    assert not os.path.exists(target)
    assert checksum(db.server, db.name) == before


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


def test_the_agents_sql_never_runs_as_the_admin(db):
    with open_session(db.url) as s:  # db.url holds the admin's credentials
        (user,), = s.execute("SELECT CURRENT_USER()").rows
        assert user.startswith("sqlrl_s_")
        assert s.execute(f"SELECT count(*) FROM `{db.name}`.customers").error.kind \
            is ErrorKind.PERMISSION  # not even the base
    with pytest.raises(SessionError, match="allow_superuser is not supported"):
        open_session(db.url + "?allow_superuser=1")


def test_unreachable_server_fails_fast():
    t0 = time.monotonic()
    with pytest.raises(SessionError, match="cannot connect"):
        open_session("mysql://sqlrl_agent:x@127.0.0.1:1/nowhere")
    assert time.monotonic() - t0 < 3


def test_failing_preprocess_sql_raises_and_leaves_nothing(db):
    before = checksum(db.server, db.name)
    with pytest.raises(SessionError, match="preprocess_sql failed"):
        open_session(db.url, preprocess_sql=["DELETE FROM orders", "CREATE TABLE x(a INT)",
                                             "SELECT nosuch FROM customers"])
    assert scratch_databases(db) == []
    assert checksum(db.server, db.name) == before
    with open_session(db.url, preprocess_sql=["CREATE TEMPORARY TABLE pre AS SELECT 5 AS x"]) as s:
        assert s.execute("SELECT x FROM pre").rows == ((5,),)


def test_killed_connection_gives_session_lost_and_its_scratch_is_collected(db):
    s = open_session(db.url)
    ok(s.execute("CREATE TABLE mine AS SELECT 1 AS x"))
    cid = s.execute("SELECT CONNECTION_ID()").rows[0][0]
    orphan = s.execute("SELECT DATABASE()").rows[0][0]
    admin_query(db.server, f"KILL {int(cid)}")
    deadline = time.monotonic() + 30  # KILL only flags the connection: wait until it is gone
    while admin_query(db.server, "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s",
                      (int(cid),)):
        assert time.monotonic() < deadline, "the killed connection is still there"
        time.sleep(0.02)
    assert s.execute("SELECT 1").error.kind is ErrorKind.SESSION_LOST
    assert s.execute("SELECT 2").error.kind is ErrorKind.SESSION_LOST
    assert s.lost
    s.close()
    s.close()
    assert orphan not in scratch_databases(db)  # dropped with its account all the same
    with open_session(db.url) as t:
        assert ok(t.execute("SELECT count(*) FROM customers")).rows == ((20,),)


def test_ping_and_close(db):
    adapter = my_adapter.MySQLDialect()
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

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert scratch_databases(db) == []
