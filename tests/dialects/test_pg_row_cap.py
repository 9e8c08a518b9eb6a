"""PostgreSQL's row-size check (issue 46, case 4) measures what is sent, and only with the server's
own functions.

A streamed query's rows are measured on the server before they are sent (``_ROW_CAP`` in
``sqlrl/db/dialects/postgresql.py``); a row longer than ``postgresql_wrap.row_bytes`` (here
``Limits.max_bytes`` itself: 64 KiB is the floor) ends the call with a ``runtime`` error, so it
never reaches libpq. Attacked here, with the text filter on and off:

- values whose STORED size is far below their text (``pg_column_size`` passed them): a compressed
  string in a table (``TABLE t`` too), a record nested in records (its quoting doubles at every
  level), a bytea (hex output), an int array, a composite type full of quotes;
- the session's own ``pg_column_size``/``octet_length``/``<=`` put ahead of ``pg_catalog`` on
  its ``search_path`` (an unqualified check called them);
- every query shape the wrapper must hold: ``row(...)``, arrays, JSON, ``VALUES``, CTEs,
  set-returning functions in the select list, a column named like the wrapper's own alias;
and rows under the cap still come back whole.
"""

from __future__ import annotations

import os

import pytest

from sqlrl.db import ErrorKind, Limits, open_session
from tests.conftest import sealed_base
from tests.dialects.server_cases import PG_BASE_SQL, ok

pytestmark = pytest.mark.postgres

PID = os.getpid()
CAP = 64 * 1024  # max_bytes of every session here: each wide value below is 1.2x to 50x of it
LIMITS = Limits(max_bytes=CAP, timeout_s=20)


@pytest.fixture(scope="module")
def url(pg_admin_url):
    for _, session_url in sealed_base(pg_admin_url, f"sqlrl_rowcap_{PID}", PG_BASE_SQL):
        yield session_url


def too_wide(result, context):
    assert result.error is not None and result.error.kind is ErrorKind.RUNTIME, (context, result)
    assert "more than the byte limit on one row" in result.error.message, (context, result)
    assert result.rows == (), (context, result)


# stored size (what pg_column_size measured) well under CAP, text well over it
SMALL_STORED_WIDE_TEXT = {
    "compressed string in a table": ("CREATE TABLE t AS SELECT repeat('x', 3000000) AS v",
                                     "SELECT v FROM t"),
    "TABLE of it": ("CREATE TABLE t AS SELECT 1 AS id, repeat('ab', 1500000) AS v", "TABLE t"),
    "nested records": (None, "SELECT " + "ROW(" * 12 + "repeat('\"', 64)" + ")" * 12),
    "bytea as hex": (None, "SELECT decode(repeat('00', 40000), 'hex')"),
    "int array": (None, "SELECT array_fill(-2147483648, ARRAY[10000])"),
    "composite type of quotes": ("CREATE TYPE pair AS (a text, b text)",
                                 "SELECT ROW(repeat('\"', 40000), 'b')::pair"),
}


@pytest.mark.parametrize("case", sorted(SMALL_STORED_WIDE_TEXT))
def test_a_row_is_measured_by_its_text_not_its_stored_size(url, text_filter, case):
    setup, query = SMALL_STORED_WIDE_TEXT[case]
    with open_session(url, limits=LIMITS) as s:
        if setup:
            ok(s.execute(setup))
        # what the stored-size check (the wrapper before) measured, and let through
        stored = ok(s.execute(f"SELECT pg_column_size(r.*) FROM (SELECT * FROM ({query}) q "
                              "OFFSET 0) r")).rows[0][0]
        assert stored < CAP, (case, stored)
        too_wide(s.execute(query), case)
        assert ok(s.execute("SELECT count(*) FROM orders")).rows == ((60,),)  # the session goes on


