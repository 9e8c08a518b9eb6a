"""Bug injectors (sqlrl.synth.bugs): each applies as intended, declines when it cannot,
keeps the query parseable (the syntax-error family must not parse nor execute), is deterministic."""

from __future__ import annotations

import random

import pytest
import sqlglot
from sqlglot.errors import SqlglotError

from sqlrl.db import ErrorKind, open_session
from sqlrl.synth.bugs import (BUGS, DIALECT_RULES, ColumnInfo, Mutation, SchemaInfo, applicable,
                                    categories, parse_sql, schema_from_url, sqlglot_dialect,
                                    type_class)

SHOP = {
    "customers": {"customer_id": "INTEGER", "name": "TEXT", "email": "TEXT", "city": "TEXT",
                  "joined": "DATE"},
    "products": {"product_id": "INTEGER", "name": "TEXT", "category": "TEXT", "price": "REAL",
                 "stock": "INTEGER"},
    "orders": {"order_id": "INTEGER", "customer_id": "INTEGER", "order_date": "DATE",
               "status": "TEXT"},
    "order_items": {"order_id": "INTEGER", "product_id": "INTEGER", "quantity": "INTEGER",
                    "unit_price": "REAL"},
    "delivered_orders": {"order_id": "INTEGER", "customer_id": "INTEGER", "order_date": "DATE",
                         "status": "TEXT"},
}
# A tiny schema where each injector has exactly one way to apply, so outcomes are exact.
TINY = {"t": {"a": "INTEGER", "b": "INTEGER", "s": "TEXT"}, "u": {"a": "INTEGER", "k": "INTEGER"}}


def inject(name: str, sql: str, schema: dict = TINY, dialect: str = "sqlite", seed: int = 0
           ) -> Mutation | None:
    info = SchemaInfo.from_mapping(schema, dialect)
    return BUGS[name].inject(parse_sql(sql, dialect), info, random.Random(seed))


