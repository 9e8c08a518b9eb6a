"""What the session conformance suite (test_server_sessions.py) needs to know of each server engine
here (PostgreSQL, MariaDB), as data: the base database it builds, how to fingerprint it, and the
engine's spelling of the statements a check uses. The engines' own tests (test_postgresql.py,
test_mysql.py) build their bases with the same pieces.

A new server engine that runs here adds one ``ServerCase`` to ``CASES`` (with the fixture of its
admin URL) and gets every conformance test.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from sqlrl.db.provisioning import provision
from sqlrl.db.provisioning.scratch import SCRATCH
from sqlrl.db.url import parse_url
from tests.conftest import scratch_names, sealed_base

TABLES = ("customers", "products", "orders")

# -- PostgreSQL -------------------------------------------------------------------------------------

PG_BASE_SQL = [
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


def pg_admin_query(url: str, sql: str, args: Any = None) -> Any:
    import psycopg2

    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


def pg_checksum(admin_db_url: str) -> str:
    """Hash of the table list, column definitions, view definitions, indexes, owners and every
    table's sorted rows of the database ``admin_db_url`` names."""
    q = lambda sql: pg_admin_query(admin_db_url, sql)  # noqa: E731
    h = hashlib.sha256()
    tables = q("SELECT table_name, table_type FROM information_schema.tables "
               "WHERE table_schema = 'public' ORDER BY 1")
    h.update(repr(tables).encode())
    for sql in ("SELECT table_name, column_name, data_type, is_nullable, column_default "
                "FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2",
                "SELECT viewname, definition FROM pg_views WHERE schemaname = 'public' ORDER BY 1",
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1",
                "SELECT relname, pg_get_userbyid(relowner) FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE nspname = 'public' ORDER BY 1"):
        h.update(repr(q(sql)).encode())
    for name, kind in tables:
        if kind == "BASE TABLE":
            for row in sorted(map(repr, q(f'SELECT * FROM "{name}"'))):
                h.update(row.encode())
    return h.hexdigest()


def _ordinary_statements(rng: Any) -> list[str]:
    """Statements both engines' random sessions draw from (each adds its own dialect's)."""
    t = rng.choice(TABLES)
    n = rng.randint(0, 9)
    return [
        f"DELETE FROM {t} WHERE id % {rng.randint(2, 5)} = 0",
        "UPDATE products SET price = price * 2",
        f"UPDATE customers SET name = 'x{n}' WHERE id = {n}",
        f"INSERT INTO customers VALUES ({1000 + n}, 'new', NULL)",
        f"ALTER TABLE {t} DROP COLUMN name",
        f"CREATE TABLE t{n} AS SELECT * FROM {t}",
        f"CREATE VIEW v{n} AS SELECT 1 AS x",
        "DROP VIEW big_orders",
        "SELECT nosuch FROM customers",
        "SELEC 1",
        "COMMIT", "ROLLBACK", "BEGIN",
        "SELECT 1; COMMIT",
    ]


def pg_random_statement(rng: Any, base: str) -> str:
    t = rng.choice(TABLES)
    n = rng.randint(0, 9)
    return rng.choice(_ordinary_statements(rng) + [
        "INSERT INTO orders(customer_id, product_id, qty, placed) VALUES (1, 1, 9, now())",
        f"DROP TABLE {t} CASCADE",
        f"TRUNCATE {t} CASCADE",
        f"ALTER TABLE {t} ADD COLUMN c{n} text DEFAULT 'z'",
        f"ALTER TABLE {t} RENAME TO {t}_old",
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
        "END",
        "PREPARE TRANSACTION 'x'",
        "DO $$BEGIN EXECUTE 'COM' || 'MIT'; END$$",
        "DO $$BEGIN EXECUTE 'DROP TABLE orders CASCADE'; END$$",
        "SELECT set_config('search_path', 'pg_catalog', false)",
    ])


# Advisory locks other than sqlrl's own liveness locks (class 0x7371, two-key form)
PG_SESSION_ADVISORY_LOCKS = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                             "AND NOT (classid = 29553 AND objsubid = 2)")

# -- MariaDB/MySQL ----------------------------------------------------------------------------------