SHADOWS = {
    "pg_column_size": ["CREATE FUNCTION public.pg_column_size(record) RETURNS int "
                       "LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN RETURN 1; END $$"],
    "octet_length": ["CREATE FUNCTION public.octet_length(text) RETURNS int "
                     "LANGUAGE sql IMMUTABLE AS 'SELECT 1'"],
    "<=": ["CREATE FUNCTION public.yes(int, int) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT true'",
           "CREATE OPERATOR public.<= (LEFTARG = int, RIGHTARG = int, FUNCTION = public.yes)"],
    "+": ["CREATE FUNCTION public.zero(int, bigint) RETURNS bigint LANGUAGE sql IMMUTABLE "
          "AS 'SELECT 0::bigint'",
          "CREATE OPERATOR public.+ (LEFTARG = int, RIGHTARG = bigint, FUNCTION = public.zero)"],
    "text cast": ["CREATE FUNCTION public.text(record) RETURNS text "
                  "LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN RETURN 'x'; END $$"],
}


@pytest.mark.parametrize("name", sorted(SHADOWS))
def test_the_sessions_own_functions_and_operators_are_never_called(url, text_filter, name):
    with open_session(url, limits=LIMITS) as s:
        for ddl in SHADOWS[name]:
            ok(s.execute(ddl))
        ok(s.execute("SET search_path = public, pg_catalog"))
        too_wide(s.execute("SELECT repeat('x', 200000)"), name)
        assert ok(s.execute("SELECT name FROM customers WHERE id = 1")).rows == (("customer 1",),)


WIDE_SHAPES = [
    "SELECT row(repeat('x', 100000), 1)",
    "SELECT ARRAY[repeat('x', 50000), repeat('y', 50000)]",
    "SELECT json_agg(repeat('x', 1000)) FROM generate_series(1, 100)",
    "SELECT to_jsonb(repeat('x', 100000))",
    "VALUES (1, repeat('x', 100000))",
    "WITH w AS (SELECT repeat('x', 100000) AS v) SELECT * FROM w",
    "SELECT generate_series(1, 3), repeat('x', 100000)",
    "SELECT 1 AS sqlrl_r, 2 AS sqlrl_q, repeat('x', 100000) AS v",
    "SELECT string_agg(repeat('x', 1000), '') FROM generate_series(1, 150)",
    "SELECT c.name, repeat(c.name, 20000) FROM customers c ORDER BY c.id LIMIT 1",
    "SELECT repeat('x', 100000) OFFSET 0",  # its own OFFSET: the two-level barrier
    "SELECT repeat('x', 100000) FROM customers ORDER BY id LIMIT 2 OFFSET 1",
    "(SELECT repeat('x', 100000) LIMIT 1)",
    "SELECT repeat('x', 100000) -- a comment to the end of the line",
]


@pytest.mark.parametrize("query", WIDE_SHAPES)
def test_every_query_shape_is_checked(url, text_filter, query):
    with open_session(url, limits=LIMITS) as s:
        too_wide(s.execute(query), query)


def test_rows_under_the_cap_come_back_whole(url, text_filter):
    with open_session(url, limits=LIMITS) as s:
        r = ok(s.execute("SELECT g, repeat('x', 1000) FROM generate_series(1, 10) g"))
        assert [len(v) for _, v in r.rows] == [1000] * 10
        assert ok(s.execute("SELECT 1 AS sqlrl_r, 'a' AS sqlrl_q")).rows == ((1, "a"),)
        r = ok(s.execute("SELECT id, name FROM customers WHERE id <= 3 ORDER BY id"))
        assert r.columns == ("id", "name") and len(r.rows) == 3
        # the row's text is the value plus the record's parentheses: CAP - 1 is one byte over
        assert len(ok(s.execute(f"SELECT repeat('x', {CAP - 100})")).rows[0][0]) == CAP - 100
        too_wide(s.execute(f"SELECT repeat('x', {CAP - 1})"), "one byte over")


QUERY_OVERFLOWS = {  # the check's own error is an int4 + int8 overflow: these are the query's
    "int8 + int8, folded when planned": "SELECT 9223372036854775807 + 1",
    "int8 * int8, per row": "SELECT x * 2 FROM (VALUES (9223372036854775807)) v(x)",
    "int4 + int4": "SELECT x + 1 FROM (VALUES (2147483647)) v(x)",
}


