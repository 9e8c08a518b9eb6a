"""The seeded domain databases: determinism, schema = annotations, FK integrity, realistic data."""

import re
import sqlite3
from datetime import date

import pytest

from sqlrl.tasks.demo_db import build_demo_database
from sqlrl.synth.domains import DOMAINS, ROLES, Column, Table, build_domain_db, get_domain

ISO = re.compile(r"\d{4}-\d{2}-\d{2}\Z")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("domains")
    return {name: build_domain_db(name, str(root / f"{name}.sqlite"), seed=0) for name in DOMAINS}


def connect(path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def test_registry_has_shop_and_at_least_four_more_domains():
    assert "shop" in DOMAINS
    assert len(set(DOMAINS) - {"shop"}) >= 4
    for d in DOMAINS.values():
        assert 3 <= len(d.tables) <= 6, d.name
        assert d.foreign_keys, d.name
        for t in d.tables:
            assert t.singular and t.plural and t.singular != t.plural
            for c in t.columns:
                assert c.phrase and c.role in ROLES


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_same_seed_gives_identical_bytes_and_another_seed_differs(name, tmp_path):
    a = build_domain_db(name, str(tmp_path / "a.sqlite"), seed=3)
    b = build_domain_db(name, str(tmp_path / "b.sqlite"), seed=3)
    c = build_domain_db(name, str(tmp_path / "c.sqlite"), seed=4)
    assert open(a, "rb").read() == open(b, "rb").read()
    assert open(a, "rb").read() != open(c, "rb").read()


def test_rebuilding_replaces_the_file(tmp_path):
    path = str(tmp_path / "x.sqlite")
    build_domain_db("library", path, seed=0)
    first = open(path, "rb").read()
    build_domain_db("library", path, seed=1)
    build_domain_db("library", path, seed=0)
    assert open(path, "rb").read() == first


def test_shop_domain_is_the_demo_database(tmp_path):
    a = build_domain_db("shop", str(tmp_path / "a.sqlite"), seed=5)
    b = build_demo_database(str(tmp_path / "b.sqlite"), seed=5)
    assert open(a, "rb").read() == open(b, "rb").read()


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_schema_matches_annotations(name, built):
    d = DOMAINS[name]
    conn = connect(built[name])
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY rowid")]
    assert tables == [t.name for t in d.tables]
    for t in d.tables:
        info = conn.execute(f"PRAGMA table_info({t.name})").fetchall()
        assert [r[1] for r in info] == [c.name for c in t.columns]
        assert [r[1] for r in sorted(info, key=lambda r: r[5]) if r[5]] == list(t.primary_key)
        for r, c in zip(info, t.columns):
            assert (r[3] == 0) == c.nullable or r[5], (t.name, c.name)  # NOT NULL unless nullable
    fks = {(t, r[3], r[2], r[4]) for t in tables
           for r in conn.execute(f"PRAGMA foreign_key_list({t})").fetchall()}
    assert fks == {(f.table, f.column, f.ref_table, f.ref_column) for f in d.foreign_keys}


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_foreign_keys_hold_and_data_is_realistic(name, built):
    d = DOMAINS[name]
    conn = connect(built[name])
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    total = sum(conn.execute(f"SELECT COUNT(*) FROM {t.name}").fetchone()[0] for t in d.tables)
    assert 300 <= total <= 6000
    nulls = dups = free_text = 0
    for t in d.tables:
        for c in t.columns:
            n_null, n, n_distinct = conn.execute(
                f"SELECT SUM({c.name} IS NULL), COUNT(*), COUNT(DISTINCT {c.name}) FROM {t.name}").fetchone()
            if not c.nullable:
                assert n_null == 0, (t.name, c.name)
            nulls += n_null
            if c.role in ("name", "category"):
                dups += n_distinct < n - n_null
            if c.role == "date":
                for (v,) in conn.execute(f"SELECT {c.name} FROM {t.name} WHERE {c.name} IS NOT NULL"):
                    assert ISO.match(v) and date.fromisoformat(v), (t.name, c.name, v)
            if c.role in ("text", "name"):
                free_text += conn.execute(
                    f"SELECT COUNT(*) FROM {t.name} WHERE {c.name} LIKE '% %'").fetchone()[0] > 0
        assert conn.execute(f"SELECT COUNT(*) FROM {t.name}").fetchone()[0] >= 3
    assert nulls > 0 and dups > 0 and free_text > 0
    assert any(c.role == "date" for t in d.tables for c in t.columns)


def test_codes_cover_the_stored_values(built):
    for d in DOMAINS.values():
        conn = connect(built[d.name])
        for t in d.tables:
            for c in t.columns:
                if c.codes:
                    stored = {v for (v,) in conn.execute(f"SELECT DISTINCT {c.name} FROM {t.name}")} - {None}
                    assert stored <= {code for code, _ in c.codes}, (t.name, c.name, stored)
    assert any(c.codes for d in DOMAINS.values() for t in d.tables for c in t.columns)


def test_scale_changes_row_counts(tmp_path):
    small = build_domain_db("clinic", str(tmp_path / "s.sqlite"), seed=0, scale=0.25)
    big = build_domain_db("clinic", str(tmp_path / "b.sqlite"), seed=0, scale=1.0)
    count = lambda p: connect(p).execute("SELECT COUNT(*) FROM appointments").fetchone()[0]  # noqa: E731
    assert count(small) < count(big)
    assert connect(small).execute("PRAGMA foreign_key_check").fetchall() == []


def test_bad_input_is_rejected_with_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown domain 'nope'"):
        build_domain_db("nope", str(tmp_path / "x.sqlite"))
    with pytest.raises(ValueError, match="unknown domain"):
        get_domain("")
    with pytest.raises(ValueError, match="scale must be > 0"):
        build_domain_db("library", str(tmp_path / "x.sqlite"), scale=0)
    assert not (tmp_path / "x.sqlite").exists()
    with pytest.raises(ValueError, match="role 'weird'"):
        Column("x", "x", "weird")
    with pytest.raises(ValueError, match="primary key column 'y'"):
        Table("t", "t", "ts", (Column("x", "x", "id"),), ("y",))