MYSQL_BASE_SQL = [
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


def mysql_admin_query(url: str, sql: str, args: Any = None, database: str | None = None) -> Any:
    import pymysql

    u = parse_url(url)
    conn = pymysql.connect(host=u.host, port=u.port, user=u.username, password=u.password or "",
                           database=database, autocommit=True, ssl_disabled=True, charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall()
    finally:
        conn.close()


def mysql_checksum(server: str, name: str) -> str:
    """Hash of the table list, every table's and view's definition and every table's sorted rows
    of database ``name`` on ``server``."""
    q = lambda sql: mysql_admin_query(server, sql, database=name)  # noqa: E731
    h = hashlib.sha256()
    tables = sorted(q("SHOW FULL TABLES"))
    h.update(repr(tables).encode())
    for table, kind in tables:
        h.update(repr(q(f"SHOW CREATE {'VIEW' if kind == 'VIEW' else 'TABLE'} `{table}`")[0][:2]).encode())
        if kind != "VIEW":
            for row in sorted(map(repr, q(f"SELECT * FROM `{table}`"))):
                h.update(row.encode())
    return h.hexdigest()


def mysql_random_statement(rng: Any, base: str) -> str:
    t = rng.choice(TABLES)
    n = rng.randint(0, 9)
    return rng.choice(_ordinary_statements(rng) + [
        "INSERT INTO orders (customer_id, product_id, qty, placed) VALUES (1, 1, 9, NOW())",
        f"DROP TABLE {t}",
        f"TRUNCATE {t}",
        f"ALTER TABLE {t} ADD COLUMN c{n} VARCHAR(5) DEFAULT 'z'",
        f"RENAME TABLE {t} TO {t}_old",
        "CREATE OR REPLACE VIEW big_orders AS SELECT 1 AS id",
        f"CREATE INDEX i{n} ON {t}(id)",
        "CREATE TEMPORARY TABLE tt AS SELECT 1 AS x",
        "SET @x = 1",
        "SELECT GET_LOCK('k', 0)",
        "SET SESSION group_concat_max_len = 4",
        "START TRANSACTION",
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
    ])


# -- the cases --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ServerCase:
    """One server engine as the conformance suite sees it. SQL templates may name ``{base}`` (the
    base database), ``{target}`` (a file path that must never appear) and ``{other}`` /
    ``{other_upper}`` (``other_sql``'s answer in a second open session)."""

    dialect: str
    admin_fixture: str  # the fixture that gives the server's admin URL (tests/conftest.py)
    mark: Any  # the server's pytest marker
    base_sql: tuple[str, ...]
    checksum: Callable[[SimpleNamespace], str]  # of the base of a test's ``db`` (``make_db``)
    admin_query: Callable[..., Any]  # (url, sql, args=None) -> rows, as the admin
    random_statement: Callable[[Any, str], str]  # (rng, base) -> a hostile or ordinary statement
    temp: str  # the keyword of a temporary table: "TEMP" / "TEMPORARY"
    view_count: str  # counts a view (over a view) of the base: > 0
    normalised: tuple[str, tuple]  # (a query of many types, the rows it must give)
    errors: tuple[tuple[str, str], ...]  # (statement, ErrorKind name) under a 1 s timeout
    recursion_unbounded: str  # a recursive CTE that never ends
    cap_rows: str  # >= 6 rows whose first five are (1,) ... (5,)
    cap_cross_join: str  # far too many rows to fetch: must stop at the cap
    cap_bytes: tuple[str, int]  # (100-byte rows, how many of them)
    fresh_check: tuple[str, tuple]  # (what a fresh session of the base gives, its rows)
    residue: tuple[tuple[str, Any], ...]  # (admin query, its answer) once every session ended
    other_sql: str  # what a second session names itself by, for the hostile statements
    hostile: tuple[str, ...]  # each a PERMISSION error that changes nothing
    hostile_indirect: tuple[str, ...]  # the same through dynamic SQL / qualified names
    whoami: str  # the agent's login name (the first column)
    unreachable: str  # a URL of this engine where nothing listens
    connection_id: str  # the server's id of this session's connection
    kill: str  # (admin) end a connection by id (%s)
    connection_alive: str  # (admin) a row while the connection of id %s still exists
    current_database: str  # the session's own database (a scratch clone)


def ok(result: Any) -> Any:
    """``result`` when it is no error (the error is the assertion's message)."""
    assert result.error is None, result.error
    return result


def leftovers(db: SimpleNamespace) -> list[str]:
    """Scratch databases (and roles/users) that appeared on the server since ``db`` was made and
    that this process does not hold: the leftovers of sessions that ended. Waits for the
    background drops first."""
    assert SCRATCH.settle()
    return sorted(scratch_names(db.server) - db.baseline - SCRATCH.held_names())


def make_db(case: ServerCase, admin_url: str, request: pytest.FixtureRequest):
    """A fresh sealed base for one test (named after it): yields its namespace (``name``, ``admin``:
    the admin URL of the base, ``url``: its session URL, ``server``, ``baseline``: the scratch
    names on the server before it, ``case``); drops the base afterwards."""
    provision.prepare_server(admin_url)
    tag = hashlib.md5(request.node.name.encode()).hexdigest()[:8]
    name = f"sqlrl_t_{os.getpid()}_{tag}"
    for admin_db, url in sealed_base(admin_url, name, list(case.base_sql)):
        yield SimpleNamespace(name=name, admin=admin_db, url=url, server=admin_url,
                              baseline=scratch_names(admin_url), case=case)


PG = ServerCase(
    dialect="postgresql", admin_fixture="pg_admin_url", mark=pytest.mark.postgres,
    base_sql=tuple(PG_BASE_SQL), checksum=lambda db: pg_checksum(db.admin), admin_query=pg_admin_query,
    random_statement=pg_random_statement, temp="TEMP",
    view_count="SELECT count(*) FROM big_orders",
    normalised=("SELECT price, 2::numeric, placed, meta, tags, '\\x0aff'::bytea, "
                "interval '90 seconds', TIMESTAMP '2020-01-31 12:00:00', 1.5::float8, "
                "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid "
                "FROM orders JOIN products p ON p.id = product_id WHERE orders.id = 2",
                ((3.75, 2, "2024-01-03", '{"gift":true,"n":2}', '["a","b"]', "0x0aff", 90.0,
                  "2020-01-31 12:00:00", 1.5, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),)),
    errors=(("SELEC 1", "SYNTAX"), ("SELECT * FROM nosuch", "RUNTIME"), ("SELECT 1/0", "RUNTIME"),
            ("SELECT * FROM pg_authid", "PERMISSION"), ("SELECT pg_sleep(3)", "TIMEOUT"),
            ("", "SYNTAX")),
    recursion_unbounded="WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    cap_rows="SELECT g FROM generate_series(1, 100) g",
    cap_cross_join="SELECT a.g FROM generate_series(1, 100000) a(g), generate_series(1, 100000) b(g)",
    cap_bytes=("SELECT repeat('x', 100) FROM generate_series(1, 100)", 100),
    fresh_check=("SELECT count(*) FROM orders", ((60,),)),
    residue=((PG_SESSION_ADVISORY_LOCKS, [(0,)]), ("SELECT count(*) FROM pg_prepared_xacts", [(0,)])),
    other_sql="SELECT pg_backend_pid()",
    hostile=(
        "SELECT pg_read_file('/etc/passwd')",
        "SELECT pg_read_binary_file('/etc/passwd')",
        "SELECT * FROM pg_ls_dir('/')",
        "COPY (SELECT 1) TO PROGRAM 'touch {target}'",
        "COPY customers TO '{target}'",
        "COPY customers FROM '/etc/passwd'",
        "SELECT lo_export(lo_from_bytea(0, 'x'), '{target}')",
        "SELECT lo_import('/etc/passwd')",
        "SET ROLE postgres",
        "SET SESSION AUTHORIZATION postgres",
        "RESET ROLE",
        "ALTER SYSTEM SET work_mem = '1MB'",
        "CREATE EXTENSION dblink",
        "CREATE EXTENSION pgcrypto",
        "LOAD 'auto_explain'",
        "SELECT pg_terminate_backend({other})",
        "SELECT pg_cancel_backend({other})",
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
    ),
    # the same things through dynamic SQL meet the role's privileges instead of text rules
    hostile_indirect=tuple(f"DO $$BEGIN EXECUTE '{body}'; END$$" for body in (
        "SELECT pg_' || 'read_file(''/etc/passwd'')",
        "COPY (SELECT 1) TO PROGRAM ''touch {target}''",
        "COPY customers TO ''{target}''",
        "SELECT lo_' || 'export(lo_from_bytea(0, ''x''), ''{target}'')",
        "SET ROLE postgres",
        "SELECT pg_' || 'terminate_backend({other})",
        "SELECT set_' || 'config(''statement_timeout'', ''0'', false)",
        "CREATE EXTENSION pgcrypto",
    )),
    whoami="SELECT current_user",
    unreachable="postgresql://sqlrl_agent:x@127.0.0.1:1/nowhere",
    connection_id="SELECT pg_backend_pid()",
    kill="SELECT pg_terminate_backend(%s)",
    connection_alive="SELECT 1 FROM pg_stat_activity WHERE pid = %s",
    current_database="SELECT current_database()",
)

MYSQL = ServerCase(
    dialect="mysql", admin_fixture="mysql_admin_url", mark=pytest.mark.mysql,
    base_sql=tuple(MYSQL_BASE_SQL), checksum=lambda db: mysql_checksum(db.server, db.name), admin_query=mysql_admin_query,
    random_statement=mysql_random_statement, temp="TEMPORARY",
    view_count="SELECT count(*) FROM big_customers",
    normalised=("SELECT price, CAST(2 AS DECIMAL(5,2)), placed, code, "
                "TIMESTAMP '2020-01-31 12:00:00', TIME '00:01:30', 1.5e0, "
                "JSON_OBJECT('a', 1), NULL FROM orders JOIN products p ON p.id = product_id "
                "WHERE orders.id = 2",
                ((3.75, 2, "2024-01-03", "0x0003", "2020-01-31 12:00:00", 90.0, 1.5, '{"a": 1}', None),)),
    errors=(("SELEC 1", "SYNTAX"), ("SELECT * FROM nosuch", "RUNTIME"),
            ("INSERT INTO customers VALUES (1, 'dup', NULL)", "RUNTIME"),
            ("SELECT * FROM mysql.user", "PERMISSION"),
            ("UPDATE {base}.products SET price = 0", "PERMISSION"),
            ("CREATE TABLE test.t(x INT)", "PERMISSION"), ("SELECT SLEEP(3)", "TIMEOUT")),
    recursion_unbounded="WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    cap_rows="SELECT id FROM orders ORDER BY id",
    # the server stops one row past the cap (sql_select_limit)
    cap_cross_join="SELECT a.id FROM orders a, orders b, orders c, orders d, orders e",
    cap_bytes=("SELECT REPEAT('x', 100) FROM orders", 60),
    fresh_check=("SELECT count(*), @x FROM orders", ((60, None),)),
    residue=(),
    other_sql="SELECT DATABASE()",
    hostile=(
        "LOAD DATA INFILE '/etc/passwd' INTO TABLE customers",
        "LOAD DATA LOCAL INFILE '/etc/passwd' INTO TABLE customers",
        "LOAD XML INFILE '/etc/passwd' INTO TABLE customers",
        "SELECT * FROM customers INTO OUTFILE '{target}'",
        "SELECT * INTO OUTFILE '{target}' FROM customers",
        "SELECT * FROM customers INTO/**/DUMPFILE '{target}'",
        "SELECT * FROM customers /*!INTO OUTFILE '{target}' */",
        "SELECT LOAD_FILE('/etc/passwd')",
        "USE mysql", "USE {other}",
        "DROP DATABASE {base}", "DROP SCHEMA {base}",
        "PREPARE s FROM CONCAT('SELECT ', '1')", "EXECUTE s", "DEALLOCATE PREPARE s",
        "EXECUTE IMMEDIATE 'SELECT 1'",
        "SET GLOBAL max_connections = 1", "SET @@global.max_connections = 1",
        "SET PERSIST max_connections = 1",
        "GRANT ALL ON *.* TO CURRENT_USER", "REVOKE SELECT ON *.* FROM CURRENT_USER",
        "CREATE USER evil IDENTIFIED BY 'x'", "DROP USER sqlrl_agent",
        "ALTER USER CURRENT_USER IDENTIFIED BY 'x'", "SET PASSWORD = PASSWORD('x')",
        "CREATE DATABASE evil", "CREATE DATABASE sqlrl_s_evil",
        "SELECT * FROM {other}.customers", "SELECT * FROM {other_upper}.customers",
        "DROP TABLE `{other}`.customers",
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
    ),
    # writes to the base or other databases meet the account's privileges
    hostile_indirect=(
        "INSERT INTO {base}.customers VALUES (99, 'x', NULL)",
        "DELETE FROM {base}.orders", "CREATE TABLE {base}.evil(x INT)",
        "CREATE TEMPORARY TABLE {base}.evil(x INT)",
        "CREATE VIEW {base}.evil AS SELECT 1", "CREATE TABLE test.evil(x INT)",
        "CREATE TABLE mysql.evil(x INT)", "SELECT * FROM mysql.user",
    ),
    whoami="SELECT CURRENT_USER()",
    unreachable="mysql://sqlrl_agent:x@127.0.0.1:1/nowhere",
    connection_id="SELECT CONNECTION_ID()",
    kill="KILL %s",
    connection_alive="SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s",
    current_database="SELECT DATABASE()",
)

CASES = (PG, MYSQL)


def ok(result):
    """The result, asserting the statement ran without an error (the error's text otherwise)."""
    assert result.error is None, result.error
    return result
