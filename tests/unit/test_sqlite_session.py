"""SQLite sessions: isolation, limits that really stop work, the sandbox, typed errors."""

import hashlib
import os
import random
import sqlite3
import threading
import time

import pytest

from sqlrl.db import ErrorKind, Limits, SessionError, open_session
from sqlrl.db.dialects import sqlite as sqlite_adapter


def url(path):
    return f"sqlite:///{path}"


def checksum(path):
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    h = hashlib.sha256()
    for (name, sql) in conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name"):
        h.update(f"{name}:{sql}".encode())
        if sql and sql.startswith("CREATE TABLE"):
            for row in sorted(map(repr, conn.execute(f'SELECT * FROM "{name}"'))):
                h.update(row.encode())
    conn.close()
    return h.hexdigest()


def test_state_persists_within_a_session_and_is_private(demo_db_path):
    with open_session(url(demo_db_path)) as a, open_session(url(demo_db_path)) as b:
        assert a.execute("CREATE TEMP TABLE t(x)").ok
        assert a.execute("INSERT INTO t VALUES (1), (2)").affected_rows == 2
        assert a.execute("CREATE TABLE notes(id INTEGER, body TEXT)").ok
        assert a.execute("INSERT INTO notes VALUES (1, 'hi')").ok
        assert a.execute("DELETE FROM orders WHERE status = 'cancelled'").ok
        assert a.execute("UPDATE products SET price = 0").ok
        assert a.execute("CREATE VIEW v AS SELECT count(*) AS n FROM orders").ok
        assert a.execute("SELECT sum(x) FROM t").rows == ((3,),)
        assert a.execute("SELECT body FROM notes").rows == (("hi",),)
        assert a.execute("SELECT max(price) FROM products").rows == ((0,),)
        n_a = a.execute("SELECT n FROM v").rows[0][0]
        # the other session sees none of it
        assert b.execute("SELECT * FROM t").error.kind is ErrorKind.RUNTIME
        assert b.execute("SELECT * FROM notes").error.kind is ErrorKind.RUNTIME
        assert b.execute("SELECT count(*) FROM orders").rows[0][0] > n_a
        assert b.execute("SELECT max(price) FROM products").rows[0][0] > 0
    with open_session(url(demo_db_path)) as c:  # and it is gone after close
        assert c.execute("SELECT * FROM notes").error is not None


def _random_statement(rng):
    table = rng.choice(["customers", "products", "orders", "order_items"])
    return rng.choice([
        f"DELETE FROM {table} WHERE rowid % {rng.randint(2, 5)} = 0",
        f"UPDATE products SET price = price * {rng.randint(2, 9)}",
        f"INSERT INTO customers(name, joined) VALUES ('x{rng.random()}', '2022-01-01')",
        f"DROP TABLE {table}",
        f"ALTER TABLE {table} ADD COLUMN c{rng.randint(0, 99)} TEXT",
        f"ALTER TABLE {table} RENAME TO {table}_old",
        f"CREATE TABLE t{rng.randint(0, 9)} AS SELECT * FROM {table}",
        f"CREATE VIEW v{rng.randint(0, 9)} AS SELECT 1",
        f"CREATE INDEX i{rng.randint(0, 9)} ON {table}(rowid)",
        "CREATE TEMP TABLE tt AS SELECT 1 AS x",
        f"DROP VIEW delivered_orders",
        "DELETE FROM sqlite_master",
        "PRAGMA writable_schema = 1",
        "VACUUM",
        "COMMIT",
    ])


def test_a_thousand_random_ddl_dml_sessions_leave_the_base_unchanged(demo_db_path):
    before = checksum(demo_db_path)
    mtime = os.stat(demo_db_path).st_mtime_ns
    rng = random.Random(7)
    ok = 0
    for _ in range(1000):
        with open_session(url(demo_db_path)) as s:
            for _ in range(rng.randint(1, 4)):
                ok += s.execute(_random_statement(rng)).ok
    assert ok > 1000  # most statements really ran
    assert checksum(demo_db_path) == before
    assert os.stat(demo_db_path).st_mtime_ns == mtime