# (injector, query, the only acceptable buggy SQLs)
EXACT = [
    ("wrong_column", "SELECT s FROM t WHERE a > 1", {"SELECT s FROM t WHERE b > 1"}),
    ("wrong_table", "SELECT a FROM t", {"SELECT a FROM u"}),
    ("wrong_join_key", "SELECT t.s FROM t JOIN u ON t.a = u.a",
     {"SELECT t.s FROM t JOIN u ON t.b = u.a", "SELECT t.s FROM t JOIN u ON t.a = u.k"}),
    ("missing_group_by", "SELECT s, COUNT(*) FROM t GROUP BY s", {"SELECT s, COUNT(*) FROM t"}),
    ("missing_group_by", "SELECT s, b, COUNT(*) FROM t GROUP BY s, b",
     {"SELECT s, b, COUNT(*) FROM t GROUP BY s", "SELECT s, b, COUNT(*) FROM t GROUP BY b"}),
    ("off_by_one", "SELECT s FROM t WHERE a > 10",
     {"SELECT s FROM t WHERE a >= 10", "SELECT s FROM t WHERE a > 9", "SELECT s FROM t WHERE a > 11"}),
    ("off_by_one", "SELECT s FROM t WHERE a <= 3",
     {"SELECT s FROM t WHERE a < 3", "SELECT s FROM t WHERE a <= 2", "SELECT s FROM t WHERE a <= 4"}),
    ("wrong_aggregate", "SELECT MAX(a) FROM t", {"SELECT MIN(a) FROM t"}),
    ("wrong_aggregate", "SELECT AVG(a) FROM t", {"SELECT SUM(a) FROM t"}),
    ("wrong_aggregate", "SELECT COUNT(DISTINCT a) FROM t", {"SELECT COUNT(a) FROM t"}),
    ("wrong_aggregate", "SELECT COUNT(a) FROM t",
     {"SELECT SUM(a) FROM t", "SELECT COUNT(DISTINCT a) FROM t"}),
    ("wrong_aggregate", "SELECT SUM(a) FROM t", {"SELECT COUNT(a) FROM t", "SELECT AVG(a) FROM t"}),
    ("distinct_drop", "SELECT DISTINCT s FROM t", {"SELECT s FROM t"}),
    ("distinct_add", "SELECT s FROM t", {"SELECT DISTINCT s FROM t"}),
    ("order_direction", "SELECT s FROM t ORDER BY a DESC", {"SELECT s FROM t ORDER BY a ASC"}),
    ("order_direction", "SELECT s FROM t ORDER BY a", {"SELECT s FROM t ORDER BY a DESC"}),
    ("order_column", "SELECT s FROM u JOIN t ON t.a = u.a ORDER BY u.k",
     {"SELECT s FROM u JOIN t ON t.a = u.a ORDER BY u.a"}),
    ("null_comparison", "SELECT a FROM t WHERE s IS NULL", {"SELECT a FROM t WHERE s = NULL"}),
    ("null_comparison", "SELECT a FROM t WHERE s IS NOT NULL", {"SELECT a FROM t WHERE s <> NULL"}),
    ("join_type", "SELECT t.s FROM t JOIN u ON t.a = u.a",
     {"SELECT t.s FROM t LEFT JOIN u ON t.a = u.a"}),
    ("join_type", "SELECT t.s FROM t LEFT JOIN u ON t.a = u.a",
     {"SELECT t.s FROM t JOIN u ON t.a = u.a"}),
    ("missing_join_condition", "SELECT t.s FROM t JOIN u ON t.a = u.a", {"SELECT t.s FROM t, u"}),
    ("wrong_logic", "SELECT s FROM t WHERE a = 1 AND b = 2", {"SELECT s FROM t WHERE a = 1 OR b = 2"}),
    ("syntax_missing_comma", "SELECT s, COUNT(*) FROM t GROUP BY s",
     {"SELECT s COUNT(*) FROM t GROUP BY s"}),
    ("syntax_unbalanced_paren", "SELECT COUNT(*) FROM t",
     {"SELECT COUNT(* FROM t", "SELECT COUNT*) FROM t"}),
    ("syntax_trailing_comma", "SELECT s, a FROM t", {"SELECT s, a, FROM t"}),
    ("wrong_dialect", "SELECT s FROM t ORDER BY a LIMIT 3", {"SELECT TOP 3 s FROM t ORDER BY a"}),
    ("wrong_dialect", "SELECT s FROM t WHERE s LIKE '%x%'", {"SELECT s FROM t WHERE s ILIKE '%x%'"}),
    ("wrong_dialect", "SELECT IFNULL(s, 'none') FROM t", {"SELECT ISNULL(s, 'none') FROM t"}),
    ("wrong_dialect", "SELECT LENGTH(s) FROM t", {"SELECT LEN(s) FROM t"}),
    ("wrong_dialect", "SELECT CAST(a AS REAL) FROM t", {"SELECT a::DOUBLE PRECISION FROM t"}),
    ("wrong_dialect", "SELECT STRFTIME('%Y', s) FROM t", {"SELECT DATE_FORMAT(s, '%Y') FROM t"}),
    ("wrong_dialect", "SELECT JULIANDAY(s) - JULIANDAY(s) FROM t", {"SELECT DATEDIFF(s, s) FROM t"}),
    ("wrong_dialect", "SELECT s FROM t WHERE a = (SELECT a FROM u ORDER BY k LIMIT 1)",
     {"SELECT s FROM t WHERE a = (SELECT TOP 1 a FROM u ORDER BY k)"}),
]


@pytest.mark.parametrize("name,sql,expected", EXACT, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(EXACT)])
def test_injector_applies_as_intended(name: str, sql: str, expected: set[str]) -> None:
    for seed in range(4):
        m = inject(name, sql, seed=seed)
        assert m is not None, f"{name} did not apply to {sql!r}"
        assert m.issue_sql in expected, (m.issue_sql, m.description)
        assert m.name == name and m.category == BUGS[name].category
        assert m.description and m.symptom


def test_misspelled_keyword_misspells_one_keyword() -> None:
    m = inject("syntax_misspelled_keyword", "SELECT s FROM t WHERE a > 1")
    assert m is not None
    words = m.issue_sql.split()
    assert len(words) == 8 and words[1] == "s" and words[3] == "t"
    assert sum(w not in ("SELECT", "s", "FROM", "t", "WHERE", "a", ">", "1") for w in words) == 1


