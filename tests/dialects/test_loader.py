"""The SQLite -> PostgreSQL / MariaDB loader on real Spider databases: same tables, same row
counts, and Spider's gold queries (transpiled by sqlglot) give the same results as on SQLite."""

import json
import math
import re
import sqlite3
import uuid

import pytest
import sqlglot

from sqlrl.db import open_session
from sqlrl.db.provisioning import provision
from sqlrl.db.provisioning.loader import load_sqlite, plan_column, _scan

SPIDER_DBS = ["concert_singer", "pets_1", "car_1", "flight_2", "employee_hire_evaluation",
              "cre_Doc_Template_Mgt", "world_1"]
SQLGLOT = {"postgresql": "postgres", "mysql": "mysql"}


def schema_names(spider_dir, db_id):
    conn = sqlite3.connect(spider_dir / "database" / db_id / f"{db_id}.sqlite")
    names = {r[0].lower() for r in conn.execute("SELECT name FROM sqlite_master")}
    for table in list(names):
        names |= {r[1].lower() for r in conn.execute(f'PRAGMA table_info("{table}")')}
    return names


def sqlite_strings(query, names):
    """SQLite reads "Asia" as a string when no column is called Asia; Spider relies on that.
    Make such tokens string literals so sqlglot does not read them as identifiers."""
    return re.sub(r'"([^"]*)"', lambda m: m.group(0) if m.group(1).lower() in names
                  else "'" + m.group(1).replace("'", "''") + "'", query)


def canonical(rows, ordered):
    def value(v):
        if isinstance(v, str) and re.fullmatch(r"-?(0|[1-9]\d{0,17})", v):
            return int(v)  # the loader stores integer-spelling text as integers (docs/loader.md)
        if isinstance(v, float):
            if math.isnan(v):
                return "nan"
            v = float(f"{v:.6g}")
            return int(v) if v.is_integer() else v
        return v
    out = [tuple(value(v) for v in row) for row in rows]
    return out if ordered else sorted(out, key=repr)


@pytest.fixture(scope="module", params=["postgresql", "mysql"])
def server(request):
    return request.param, request.getfixturevalue(
        "pg_admin_url" if request.param == "postgresql" else "mysql_admin_url")


@pytest.fixture(scope="module")
def loaded(server, spider_dir):
    dialect, admin = server
    suffix = uuid.uuid4().hex[:6]
    reports = {}
    for db in SPIDER_DBS:
        path = spider_dir / "database" / db / f"{db}.sqlite"
        reports[db] = load_sqlite(str(path), admin, f"t_{db.lower()}_{suffix}", replace=True)
    yield dialect, reports
    for report in reports.values():
        provision.drop_database(admin, report.database)


def test_tables_and_row_counts_match_the_source(loaded, spider_dir):
    dialect, reports = loaded
    for db, report in reports.items():
        src = sqlite3.connect(spider_dir / "database" / db / f"{db}.sqlite")
        tables = [r[0] for r in src.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite%' ORDER BY rowid")]
        expected = [(t.lower(), src.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) for t in tables]
        assert list(report.rows) == expected, db
        with open_session(report.session_url) as s:  # and the server agrees, through a session
            for table, n in expected:
                quoted = f'"{table}"' if dialect == "postgresql" else f"`{table}`"
                assert s.execute(f"SELECT count(*) FROM {quoted}").rows == ((n,),), (db, table)


@pytest.mark.slow
def test_gold_queries_give_the_same_results(loaded, spider_dir):
    dialect, reports = loaded
    gold = [x for x in json.loads((spider_dir / "dev.json").read_text()) if x["db_id"] in reports]
    executed, mismatches, failed = 0, [], []
    for item in gold:
        q = item["query"]
        ordered = "order by" in q.lower()
        with open_session(f"sqlite:///{spider_dir / 'database' / item['db_id'] / (item['db_id'] + '.sqlite')}") as s:
            expected = s.execute(q)
        assert expected.ok, q
        names = schema_names(spider_dir, item["db_id"])
        translated = sqlglot.transpile(sqlite_strings(q, names), read="sqlite", write=SQLGLOT[dialect])[0]
        with open_session(reports[item["db_id"]].session_url) as s:
            got = s.execute(translated)
        if not got.ok:
            failed.append((q, str(got.error)))
            continue
        executed += 1
        if canonical(got.rows, ordered) != canonical(expected.rows, ordered):
            mismatches.append((q, translated))
    total = len(gold)
    print(f"\n{dialect}: {total} gold queries, {executed} executed, {len(mismatches)} mismatched")
    for q, err in failed[:10]:
        print("  failed:", q, "->", err[:150])
    for q, t in mismatches[:10]:
        print("  mismatch:", q)
    # Measured: PostgreSQL 472/501 execute, 12 differ; MariaDB 456/501 execute, 20 differ. What
    # remains is engine semantics, not loading (docs/loader.md lists the causes).
    assert total > 300
    assert executed >= 0.85 * total
    assert len(mismatches) <= 0.06 * executed, mismatches


def test_type_plans_follow_declared_types_and_values():
    assert plan_column("INTEGER", _scan([1, 2, None]))[0] == "integer"
    assert plan_column("INTEGER", _scan([1, "two"]))[0] == "text"
    assert plan_column("INT", _scan([1, 2.5]))[0] == "real"
    assert plan_column("REAL", _scan([1.5, None]))[0] == "real"
    assert plan_column("DECIMAL(10,2)", _scan([1.25, 3]))[0] == "decimal"
    assert plan_column("DATE", _scan(["2020-01-31", None]))[0] == "date"
    assert plan_column("DATETIME", _scan(["2020-01-31 10:00:00", "2020-02-01"]))[0] == "timestamp"
    assert plan_column("DATE", _scan(["2020-01-31", "yesterday"]))[0] == "text"
    assert plan_column("TEXT", _scan(["a", "b"]))[0] == "text"
    assert plan_column("", _scan([b"\x00"]))[0] == "blob"
    assert plan_column("", _scan([]))[0] == "text"


def test_the_demo_database_loads_with_its_view(server, demo_db_path):
    dialect, admin = server
    name = f"t_demo_{uuid.uuid4().hex[:6]}"
    report = load_sqlite(demo_db_path, admin, name, replace=True)
    try:
        assert dict(report.rows) == {"customers": 60, "products": 40, "orders": 300,
                                     "order_items": dict(report.rows)["order_items"]}
        assert report.views == ("delivered_orders",) and report.skipped_views == ()
        with open_session(report.session_url) as s:
            r = s.execute("SELECT count(*) FROM delivered_orders")
            with open_session(f"sqlite:///{demo_db_path}") as lite:
                assert r.rows == lite.execute("SELECT count(*) FROM delivered_orders").rows
            assert s.execute("SELECT * FROM customers WHERE email IS NULL").row_count > 0
    finally:
        provision.drop_database(admin, name)


def test_loader_errors_are_clear(pg_admin_url, tmp_path):
    from sqlrl.db import SessionError
    with pytest.raises(SessionError, match="supports"):
        load_sqlite(str(tmp_path / "x.sqlite"), "sqlite:///x.sqlite")
    with pytest.raises(SessionError, match="cannot read SQLite database"):
        load_sqlite(str(tmp_path / "missing.sqlite"), pg_admin_url, "t_missing")