def test_infinite_recursive_cte_times_out_and_session_survives(demo_db_path):
    with open_session(url(demo_db_path), limits=Limits(timeout_s=1.0)) as s:
        s.execute("CREATE TEMP TABLE keep(x)")
        t0 = time.monotonic()
        r = s.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                      "SELECT count(*) FROM c")
        assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT  # it never ends by itself
        assert time.monotonic() - t0 < 30  # only a guard against hanging
        assert s.execute("SELECT count(*) FROM keep").rows == ((0,),)


def test_timeout_applies_while_rows_are_fetched(demo_db_path):
    # a cross join big enough that producing the capped rows is fast but finishing would not be
    with open_session(url(demo_db_path), limits=Limits(timeout_s=0.5, max_rows=10)) as s:
        r = s.execute("SELECT * FROM order_items a, order_items b, order_items c LIMIT 20")
        assert r.ok and r.truncated and r.row_count == 10
        t0 = time.monotonic()
        r = s.execute("SELECT count(*) FROM order_items a, order_items b, order_items c")
        assert r.error.kind is ErrorKind.TIMEOUT  # stopped while rows were produced
        assert time.monotonic() - t0 < 30  # only a guard against hanging


def test_row_and_byte_caps(demo_db_path):
    with open_session(url(demo_db_path), limits=Limits(max_rows=7)) as s:
        r = s.execute("SELECT * FROM orders")
        assert r.truncated and r.row_count == 7 and len(r.rows) == 7
        r = s.execute("SELECT * FROM orders LIMIT 7")
        assert not r.truncated and r.row_count == 7
    with open_session(url(demo_db_path), limits=Limits(max_bytes=2000)) as s:
        r = s.execute("SELECT * FROM customers")
        assert r.truncated and 0 < r.row_count < 60
        r = s.execute("SELECT hex(zeroblob(5000))")
        assert r.truncated and r.row_count == 0


@pytest.mark.parametrize("sql", [
    "ATTACH DATABASE '{tmp}/evil.db' AS evil",
    "attach '{tmp}/evil.db' as evil",
    "DETACH DATABASE main",
    "VACUUM INTO '{tmp}/evil.db'",
    "vacuum",
    "PRAGMA journal_mode = WAL",
    "PRAGMA writable_schema = ON",
    "PRAGMA main.locking_mode = EXCLUSIVE",
    "SELECT load_extension('{tmp}/evil.so')",
    "BEGIN",
    "COMMIT",
    "END TRANSACTION",
    "ROLLBACK",
    "SAVEPOINT sp",
    "RELEASE sp",
    "SELECT 1; ATTACH '{tmp}/evil.db' AS e",
    "CREATE TEMP TABLE x AS SELECT 1; /* hide */ attach '{tmp}/evil.db' as e",
])
def test_hostile_statements_are_denied_and_write_nothing(demo_db_path, tmp_path, sql):
    with open_session(url(demo_db_path)) as s:
        r = s.execute(sql.format(tmp=tmp_path))
        assert r.error is not None and r.error.kind is ErrorKind.PERMISSION, r
        assert s.execute("SELECT 1").rows == ((1,),)  # still usable
    assert list(tmp_path.iterdir()) == []


def test_read_only_pragmas_are_allowed(demo_db_path):
    with open_session(url(demo_db_path)) as s:
        r = s.execute("PRAGMA table_info(orders)")
        assert r.ok and [row[1] for row in r.rows] == ["order_id", "customer_id", "order_date", "status"]
        assert s.execute("PRAGMA foreign_key_list(orders)").row_count == 1


