"""serve/streaming.py: one reading of a model's turn for finished and streamed answers. The
deltas streamed for every prefix of a text are never retracted and add up to exactly the
non-streaming answer -- checked on hand-written turns and on every prefix of random ones."""

from __future__ import annotations

import json
import random

import pytest

from serve.streaming import ChoiceStream, message, split_reply, visible

NAMES = ("get_weather", "execute_sql")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "P"}}\n</tool_call>'


def test_finished_turns():
    content, calls = split_reply(f"thinking\n{CALL}", NAMES)
    assert content == "thinking" and calls == [("get_weather", '{"city": "P"}')]
    assert split_reply(f"  {CALL}\n\n", NAMES) == ("", calls)  # whitespace around the call dropped
    text = f"thinking\n{CALL}"
    assert split_reply(text, ("other",)) == (text, [])  # an unrequested tool stays text
    assert split_reply(text, ()) == (text, [])  # no tools: nothing is parsed
    bad = "<tool_call>{bad json</tool_call> and"
    assert split_reply(bad, NAMES) == (bad, [])
    args_not_object = '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>'
    assert split_reply(args_not_object, NAMES) == (args_not_object, [])
    two = split_reply(f"a {CALL} b {CALL.replace('P', 'Q')} ", NAMES)
    assert two == ("ab", [("get_weather", '{"city": "P"}'), ("get_weather", '{"city": "Q"}')])
    assert split_reply("plain answer \n", NAMES) == ("plain answer \n", [])  # no calls: verbatim
    assert split_reply("x <tool_call>{unclosed", NAMES) == ("x <tool_call>{unclosed", [])
    msg = message("", [("get_weather", "{}")])
    assert msg["content"] is None and msg["tool_calls"][0]["id"].startswith("call_")
    assert message("hi", [])["content"] == "hi" and "tool_calls" not in message("hi", [])


def test_stop_strings_and_partial_characters():
    assert visible("abcSTOPdef", ("STOP",)) == ("abc", True)
    assert visible("abcST", ("STOP",), final=False) == ("abc", False)  # might become STOP
    assert visible("abcST", ("STOP",)) == ("abcST", False)  # finished: it did not
    assert visible("ab\ufffd", (), final=False) == ("ab", False)  # a character still incomplete


def stream(text: str, step: int, prefix: str = "", stops: tuple[str, ...] = ("STOP",),
           reason: str = "eos") -> tuple[str, list[dict], str, list[dict]]:
    """Feed text in steps of ``step`` characters; (content, calls, finish reason, all deltas)."""
    s = ChoiceStream(prefix, stops, NAMES)
    deltas = []
    for k in range(0, len(text), step):
        deltas += s.update(text[:k])
    last, reason = s.finish(text, reason)
    deltas += last
    content = "".join(d.get("content", "") for d in deltas)
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    return content, calls, reason, deltas


def expected(text: str, prefix: str = "", stops: tuple[str, ...] = ("STOP",)) -> tuple[str, list]:
    shown, _ = visible(prefix + text, stops)
    return split_reply(shown, NAMES)


@pytest.mark.parametrize("text", [
    f"Let me check.\n{CALL}", f"{CALL}\n", "Hello <tool", "Hello <tool_call>{bad}</tool_call> ok",
    f"a{CALL}STOP{CALL}", "no tools here  \n", "a <tool_call>\n{\"name\": \"execute_sql\", "
    "\"arguments\": {\"sql\": \"SELECT 1\"}}</tool_call>"])
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_streamed_deltas_add_up_to_the_finished_answer(text, step):
    content, calls, reason, _ = stream(text, step)
    want_content, want_calls = expected(text)
    assert content == want_content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == want_calls
    assert [c["index"] for c in calls] == list(range(len(calls)))
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert reason == ("tool_calls" if want_calls else "stop")


def test_forced_prefix_and_length_finish():
    # tool_choice named: the turn starts inside the call; the model writes the rest
    prefix = '<tool_call>\n{"name": "get_weather", "arguments": '
    content, calls, reason, _ = stream('{"city": "P"}}\n</tool_call>', 2, prefix=prefix)
    assert content == "" and calls[0]["function"]["arguments"] == '{"city": "P"}' and reason == "tool_calls"
    assert stream("abc", 1, reason="length")[2] == "length"
    assert stream("abSTOP", 1, reason="length")[2] == "stop"  # cut by a stop string, not by length


def test_no_delta_is_ever_retracted_on_random_turns():
    rng = random.Random(0)
    parts = ["a", "b", " ", "\n", "<", "tool", "<tool_call>", "</tool_call>", CALL, "{", "}", "ST", "OP",
             '{"name": "execute_sql", "arguments": {"sql": "x"}}', "\ufffd"]
    for _ in range(300):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 14)))
        prev_content, prev_calls = "", []
        for k in range(len(text) + 1):
            shown, stopped = visible(text[:k], ("STOP",), final=False)
            content, calls = split_reply(shown, NAMES, final=stopped)
            assert content.startswith(prev_content) and calls[:len(prev_calls)] == prev_calls, (text, k)
            prev_content, prev_calls = content, calls
        want = expected(text)
        assert want[0].startswith(prev_content) and want[1][:len(prev_calls)] == prev_calls, text
        content, calls, _, _ = stream(text, 1)
        assert (content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls]) == want, text


def test_arguments_are_json_strings():
    _, calls, _, _ = stream(f"{CALL}", 5)
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "P"}
