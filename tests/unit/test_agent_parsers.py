"""The hermes tool-call parser: valid calls, and every malformed case as a message (never a raise)."""

from __future__ import annotations

import json

import pytest

from sqlrl.agent import PARSERS, HermesParser, get_parser

P = PARSERS["hermes"]


def call(name="execute_sql", arguments=None, **extra) -> str:
    body = {"name": name, "arguments": {"sql": "SELECT 1"} if arguments is None else arguments}
    body.update(extra)
    return f"<tool_call>\n{json.dumps(body)}\n</tool_call>"


def test_valid_call_with_reasoning_before_it():
    turn = P.parse("I will count the rows.\n" + call(arguments={"sql": "SELECT count(*) FROM t"}) + "\n")
    assert turn.ok and turn.errors == ()
    assert turn.content == "I will count the rows."
    (c,) = turn.calls
    assert c.name == "execute_sql" and c.arguments == {"sql": "SELECT count(*) FROM t"}


def test_submit_and_arguments_given_as_json_string():
    turn = P.parse('<tool_call>{"name": "submit_solution", "arguments": "{\\"sql\\": \\"SELECT 2\\"}"}'
                   "</tool_call>")
    assert turn.ok and turn.calls[0].name == "submit_solution"
    assert turn.calls[0].arguments == {"sql": "SELECT 2"} and turn.content == ""


@pytest.mark.parametrize("text, message", [
    ("The answer is 42.", "no tool call found: every turn must call exactly one tool"),
    ("", "no tool call found"),
    ("<tool_call>{not json}</tool_call>", "the tool call is not valid JSON"),
    ("<tool_call>" + "[" * 100000 + "</tool_call>", "the tool call is not valid JSON"),
    ("<tool_call>   </tool_call>", "the tool call is empty"),
    ('<tool_call>["execute_sql", "SELECT 1"]</tool_call>', "must be a JSON object"),
    ('<tool_call>"SELECT 1"</tool_call>', "got string"),
    ('<tool_call>{"arguments": {"sql": "SELECT 1"}}</tool_call>', "the tool call has no 'name'"),
    ('<tool_call>{"name": "execute_sql"}</tool_call>', "the tool call has no 'arguments'"),
    (call(id="c1"), "unexpected key(s) 'id'; it takes only 'name' and 'arguments'"),
    (call(name="drop_database"), "unknown tool 'drop_database'; available tools: execute_sql, submit_solution"),
    (call(arguments={}), "execute_sql is missing the required argument 'sql'"),
    (call(arguments={"sql": "SELECT 1", "db": "x"}), "got unexpected argument(s) 'db'; it takes only 'sql'"),
    (call(arguments={"sql": 7}), "the argument 'sql' of execute_sql must be a string, got number"),
    (call(arguments=["SELECT 1"]), "must be a JSON object like"),
    (call(arguments={"sql": "  "}), "the argument 'sql' of execute_sql is empty"),
    (call(name="submit_solution", arguments={"sql": ""}), "the argument 'sql' of submit_solution is empty"),
    ('<tool_call>{"name": "execute_sql", "arguments": {"sql": "SELECT 1"}}', "is not closed with </tool_call>"),
    ('{"name": "execute_sql"}</tool_call>', "without a matching <tool_call>"),
    ("</tool_call> oops <tool_call>", "found </tool_call> before <tool_call>"),
    (call() + "\nNow I wait for the result, which should be 1.", "text after </tool_call> is not allowed"),
    (call() + call(name="submit_solution"), "only one tool call per turn is allowed, found 2"),
    ("<tool_call><tool_call>" + call() , "only one tool call per turn is allowed"),
])
def test_malformed_turns_are_messages(text, message):
    turn = P.parse(text)
    assert not turn.ok and turn.calls == ()
    assert len(turn.errors) == 1 and message in turn.errors[0]
    assert turn.content == text  # the whole turn is kept


def test_messages_show_the_expected_syntax():
    (err,) = P.parse("SELECT 1").errors
    assert HermesParser.example in err
    assert json.loads(HermesParser.example.split("\n")[1])["name"] == "execute_sql"


def test_non_text_is_an_error_not_a_raise():
    turn = P.parse(None)  # type: ignore[arg-type]
    assert turn.errors == ("the turn is NoneType, not text",)


def test_registry():
    assert get_parser("hermes") is P
    with pytest.raises(KeyError, match="unknown tool-call parser 'xml'; known: hermes"):
        get_parser("xml")