def test_read_only_is_the_authorizers_word_per_call_also_for_repeated_statements(demo_db_path):
    """``QueryResult.read_only`` with ``Limits.attest``: True only when SQLite reported a SELECT
    and only reads for every statement of the call. The statement cache is on, so a statement run
    a second time comes from it; ``observe`` has SQLite compile it again through the authorizer
    (without that, the second ``SELECT COUNT(*)`` would not be attested) -- also on a reused
    pooled connection. Without ``attest`` nothing is asked: None."""
    from sqlrl.db import SessionPool

    calls = [("SELECT COUNT(*) FROM orders", True), ("DELETE FROM orders WHERE 0", False),
             ("DELETE FROM orders WHERE 0", False), ("SELECT 1", True),
             ("SELECT 1; UPDATE products SET price = price", False),
             ("CREATE TEMP TABLE IF NOT EXISTS t AS SELECT 1 AS x", False), ("SELECT x FROM t", True),
             ("PRAGMA table_info(orders)", False), ("REINDEX", False),
             ("INSERT INTO t VALUES (2) RETURNING x", False), ("SELECT nope", None)]
    attest = Limits(attest=True)
    with open_session(url(demo_db_path), limits=attest) as s:
        for _ in range(2):
            for sql, want in calls:
                assert s.execute(sql).read_only is want, sql
    with open_session(url(demo_db_path)) as s:
        for sql, _ in calls:
            assert s.execute(sql).read_only is None, sql
    with SessionPool() as pool:
        for _ in range(3):
            s = pool.session(url(demo_db_path), limits=attest)
            assert s.execute("DELETE FROM order_items").read_only is False
            assert s.execute("SELECT COUNT(*) FROM order_items").read_only is True
            s.close()


def test_the_statement_cache_serves_unattested_calls_and_keeps_the_sandbox(demo_db_path):
    """Calls that do not attest reuse SQLite's compiled statements (the authorizer is not asked
    again), and what the authorizer denied stays denied on every try."""
    with open_session(url(demo_db_path)) as s:
        conn = s._conn
        seen: list[int] = []
        inner = conn.authorize

        def spy(*args):
            seen.append(args[0])
            return inner(*args)
        conn.set_authorizer(spy)
        conn.authorize = spy
        for _ in range(3):
            assert s.execute("SELECT COUNT(*) FROM orders").rows == ((300,),)
        assert seen.count(sqlite3.SQLITE_SELECT) == 1  # compiled once, then served from the cache
        for _ in range(3):
            r = s.execute("SELECT load_extension('x')")
            assert r.error is not None and r.error.kind is ErrorKind.PERMISSION


def test_huge_values_are_refused_not_built(demo_db_path):
    with open_session(url(demo_db_path)) as s:
        r = s.execute("SELECT length(zeroblob(200000000))")
        assert r.error is not None and r.error.kind is ErrorKind.RUNTIME


@pytest.mark.parametrize("sql, kind", [
    ("SELEC 1", ErrorKind.SYNTAX),
    ("SELECT 'unterminated", ErrorKind.SYNTAX),
    ("SELECT * FROM missing_table", ErrorKind.RUNTIME),
    ("SELECT nope FROM orders", ErrorKind.RUNTIME),
    ("INSERT INTO customers(customer_id, name, joined) VALUES (1, 'dup', '2020-01-01')", ErrorKind.RUNTIME),
    ("", ErrorKind.SYNTAX),
    ("-- just a comment", ErrorKind.SYNTAX),
])
def test_errors_are_typed_results_not_exceptions(demo_db_path, sql, kind):
    with open_session(url(demo_db_path)) as s:
        r = s.execute(sql)
        assert r.error is not None and r.error.kind is kind, r
        assert r.error.message


def test_non_text_sql_is_a_typed_error(demo_db_path):
    with open_session(url(demo_db_path)) as s:
        assert s.execute(None).error.kind is ErrorKind.SYNTAX
        assert s.execute(42).error.kind is ErrorKind.SYNTAX


def test_multi_statement_calls_stop_at_first_error_and_keep_earlier_effects(demo_db_path):
    with open_session(url(demo_db_path)) as s:
        r = s.execute("CREATE TABLE a(x); INSERT INTO a VALUES (1); SELEC oops; INSERT INTO a VALUES (2)")
        assert r.error.kind is ErrorKind.SYNTAX and r.error.statement_index == 2 and r.statements == 4
        assert s.execute("SELECT x FROM a").rows == ((1,),)
        r = s.execute("INSERT INTO a VALUES (5); SELECT sum(x) FROM a;")
        assert r.ok and r.rows == ((6,),) and r.statements == 2


