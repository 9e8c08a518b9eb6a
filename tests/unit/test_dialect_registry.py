"""The dialect axis has one place to edit: the engines' descriptors (``sqlrl/db/dialects/``).

These tests fail when a production module outside that folder keeps a per-dialect map or branch
of its own (``dialect_guard.py`` says what counts), check the guard itself on planted code, and
check that every built-in engine's adapter is the one its descriptor names. test_fake_dialect.py shows a
test-only engine working everywhere with nothing else edited."""

from __future__ import annotations

import pytest

from sqlrl.db.dialects import get_dialect
from sqlrl.db.dialects.descriptor import COMMON_RESERVED, by_sqlglot, dialect_of, dialects, names

from .dialect_guard import Finding, find_in_production, find_in_source

# Per-dialect code that may stay where it is, and why.
ALLOWED = {
    ("sqlrl/synth/bug_syntax.py", "_DIALECT_RULES_LIST"):
        "a catalogue of SQL constructs borrowed from other dialects (facts about SQL, keyed by "
        "sqlglot name), not about sqlrl's engines: an engine without rules gets no wrong_dialect "
        "bugs and needs no entry",
}


def problems(findings: list[Finding]) -> list[str]:
    """What the production check reports: findings not allowed, and allowed entries now stale."""
    keys = {(f.path, f.scope) for f in findings}
    out = [str(f) for f in findings if (f.path, f.scope) not in ALLOWED]
    out += [f"stale allow-list entry (nothing found there any more): {k}"
            for k in sorted(ALLOWED.keys() - keys)]
    return out


def test_no_production_module_keeps_per_dialect_knowledge() -> None:
    found = problems(find_in_production())
    assert not found, ("per-dialect knowledge outside sqlrl/db/dialects/: read the engine's "
                       "descriptor (sqlrl.db.dialects.descriptor) instead\n" + "\n".join(found))


PLANTED = '''
QUOTES = {"sqlite": '"', "mysql": "`"}
def render(dialect):
    if dialect == "mysql":
        return 1
    if dialect in ("postgres", "tsql"):
        return 2
    match dialect:
        case "MariaDB":
            return 3
'''


def test_the_guard_finds_planted_maps_and_branches() -> None:
    found = find_in_source(PLANTED, "sqlrl/planted.py")
    assert [(f.scope, f.line, f.kind) for f in found] == [
        ("QUOTES", 2, "map"), ("render", 4, "branch"), ("render", 6, "branch"),
        ("render", 9, "branch")]
    assert any("planted.py:2 [QUOTES] per-dialect map" in p
               for p in problems(find_in_production() + found))


def test_the_guard_leaves_data_alone() -> None:
    clean = '''
def f(sql, dialect="sqlite", urls=None):
    catalog = {"shop": {"sqlite": "sqlite:///shop.sqlite"}}
    sqlglot.transpile(sql, read="sqlite", write="mysql")
    return urls["sqlite"], dialect == SOURCE_DIALECT, {"sqlite": 1, "other": 2}
'''
    assert find_in_source(clean) == []


BUILTINS = ("sqlite", "postgresql", "mysql", "mssql", "oracle")  # engines.py's; an engine added there is not one


def test_every_builtin_engine_has_an_adapter_named_by_its_descriptor() -> None:
    for engine in [d for d in dialects() if d.name in BUILTINS]:
        adapter = get_dialect(engine.name)  # the unverified engines' drivers are installed here
        assert type(adapter).__module__ == engine.adapter
        assert (adapter.name, adapter.sqlglot_dialect) == (engine.name, engine.sqlglot)
        assert by_sqlglot(engine.sqlglot) is engine


def test_lookups_and_identifiers() -> None:
    assert names()[:len(BUILTINS)] == BUILTINS  # the built-ins first, in engines.py's order
    assert [dialect_of(a).name for a in ("MariaDB", " pg ", "SQL Server", "tsql", "oracle")] == [
        "mysql", "postgresql", "mssql", "mssql", "oracle"]
    with pytest.raises(ValueError, match="unknown dialect 'db2'; known: sqlite, postgresql"):
        dialect_of("db2")
    mysql, mssql, sqlite = dialect_of("mysql"), dialect_of("mssql"), dialect_of("sqlite")
    assert COMMON_RESERVED < mysql.keywords and "DIV" in mysql.keywords  # sqlglot's MySQL words
    assert "DIV" not in sqlite.keywords and "TOP" in mssql.keywords
    assert [e.identifier("order") for e in (sqlite, mysql, mssql)] == ['"order"', "`order`", "[order]"]
    assert mssql.quote("a]b") == "[a]]b]" and sqlite.identifier("plain_1") == "plain_1"
    assert sqlite.identifier("1x") == '"1x"' and sqlite.identifier("a b") == '"a b"'