@pytest.mark.parametrize("dialect,sql,expected", [
    ("postgresql", "SELECT COALESCE(s, 'x') FROM t",
     {"SELECT IFNULL(s, 'x') FROM t": "mysql", "SELECT COALESCE(`s`, 'x') FROM t": "mysql"}),
    ("postgresql", "SELECT s FROM t", {"SELECT `s` FROM t": "mysql"}),
    ("postgresql", "SELECT s FROM t LIMIT 2",
     {"SELECT TOP 2 s FROM t": "tsql", "SELECT `s` FROM t LIMIT 2": "mysql"}),
    ("mysql", "SELECT CAST(a AS CHAR) FROM t",
     {"SELECT a::CHAR FROM t": "postgres", 'SELECT CAST("a" AS CHAR) FROM t': "postgres"}),
    ("mysql", "SELECT s FROM t WHERE s LIKE 'a%'",
     {"SELECT s FROM t WHERE s ILIKE 'a%'": "postgres", """SELECT "s" FROM t WHERE s LIKE 'a%'""":
      "postgres", """SELECT s FROM t WHERE "s" LIKE 'a%'""": "postgres"}),
])
def test_wrong_dialect_per_target(dialect: str, sql: str, expected: dict[str, str]) -> None:
    seen = set()
    for seed in range(12):
        m = inject("wrong_dialect", sql, dialect=dialect, seed=seed)
        assert m is not None and m.issue_sql in expected, m
        assert m.parse_dialect == expected[m.issue_sql]
        sqlglot.parse_one(m.issue_sql, read=m.parse_dialect)
        seen.add(m.issue_sql)
    assert seen == set(expected)  # every applicable rule gets drawn


NOT_APPLICABLE = [
    ("wrong_column", "SELECT k FROM u", {"u": {"k": "INTEGER", "s": "TEXT"}}),  # no same-type sibling
    ("wrong_table", "SELECT a FROM t", {"t": {"a": "INTEGER"}}),  # the only table
    ("wrong_join_key", "SELECT a FROM t", TINY),
    ("missing_group_by", "SELECT COUNT(*) FROM t", TINY),
    ("off_by_one", "SELECT s FROM t WHERE s = 'x'", TINY),
    ("wrong_aggregate", "SELECT COUNT(*) FROM t", TINY),  # COUNT(*) has no SUM counterpart
    ("wrong_aggregate", "SELECT a FROM t", TINY),
    ("distinct_drop", "SELECT s FROM t", TINY),
    ("distinct_add", "SELECT COUNT(*) FROM t", TINY),  # one row: DISTINCT cannot change it
    ("distinct_add", "SELECT s FROM t GROUP BY s", TINY),
    ("order_direction", "SELECT s FROM t", TINY),
    ("order_column", "SELECT s, COUNT(*) AS n FROM t GROUP BY s ORDER BY n", TINY),
    ("null_comparison", "SELECT s FROM t WHERE a = 1", TINY),
    ("join_type", "SELECT s FROM t", TINY),
    ("missing_join_condition", "SELECT s FROM t", TINY),
    ("wrong_logic", "SELECT s FROM t WHERE a = 1", TINY),
    ("syntax_missing_comma", "SELECT s FROM t", TINY),
    ("syntax_unbalanced_paren", "SELECT s FROM t", TINY),
    ("syntax_trailing_comma", "SELECT 1", TINY),
    ("wrong_dialect", "SELECT s FROM t WHERE a = 1", TINY),
]


@pytest.mark.parametrize("name,sql,schema", NOT_APPLICABLE,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(NOT_APPLICABLE)])
def test_injector_declines_when_not_applicable(name: str, sql: str, schema: dict) -> None:
    assert inject(name, sql, schema) is None


CORPUS = [
    "SELECT c.city, COUNT(DISTINCT o.order_id) AS n FROM customers AS c JOIN orders AS o "
    "ON o.customer_id = c.customer_id WHERE o.status = 'delivered' AND c.email IS NOT NULL "
    "GROUP BY c.city ORDER BY n DESC LIMIT 3",
    "SELECT name, price FROM products WHERE price >= 100 AND stock < 10 ORDER BY price",
    "SELECT p.category, SUM(oi.quantity * oi.unit_price), AVG(p.price), MAX(p.price) FROM products "
    "AS p LEFT JOIN order_items AS oi ON oi.product_id = p.product_id GROUP BY p.category",
    "SELECT DISTINCT city FROM customers WHERE email IS NULL OR city LIKE 'L%'",
    "SELECT COUNT(*) FROM orders WHERE order_date BETWEEN '2021-01-01' AND '2021-12-31'",
    "SELECT name FROM customers WHERE customer_id IN (SELECT customer_id FROM orders "
    "WHERE status = 'cancelled') ORDER BY name LIMIT 5",
    "SELECT name, LENGTH(name) FROM products WHERE stock > (SELECT AVG(stock) FROM products)",
]


@pytest.fixture(scope="module")
def shop_schema() -> SchemaInfo:
    return SchemaInfo.from_mapping(SHOP)