def test_statement_and_text_limits(demo_db_path):
    with open_session(url(demo_db_path), limits=Limits(max_statements=3, max_sql_chars=100)) as s:
        assert s.execute("SELECT 1; SELECT 2; SELECT 3; SELECT 4").error.kind is ErrorKind.PERMISSION
        assert s.execute("SELECT " + "1" * 200).error.kind is ErrorKind.PERMISSION


def test_closed_session_reports_session_lost_and_close_is_idempotent(demo_db_path):
    s = open_session(url(demo_db_path))
    s.close()
    s.close()
    r = s.execute("SELECT 1")
    assert r.error.kind is ErrorKind.SESSION_LOST and s.closed


def test_missing_file_and_bad_urls_raise_session_error(tmp_path):
    with pytest.raises(SessionError, match="not found"):
        open_session(url(tmp_path / "nope.sqlite"))
    with pytest.raises(SessionError, match="not a database URL"):
        open_session("no scheme here")
    with pytest.raises(SessionError, match="unknown dialect"):
        open_session("cockroach://x@localhost/db")
    with pytest.raises(SessionError, match="isolation"):
        open_session(url(tmp_path / "x.sqlite") + "?isolation=bogus")


def test_failing_preprocess_raises_and_runs_in_the_session(demo_db_path):
    with pytest.raises(SessionError, match="preprocess_sql failed"):
        open_session(url(demo_db_path), preprocess_sql=["CREATE TABLE p(x)", "SELEC broken"])
    with open_session(url(demo_db_path), preprocess_sql=["CREATE TABLE p(x)",
                                                         "INSERT INTO p VALUES (9)"]) as s:
        assert s.execute("SELECT x FROM p").rows == ((9,),)


def test_copy_isolation_mode_uses_and_removes_a_private_file(demo_db_path):
    before = checksum(demo_db_path)
    s = open_session(url(demo_db_path) + "?isolation=copy")
    temp_path = s._conn.temp_path
    assert os.path.exists(temp_path)
    assert s.execute("DELETE FROM orders").ok
    assert s.execute("SELECT count(*) FROM orders").rows == ((0,),)
    s.close()
    assert not os.path.exists(temp_path)
    assert checksum(demo_db_path) == before


def test_snapshot_cache_sees_a_rewritten_base(tmp_path):
    path = tmp_path / "db.sqlite"
    for value in (1, 2):
        conn = sqlite3.connect(path)
        conn.execute("DROP TABLE IF EXISTS t")
        conn.execute("CREATE TABLE t(x)")
        conn.execute("INSERT INTO t VALUES (?)", ("v" * value,))
        conn.commit()
        conn.close()
        with open_session(url(path)) as s:
            assert s.execute("SELECT x FROM t").rows == (("v" * value,),)
    assert sqlite_adapter.SNAPSHOTS.get(str(path))


def test_concurrent_calls_on_one_session_are_serialised(demo_db_path):
    with open_session(url(demo_db_path)) as s:
        s.execute("CREATE TABLE c(x)")
        errors = []

        def work():
            for _ in range(50):
                r = s.execute("INSERT INTO c VALUES (1)")
                if not r.ok:
                    errors.append(r.error)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert s.execute("SELECT count(*) FROM c").rows == ((200,),)


def test_results_are_json_ready_and_sqlite_values_round_trip(demo_db_path):
    import json
    with open_session(url(demo_db_path)) as s:
        r = s.execute("SELECT customer_id, name, email, joined, x'00ff' AS b, 1.5 AS f FROM customers "
                      "ORDER BY customer_id LIMIT 3")
        assert r.columns == ("customer_id", "name", "email", "joined", "b", "f")
        assert r.rows[0][4] == "0x00ff" and r.rows[0][5] == 1.5
        json.dumps(r.to_dict())


def test_an_internal_error_becomes_a_typed_result_and_abandons_the_session(demo_db_path, monkeypatch):
    s = open_session(url(demo_db_path))
    monkeypatch.setattr(s.adapter, "denied", lambda statement: 1 / 0)
    r = s.execute("SELECT 1")
    assert r.error.kind is ErrorKind.SESSION_LOST and "ZeroDivisionError" in r.error.message
    assert s.lost
    monkeypatch.undo()
    assert s.execute("SELECT 1").error.kind is ErrorKind.SESSION_LOST
    s.close()