@pytest.mark.parametrize("case", sorted(QUERY_OVERFLOWS))
def test_a_querys_own_overflow_is_not_reported_as_a_wide_row(url, text_filter, case):
    with open_session(url, limits=LIMITS) as s:
        r = s.execute(QUERY_OVERFLOWS[case])
        assert r.error is not None and r.error.kind is ErrorKind.RUNTIME, (case, r)
        assert "out of range" in r.error.message and "byte limit" not in r.error.message, (case, r)
        assert ok(s.execute("SELECT count(*) FROM orders")).rows == ((60,),)


ERRORS_ECHOING_TEXT = [  # the server quotes the offending line: the user's, never the wrapper's
    "SELECT nosuch FROM customers",
    "SELECT id FROM customers WHERE name + 1 > 0",
    "SELECT id\nFROM customers\nWHERE nosuch = 1",
]


@pytest.mark.parametrize("query", ERRORS_ECHOING_TEXT)
def test_errors_quote_the_query_not_the_wrapper(url, text_filter, query):
    with open_session(url, limits=LIMITS) as s:
        r = s.execute(query)
        assert r.error is not None, (query, r)
        message = r.error.message
        assert "sqlrl_" not in message and "OFFSET 0" not in message, message
        assert "octet_length" not in message and "DECLARE" not in message, message
        line = int(message.split("LINE ")[1].split(":")[0])
        assert line == query.count("\n") + 1, message  # the line of the user's own text


BARRIER_CASES = {  # keep() is costlier than the check: without a barrier it would run second
    "one level (no OFFSET: OFFSET 0 appended)":
        "SELECT id, v FROM (VALUES (1, repeat('x', 100000)), (2, 'y')) t(id, v) WHERE keep(id)",
    "two levels (an OFFSET in a nested query)":
        "SELECT id, v FROM (VALUES (1, repeat('x', 100000)), (2, 'y')) t(id, v) "
        "WHERE keep(id) AND id IN (SELECT 2 OFFSET 0)",
}


@pytest.mark.parametrize("case", sorted(BARRIER_CASES))
def test_rows_the_query_filters_out_are_never_measured(url, text_filter, case):
    with open_session(url, limits=LIMITS) as s:
        ok(s.execute("CREATE FUNCTION keep(id int) RETURNS bool LANGUAGE plpgsql IMMUTABLE "
                     "COST 1000000 AS $$ BEGIN RETURN id = 2; END $$"))
        assert ok(s.execute(BARRIER_CASES[case])).rows == ((2, "y"),), case


QUERY_FORMS = {  # what the barrier is appended to or wrapped around: each query's rows, unchanged
    "SELECT id FROM customers ORDER BY id LIMIT 3": ((1,), (2,), (3,)),
    "SELECT id FROM customers ORDER BY id FETCH FIRST 2 ROWS ONLY": ((1,), (2,)),
    "SELECT id FROM customers ORDER BY id LIMIT 2 OFFSET 1": ((2,), (3,)),
    "(SELECT id FROM customers ORDER BY id LIMIT 2)": ((1,), (2,)),
    "SELECT 1 UNION SELECT 2 ORDER BY 1": ((1,), (2,)),
    "VALUES (1), (2)": ((1,), (2,)),
    "WITH w AS (SELECT 1 AS a) SELECT a FROM w": ((1,),),
    "SELECT 1 -- a comment to the end of the line": ((1,),),
    "SELECT 'OFFSET 0) sqlrl_r' /* OFFSET 1 */": (("OFFSET 0) sqlrl_r",),),
    "SELECT id FROM customers WHERE id IN (SELECT id FROM customers ORDER BY id OFFSET 1) "
    "ORDER BY id LIMIT 2": ((2,), (3,)),
}


@pytest.mark.parametrize("query", sorted(QUERY_FORMS))
def test_query_forms_keep_their_rows(url, text_filter, query):
    with open_session(url, limits=LIMITS) as s:
        assert ok(s.execute(query)).rows == QUERY_FORMS[query], query
