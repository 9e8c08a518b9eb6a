"""Golden strings for the one observation format."""

from sqlrl.db.types import ErrorKind, QueryError, QueryResult
from sqlrl.tools import format_observation, format_tool_error


def rs(columns, rows, truncated=False):
    return QueryResult(columns=tuple(columns), rows=tuple(map(tuple, rows)), row_count=len(rows),
                       truncated=truncated)


def test_small_table():
    assert format_observation(rs(["city", "n"], [("Oslo", 3), ("Lima", 1.5)])) == (
        "city | n\nOslo | 3\nLima | 1.5\n(2 rows)")


def test_single_row_and_empty_result():
    assert format_observation(rs(["x"], [(1,)])) == "x\n1\n(1 row)"
    assert format_observation(rs(["a", "b"], [])) == "a | b\n(0 rows)"


def test_nulls_newlines_and_unicode():
    assert format_observation(rs(["a", "b"], [(None, "line1\nline2"), ("ünï", True)])) == (
        "a | b\nNULL | line1\\nline2\nünï | True\n(2 rows)")


def test_long_cells_are_shortened():
    out = format_observation(rs(["t"], [("x" * 50,)]), max_cell_chars=10)
    assert out == "t\nxxxxxxxxx…\n(1 row)"


def test_display_cap():
    out = format_observation(rs(["i"], [(i,) for i in range(30)]), max_rows=3)
    assert out == "i\n0\n1\n2\n(first 3 of 30 rows shown)"


def test_session_cap():
    out = format_observation(rs(["i"], [(i,) for i in range(5)], truncated=True), max_rows=2)
    assert out == "i\n0\n1\n(first 2 rows shown; the result has more than 5 rows)"


def test_no_result_set():
    assert format_observation(QueryResult()) == "OK"
    assert format_observation(QueryResult(affected_rows=3)) == "OK (3 rows affected)"
    assert format_observation(QueryResult(affected_rows=1)) == "OK (1 row affected)"


def test_errors_of_each_kind():
    for kind in ErrorKind:
        r = QueryResult(error=QueryError(kind, "boom"))
        assert format_observation(r) == f"Error ({kind.value}): boom"
    r = QueryResult(error=QueryError(ErrorKind.SYNTAX, 'near "SELEC"', 2), statements=4)
    assert format_observation(r) == 'Error (syntax) in statement 3 of 4: near "SELEC"'


def test_total_length_cap_and_tool_errors():
    out = format_observation(rs(["c"], [("y" * 90,) for _ in range(20)]), max_chars=300)
    assert len(out) < 360 and out.endswith("… (output cut at 300 characters)")
    assert format_tool_error("unknown tool 'x'") == "Error (tool call): unknown tool 'x'"
