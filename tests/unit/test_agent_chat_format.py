"""HFChatFormat over a fake tokenizer that renders Qwen2.5's real (hermes tool-calling) chat template
with jinja2 and tokenises one id per character (special tokens are single ids).

``FakeTokenizer`` is reused by the loop tests (tests/unit/test_agent_loop.py).
"""

from __future__ import annotations

import json

import jinja2
import pytest

from sqlrl.agent import ChatFormatError, HFChatFormat
from sqlrl.tools import tool_schemas

# Qwen2.5-Instruct's chat template (tool-calling part), as published with the model.
QWEN25_TEMPLATE = """
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


class FakeTokenizer:
    """One id per character (ord + 10); ``<|im_start|>``=1, ``<|im_end|>``=2, ``<|endoftext|>``=3."""

    SPECIAL = {"<|im_start|>": 1, "<|im_end|>": 2, "<|endoftext|>": 3}
    eos_token = "<|endoftext|>"

    def __init__(self, template: str = QWEN25_TEMPLATE) -> None:
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)  # as transformers does
        self.template = env.from_string(template)
        self.all_special_ids = list(self.SPECIAL.values())
        self.renders = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out, i = [], 0
        while i < len(text):
            for tok, tid in self.SPECIAL.items():
                if text.startswith(tok, i):
                    out.append(tid)
                    i += len(tok)
                    break
            else:
                out.append(ord(text[i]) + 10)
                i += 1
        return out

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in self.SPECIAL.items()}
        return "".join(("" if skip_special_tokens else names[i]) if i in names else chr(i - 10)
                       for i in ids)

    def render(self, messages, tools=None, add_generation_prompt=False) -> str:
        return self.template.render(messages=messages, tools=tools,
                                    add_generation_prompt=add_generation_prompt)

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False,
                            tokenize=True):
        self.renders += 1
        text = self.render(messages, tools, add_generation_prompt)
        return self.encode(text) if tokenize else text


CALL = {"name": "execute_sql", "arguments": {"sql": "SELECT 1"}}
MESSAGES = [{"role": "system", "content": "You write SQL."}, {"role": "user", "content": "Count."}]
ASSISTANT = {"role": "assistant", "content": "Let me look.",
             "tool_calls": [{"type": "function", "function": CALL}]}
TOOL = {"role": "tool", "name": "execute_sql", "content": "1\n1\n(1 row)"}


def test_end_of_turn_is_probed_from_the_template():
    fmt = HFChatFormat(FakeTokenizer())
    assert fmt.end_of_turn == "<|im_end|>" and fmt.turn_end_ids == (2,)
    assert HFChatFormat(FakeTokenizer(), end_of_turn="<|endoftext|>").turn_end_ids == (3,)


def test_prompt_ids_render_with_tools_and_generation_prompt():
    tok = FakeTokenizer()
    fmt = HFChatFormat(tok)
    ids = fmt.prompt_ids(MESSAGES, tool_schemas())
    text = fmt.decode(ids)
    assert text == tok.render(MESSAGES, tool_schemas(), True)
    assert '"name": "submit_solution"' in text and text.endswith("<|im_start|>assistant\n")


def test_continuation_follows_the_generated_end_of_turn_exactly():
    """prompt + generated (ending <|im_end|>) + continuation == the template's full rendering."""
    tok = FakeTokenizer()
    fmt = HFChatFormat(tok)
    tools = tool_schemas()
    prompt = fmt.prompt_ids(MESSAGES, tools)
    generated = tok.encode('Let me look.\n<tool_call>\n{"name": "execute_sql", "arguments": '
                           '{"sql": "SELECT 1"}}\n</tool_call><|im_end|>')
    cont = fmt.continuation_ids(MESSAGES + [ASSISTANT], [TOOL], tools)
    assert fmt.decode(cont) == ("\n<|im_start|>user\n<tool_response>\n1\n1\n(1 row)\n"
                                "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    full = tok.encode(tok.render(MESSAGES + [ASSISTANT, TOOL], tools, True))
    assert prompt + generated + cont == full


def test_close_turn_prefixes_the_end_of_turn_ids():
    fmt = HFChatFormat(FakeTokenizer())
    open_ = fmt.continuation_ids(MESSAGES + [ASSISTANT], [TOOL], None)
    closed = fmt.continuation_ids(MESSAGES + [ASSISTANT], [TOOL], None, close_turn=True)
    assert closed == [2] + open_


def test_continuation_ignores_how_the_template_rerenders_the_assistant_turn():
    """The generated text need not equal the template's rendering (e.g. compact JSON)."""
    fmt = HFChatFormat(FakeTokenizer())
    a = fmt.continuation_ids(MESSAGES + [ASSISTANT], [TOOL])
    b = fmt.continuation_ids(MESSAGES + [{"role": "assistant", "content": "garbled <tool_call>"}],
                             [TOOL])
    assert a == b


def test_not_prefix_stable_template_raises_a_clear_error():
    # Renders the *last* message specially: appending a message changes an earlier turn.
    unstable = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                "{% if loop.last %} (latest){% endif %}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fmt = HFChatFormat(FakeTokenizer(unstable), end_of_turn="<|im_end|>")
    with pytest.raises(ChatFormatError, match="not prefix-stable.*at token"):
        fmt.continuation_ids(MESSAGES + [{"role": "assistant", "content": "x"}], [TOOL])


def test_template_without_end_of_turn_in_assistant_turns_raises():
    template = ("{% for m in messages %}{% if m.role == 'assistant' %}A: {{ m.content }}\n"
                "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
                "{% endfor %}{% if add_generation_prompt %}A: {% endif %}")
    fmt = HFChatFormat(FakeTokenizer(template), end_of_turn="<|im_end|>")
    with pytest.raises(ChatFormatError, match="without the end-of-turn token"):
        fmt.continuation_ids(MESSAGES + [{"role": "assistant", "content": "x"}], [TOOL])


def test_continuation_needs_a_last_assistant_message():
    with pytest.raises(ChatFormatError, match="ends with an assistant message"):
        HFChatFormat(FakeTokenizer()).continuation_ids(MESSAGES, [TOOL])


def test_end_of_turn_falls_back_to_eos_or_raises():
    plain = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
             "{% if add_generation_prompt %}assistant: {% endif %}")
    assert HFChatFormat(FakeTokenizer(plain)).end_of_turn == "<|endoftext|>"
    tok = FakeTokenizer(plain)
    tok.eos_token = None
    with pytest.raises(ChatFormatError, match="pass end_of_turn="):
        HFChatFormat(tok)


def test_batch_encoding_results_are_accepted():
    class DictTokenizer(FakeTokenizer):
        def apply_chat_template(self, *args, **kwargs):
            return {"input_ids": super().apply_chat_template(*args, **kwargs)}

    fmt = HFChatFormat(DictTokenizer())
    assert fmt.prompt_ids(MESSAGES) == HFChatFormat(FakeTokenizer()).prompt_ids(MESSAGES)
