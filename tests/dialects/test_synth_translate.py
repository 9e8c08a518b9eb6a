"""Synthetic tasks translated to PostgreSQL / MariaDB: kept only when the server agrees with SQLite."""

import uuid
from dataclasses import replace

import pytest

from sqlrl.db import open_session
from sqlrl.db.provisioning import provision
from sqlrl.synth.domains import build_domain_db
from sqlrl.synth.text2sql import generate_text2sql
from sqlrl.eval.compare import canonical_value, same_result
from sqlrl.eval.compare import outer_order_by as order_matters
from sqlrl.synth.translate import translate_tasks

DOMAINS = ("library", "flights")


# --- the comparison (no server needed) ---------------------------------------------------------------

def test_canonical_values_and_bag_comparison():
    assert canonical_value(True) == 1 and canonical_value(5.0) == 5 and canonical_value("42") == 42
    assert canonical_value(0.1 + 0.2) == 0.3 and canonical_value("042") == "042"
    assert same_result([(1, "a"), (2, "b")], [(2, "b"), (1.0, "a")], ordered=False)
    assert not same_result([(1, "a"), (2, "b")], [(2, "b"), (1, "a")], ordered=True)
    assert not same_result([(1,), (1,)], [(1,)], ordered=False)  # a bag, not a set
    assert not same_result([(301.23456789,)], [(301.2346,)], ordered=False)
    assert order_matters("SELECT a FROM t ORDER BY a LIMIT 3")
    assert not order_matters("SELECT a FROM t WHERE a IN (SELECT b FROM u ORDER BY b LIMIT 1)")


def test_unknown_target_dialect_is_rejected_before_anything_happens():
    with pytest.raises(ValueError, match="not 'oracle'"):
        translate_tasks([], {}, "oracle", "oracle://nobody@127.0.0.1/x")
    with pytest.raises(ValueError, match="dialect 'klingon'"):
        translate_tasks([], {}, "klingon", "x://")


# --- on real servers ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth_translate")
    catalog, tasks = {}, []
    for name in DOMAINS:
        catalog[name] = build_domain_db(name, str(root / name / f"{name}.sqlite"), seed=0)
        tasks += generate_text2sql(name, catalog[name], 45, seed=0)
    return catalog, tasks


@pytest.fixture(scope="module", params=["postgresql", "mysql"])
def translated(request, synthetic):
    dialect = request.param
    admin = request.getfixturevalue("pg_admin_url" if dialect == "postgresql" else "mysql_admin_url")
    catalog, tasks = synthetic
    broken = replace(tasks[0], task_id="broken/1", gold_sql="SELECT no_such_column FROM books")
    orphan = replace(tasks[1], task_id="orphan/1", db_id="missing_db")
    already = replace(tasks[2], task_id="pg/1", dialect="postgresql")
    inputs = tasks + [broken, orphan, already]
    prefix = f"t_{uuid.uuid4().hex[:6]}_"
    kept, report = translate_tasks(inputs, catalog, dialect, admin, name_prefix=prefix)
    yield dialect, tasks, kept, report
    for name, _url in report.databases.values():
        provision.drop_database(admin, name)


def test_every_task_is_kept_or_dropped_with_a_reason(translated):
    dialect, tasks, kept, report = translated
    assert report.total == len(tasks) + 3
    assert report.kept == len(kept) and len(kept) + len(report.dropped) == report.total
    reasons = {tid: r for tid, r, _ in report.dropped}
    assert "load-error" not in reasons.values(), report.dropped[:3]  # the server refused a load: say why
    assert reasons["broken/1"] == "sqlite-error"
    assert reasons["orphan/1"] == "no-database"
    assert reasons["pg/1"] == "not-sqlite"
    assert set(report.databases) == set(DOMAINS)
    # almost every synthetic gold survives; what does not is accounted for
    assert len(kept) >= 0.9 * len(tasks), report.dropped
    assert set(report.reasons) <= {"sqlite-error", "no-database", "not-sqlite", "mismatch",
                                   "server-error", "transpile-error"}


def test_kept_tasks_are_in_the_target_dialect_and_agree_with_sqlite(translated, synthetic):
    dialect, tasks, kept, report = translated
    catalog, _ = synthetic
    source = {t.task_id: t for t in tasks}
    difficulties = set()
    for name, url in report.databases.values():
        db_id = next(k for k, v in report.databases.items() if v[0] == name)
        with open_session(url) as server, open_session("sqlite:///" + catalog[db_id]) as lite:
            for t in (k for k in kept if k.db_id == db_id):
                assert t.dialect == dialect and t.task_id.endswith(f"@{dialect}")
                original = source[t.meta["sqlite_task_id"]]
                assert t.meta["sqlite_sql"] == original.gold_sql and t.question == original.question
                assert t.meta["server_database"] == name
                a, b = lite.execute(original.gold_sql), server.execute(t.gold_sql)
                assert a.ok and b.ok and b.row_count > 0, (t.gold_sql, b.error)
                assert same_result(a.rows, b.rows, order_matters(original.gold_sql))
                difficulties.add(t.difficulty)
    assert difficulties == {"simple", "moderate", "challenging"}
    # the input tasks were not modified
    assert all(t.dialect == "sqlite" for t in tasks)
