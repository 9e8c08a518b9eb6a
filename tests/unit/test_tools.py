"""Tool schemas, validation messages, and running tools on a real SQLite session."""

import json

import pytest

from sqlrl.db import Limits, open_session
from sqlrl.tools import TOOLS, ToolCallError, run_raw, run_tool, tool_schemas, validate_call


def test_schemas_are_openai_function_schemas():
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == ["execute_sql", "submit_solution"]
    for s in schemas:
        assert set(s) == {"type", "function"} and s["type"] == "function"
        assert set(s["function"]) == {"name", "description", "parameters"}
        params = s["function"]["parameters"]
        assert params["type"] == "object" and params["required"] == ["sql"]
        assert params["additionalProperties"] is False
        assert params["properties"]["sql"]["type"] == "string"
        json.dumps(s)
    assert TOOLS["submit_solution"].final and not TOOLS["execute_sql"].final
    with pytest.raises(KeyError, match="unknown tool"):
        tool_schemas(["drop_database"])


@pytest.mark.parametrize("name, arguments, message", [
    ("drop_db", {"sql": "x"}, "unknown tool 'drop_db'; available tools: execute_sql, submit_solution"),
    (None, {"sql": "x"}, "unknown tool None"),
    ("execute_sql", '{"sql": ', "the arguments of execute_sql are not valid JSON"),
    ("execute_sql", ["SELECT 1"], "must be a JSON object like {\"sql\": \"SELECT ...\"}, got array"),
    ("execute_sql", "42", "must be a JSON object like {\"sql\": \"SELECT ...\"}, got number"),
    ("execute_sql", {}, "execute_sql is missing the required argument 'sql'"),
    ("execute_sql", {"sql": "SELECT 1", "db": "x"}, "got unexpected argument(s) 'db'; it takes only 'sql'"),
    ("submit_solution", {"sql": 5}, "the argument 'sql' of submit_solution must be a string, got number"),
    ("execute_sql", {"sql": None}, "must be a string, got null"),
    ("execute_sql", {"sql": "   "}, "the argument 'sql' of execute_sql is empty"),
])
def test_invalid_calls_have_clear_messages(name, arguments, message):
    with pytest.raises(ToolCallError) as info:
        validate_call(name, arguments)
    assert message in str(info.value)


def test_valid_calls_accept_objects_and_json_strings():
    a = validate_call("execute_sql", {"sql": "SELECT 1"}, call_id="c1")
    b = validate_call("execute_sql", '{"sql": "SELECT 1"}')
    assert a.arguments == b.arguments == {"sql": "SELECT 1"} and a.call_id == "c1"


def test_execute_sql_on_a_real_session(demo_db_path):
    with open_session(f"sqlite:///{demo_db_path}", limits=Limits(max_rows=5)) as s:
        out = run_tool(validate_call("execute_sql", {"sql": "SELECT count(*) AS n FROM orders"}), s)
        assert out.observation == "n\n300\n(1 row)" and not out.is_error and not out.is_final
        assert out.result.rows == ((300,),)
        out = run_raw("execute_sql", {"sql": "CREATE TEMP TABLE t AS SELECT 1 AS x"}, s)
        assert out.observation == "OK"
        out = run_raw("execute_sql", {"sql": "UPDATE orders SET status = 'x' WHERE order_id <= 2"}, s)
        assert out.observation == "OK (2 rows affected)"
        out = run_raw("execute_sql", {"sql": "SELECT order_id FROM orders ORDER BY order_id"}, s)
        assert out.observation.endswith("(first 5 rows shown; the result has more than 5 rows)")
        out = run_raw("execute_sql", {"sql": "SELECT nope FROM orders"}, s)
        assert out.is_error and out.observation == "Error (runtime): no such column: nope"


def test_submit_solution_records_without_executing(demo_db_path):
    with open_session(f"sqlite:///{demo_db_path}") as s:
        out = run_raw("submit_solution", {"sql": "DELETE FROM orders"}, s, call_id="z")
        assert out.is_final and not out.is_error and out.submitted_sql == "DELETE FROM orders"
        assert out.observation == "Solution submitted." and out.call.call_id == "z"
        assert s.execute("SELECT count(*) FROM orders").rows == ((300,),)


def test_invalid_calls_become_error_observations(demo_db_path):
    with open_session(f"sqlite:///{demo_db_path}") as s:
        out = run_raw("execute_sql", '{"query": "SELECT 1"}', s)
        assert out.is_error and out.call is None and not out.is_final
        assert out.observation.startswith("Error (tool call): execute_sql is missing")
