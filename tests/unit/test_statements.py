import pytest

from sqlrl.db.statements import is_blank, leading_keywords, split_statements


@pytest.mark.parametrize("sql, expected", [
    ("SELECT 1", ["SELECT 1"]),
    ("SELECT 1;", ["SELECT 1"]),
    ("  SELECT 1 ;  ;; ", ["SELECT 1"]),
    ("SELECT 1; SELECT 2", ["SELECT 1", "SELECT 2"]),
    ("SELECT 'a;b'; SELECT 2", ["SELECT 'a;b'", "SELECT 2"]),
    ('SELECT "x;y" FROM t', ['SELECT "x;y" FROM t']),
    ("SELECT 1 -- c; d\n; SELECT 2", ["SELECT 1 -- c; d", "SELECT 2"]),
    ("/* a; b */ SELECT 1", ["/* a; b */ SELECT 1"]),
    ("", []),
    (" ; -- only a comment", []),
])
def test_split_sqlite(sql, expected):
    assert split_statements(sql, "sqlite") == expected


def test_split_postgres_dollar_quotes():
    sql = "CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql; SELECT f()"
    assert split_statements(sql, "postgres") == [
        "CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql", "SELECT f()"]


def test_unreadable_text_is_one_statement_for_the_database_to_reject():
    assert split_statements("SELECT 1; SELECT 'unterminated", "sqlite") == [
        "SELECT 1; SELECT 'unterminated"]


def test_leading_keywords_skip_comments():
    assert leading_keywords("-- hi\n /* x */ start transaction", 2) == ("START", "TRANSACTION")
    assert leading_keywords("") == ()
    assert is_blank("-- x\n/* y */ ") and not is_blank("-- x\nSELECT 1")
