"""The PostgreSQL sandbox reads the parse tree (the parser's decoded names) only where escapes can
make a decoded name differ from the written one (``postgresql_lex.denial``), so the verdicts are
the same as when it read the tree on every call: names hidden behind ``U&`` (with or without
``UESCAPE``) or ``E''`` escapes are still found, and the ``pg_catalog`` names the grammar itself
inserts (casts, EXTRACT, SUBSTRING) refuse nothing. No server needed.
"""

from __future__ import annotations

import pytest

from sqlrl.db.dialects.postgresql_lex import denial, lex, streamable

HIDDEN = [
    'SELECT U&"pg\\005fread\\005ffile"(\'/etc/passwd\')',
    'SELECT U&"pg!005fread!005ffile" UESCAPE \'!\'(\'/etc/passwd\')',
    'SELECT U&"set!005fconfig" UESCAPE \'!\' (\'a\', \'b\', false)',
    'SET U&"statement!005ftimeout" UESCAPE \'!\' = 0',
    "SELECT current_setting(E'standard\\x5fconforming\\x5fstrings')",
    'SELECT "PG_READ_FILE"(\'x\'), pg_read_file(\'y\')',
]
PLAIN = [
    "SELECT CAST(price AS int), EXTRACT(year FROM placed), SUBSTRING(name FROM 1 FOR 3) FROM t",
    "SELECT price::numeric(10, 2), name LIKE 'a%' ESCAPE '!' FROM t",
    "SELECT overlay(name placing 'x' from 2), position('a' in name), trim(both from name) FROM t",
]
ESCAPED = ["SELECT 'a&b' AS amp, E'tab\\there' AS esc, U&\"c\\0061t\" FROM t"]  # no denied name


@pytest.mark.parametrize("sql", HIDDEN)
def test_names_behind_escapes_are_still_refused(sql):
    assert denial(lex(sql)) is not None, sql


@pytest.mark.parametrize("sql", PLAIN)
def test_grammar_inserted_catalog_names_refuse_nothing(sql):
    statement = lex(sql)
    assert statement.kind == "SelectStmt" and "pg_catalog" in statement.node
    assert denial(statement) is None, sql
    assert streamable(sql)


@pytest.mark.parametrize("sql", ESCAPED)
def test_escapes_without_a_denied_name_refuse_nothing(sql):
    assert denial(lex(sql)) is None, sql


@pytest.mark.parametrize("sql", ["SELECT * FROM t FOR UPDATE", "SELECT 1 INTO x",
                                 "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
                                 "WITH i AS (INSERT INTO t VALUES (1) RETURNING *) TABLE i",
                                 "WITH u AS (UPDATE t SET a = 1 RETURNING *) SELECT * FROM u",
                                 "SELECT * FROM t FOR SHARE"])
def test_statements_a_cursor_cannot_hold_are_not_streamed(sql):
    assert not streamable(sql)