def test_results_reparse_and_the_syntax_family_does_not_parse_nor_run(
        shop_schema: SchemaInfo, demo_db_path: str) -> None:
    seen: set[str] = set()
    with open_session(f"sqlite:///{demo_db_path}") as session:
        for sql in CORPUS:
            assert session.execute(sql).error is None, sql
            for seed in range(3):
                for name, m in applicable(parse_sql(sql, "sqlite"), shop_schema,
                                          random.Random(seed)).items():
                    seen.add(name)
                    if m.category == "syntax_error":
                        assert m.parse_dialect is None
                        if name != "syntax_trailing_comma":  # sqlglot tolerates trailing commas
                            with pytest.raises(SqlglotError):
                                sqlglot.parse_one(m.issue_sql, read="sqlite")
                        result = session.execute(m.issue_sql)
                        assert result.error is not None and result.error.kind is ErrorKind.SYNTAX, \
                            (m.issue_sql, result.error)
                    else:
                        assert m.parse_dialect is not None
                        sqlglot.parse_one(m.issue_sql, read=m.parse_dialect)  # raises if not
    assert seen == set(BUGS)  # the corpus exercises every injector


def test_inject_is_deterministic_and_leaves_the_input_alone(shop_schema: SchemaInfo) -> None:
    for sql in CORPUS:
        expr = parse_sql(sql, "sqlite")
        before = expr.sql()
        a = applicable(expr, shop_schema, random.Random(7))
        b = applicable(expr, shop_schema, random.Random(7))
        assert a == b
        assert expr.sql() == before
    # different seeds explore different mutations of the same query
    expr = parse_sql(CORPUS[0], "sqlite")
    outs = {BUGS["wrong_column"].inject(expr, shop_schema, random.Random(s)).issue_sql
            for s in range(20)}
    assert len(outs) > 3


def test_wrong_column_keeps_the_type_family(shop_schema: SchemaInfo) -> None:
    expr = parse_sql("SELECT price FROM products", "sqlite")
    outs = {BUGS["wrong_column"].inject(expr, shop_schema, random.Random(s)).issue_sql
            for s in range(30)}
    # price is REAL: only numeric siblings, never name/category (TEXT)
    assert outs == {"SELECT product_id FROM products", "SELECT stock FROM products"}


def test_wrong_table_prefers_a_table_with_the_same_columns(shop_schema: SchemaInfo) -> None:
    expr = parse_sql("SELECT status FROM orders WHERE order_date > '2022-01-01'", "sqlite")
    outs = {BUGS["wrong_table"].inject(expr, shop_schema, random.Random(s)).issue_sql
            for s in range(10)}
    assert outs == {"SELECT status FROM delivered_orders WHERE order_date > '2022-01-01'"}


def test_wrong_table_renames_qualifiers_of_unaliased_tables() -> None:
    m = inject("wrong_table", "SELECT t.a FROM t WHERE t.a > 1", {"t": {"a": "INT"}, "v": {"a": "INT"}})
    assert m is not None and m.issue_sql == "SELECT v.a FROM v WHERE v.a > 1"


def test_registry_covers_the_required_categories() -> None:
    cats = categories()
    for required in ("wrong_column", "wrong_table", "wrong_join_key", "missing_group_by",
                     "off_by_one", "wrong_aggregate", "distinct", "order_by", "syntax_error",
                     "wrong_dialect", "null_comparison", "join_type", "missing_join_condition"):
        assert required in cats
    assert set(DIALECT_RULES) >= {"sqlite", "postgres", "mysql"}


def test_schema_from_url_reads_tables_views_and_types(demo_db_path: str) -> None:
    info = schema_from_url(f"sqlite:///{demo_db_path}")
    assert set(info.tables) == set(SHOP)
    # one schema model (tasks.schema): introspection also reads NOT NULL
    assert info.column("PRODUCTS", "Price") == ColumnInfo("price", "REAL", not_null=True)
    assert info.table("Orders") == "orders" and info.table("nope") is None
    assert info.columns("nope") == ()


def test_bad_input_gets_clear_errors() -> None:
    with pytest.raises(ValueError, match="cannot parse SQL"):
        parse_sql("SELEC FROM", "sqlite")
    with pytest.raises(ValueError, match="exactly one SQL statement"):
        parse_sql("SELECT 1; SELECT 2", "sqlite")
    with pytest.raises(ValueError, match="unknown dialect"):
        sqlglot_dialect("db2")
    with pytest.raises(ValueError, match="unknown dialect"):
        SchemaInfo.from_mapping(TINY, "db2")
    with pytest.raises(ValueError, match="not implemented for dialect 'mssql'"):
        schema_from_url("mssql+pyodbc://u:p@localhost/db")


def test_type_class() -> None:
    assert [type_class(t) for t in ("INTEGER", "varchar(20)", "DATE", "real", "", "blob", "bool")] \
        == ["number", "text", "time", "number", "any", "any", "number"]
