"""The tool chat template: rendering of tools, tool calls and tool responses, and prefix stability
(string and token level) with the tiny model's tokenizer (built once per session, ~10 s)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from sqlrl.policy.chat import DEFAULT_SYSTEM, TOOL_CHAT_TEMPLATE  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "execute_sql", "description": "Run one SQL query.",
    "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]}}}]


def call(sql: str, name: str = "execute_sql") -> dict:
    return {"type": "function", "function": {"name": name, "arguments": {"sql": sql}}}


CONVERSATION = [
    {"role": "system", "content": "You write SQLite."},
    {"role": "user", "content": "How many books?"},
    {"role": "assistant", "content": "", "tool_calls": [call("SELECT count(*) FROM books")]},
    {"role": "tool", "name": "execute_sql", "content": '{"rows": [[3]]}'},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [call("SELECT 1"), call("SELECT 2")]},
    {"role": "tool", "content": "one"},
    {"role": "tool", "content": "two"},
    {"role": "assistant", "content": "There are 3 books."},
    {"role": "user", "content": "Thanks — and authors? é😀"},
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from sqlrl.policy.load import load_policy

    return load_policy("tiny", cache_dir=tmp_path_factory.getbasetemp() / "policy-cache").tokenizer


def render(tok, messages, tools=TOOLS, gen=False) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)


def ids(tok, messages, tools=TOOLS, gen=False) -> list[int]:
    return tok(render(tok, messages, tools, gen), add_special_tokens=False)["input_ids"]


def test_tokenizer_carries_the_template(tokenizer):
    assert tokenizer.chat_template == TOOL_CHAT_TEMPLATE


def test_system_turn_lists_tools_as_json_lines(tokenizer):
    text = render(tokenizer, CONVERSATION[:2])
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou write SQLite.\n\n# Tools\n")
    listed = system.split("<tools>\n")[1].split("\n</tools>")[0]
    assert [json.loads(line) for line in listed.splitlines()] == TOOLS
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in system
    assert text.endswith("<|im_start|>user\nHow many books?<|im_end|>\n")


def test_without_tools_or_system(tokenizer):
    text = render(tokenizer, [{"role": "user", "content": "hi"}], tools=None, gen=True)
    assert text == (f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_tool_calls_and_grouped_tool_responses(tokenizer):
    text = render(tokenizer, CONVERSATION)
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "execute_sql", "arguments": '
            '{"sql": "SELECT count(*) FROM books"}}\n</tool_call><|im_end|>\n') in text
    assert '<|im_start|>user\n<tool_response>\n{"rows": [[3]]}\n</tool_response><|im_end|>\n' in text
    assert ('<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "execute_sql", "arguments": '
            '{"sql": "SELECT 1"}}\n</tool_call>\n<tool_call>\n{"name": "execute_sql", "arguments": '
            '{"sql": "SELECT 2"}}\n</tool_call><|im_end|>\n') in text
    assert ("<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\nThere are 3 books.<|im_end|>\n") in text
    # every <tool_call> block is valid JSON with name + arguments
    blocks = [b.split("\n</tool_call>")[0] for b in text.split("<tool_call>\n")[2:]]
    assert [json.loads(b)["arguments"]["sql"] for b in blocks] == ["SELECT count(*) FROM books", "SELECT 1", "SELECT 2"]


def test_string_arguments_are_kept_and_flat_calls_accepted(tokenizer):
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"name": "submit_solution", "arguments": '{"sql": "SELECT \\"a\\""}'}]}]
    text = render(tokenizer, msgs)
    assert '<tool_call>\n{"name": "submit_solution", "arguments": {"sql": "SELECT \\"a\\""}}\n</tool_call>' in text


def test_generation_prompt_is_appended(tokenizer):
    assert render(tokenizer, CONVERSATION, gen=True) == render(tokenizer, CONVERSATION) + "<|im_start|>assistant\n"


def boundaries(messages):
    """k such that messages[k] does not continue a run of tool messages."""
    return [k for k in range(1, len(messages))
            if not (messages[k]["role"] == "tool" and messages[k - 1]["role"] == "tool")]


def test_prefix_stable_at_every_turn_boundary_string_and_tokens(tokenizer):
    ks = boundaries(CONVERSATION)
    assert len(ks) == len(CONVERSATION) - 2  # only k=6 (second tool of a group) is excluded
    for k in ks:
        head, longer = render(tokenizer, CONVERSATION[:k]), render(tokenizer, CONVERSATION[:k + 1])
        assert longer.startswith(head), k
        head_ids, longer_ids = ids(tokenizer, CONVERSATION[:k]), ids(tokenizer, CONVERSATION[:k + 1])
        assert longer_ids[:len(head_ids)] == head_ids, k
        # the generation prompt is a prefix of whatever assistant turn follows
        if CONVERSATION[k]["role"] == "assistant":
            assert longer.startswith(render(tokenizer, CONVERSATION[:k], gen=True))


def test_all_tool_responses_of_a_turn_appended_together_are_a_delta(tokenizer):
    head = render(tokenizer, CONVERSATION[:5])
    full = render(tokenizer, CONVERSATION[:7], gen=True)
    assert full.startswith(head)
    assert full[len(head):] == ("<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n"
                                "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_tool_response_inside_a_group_is_the_documented_exception(tokenizer):
    assert not render(tokenizer, CONVERSATION[:7]).startswith(render(tokenizer, CONVERSATION[:6]))
