"""The tool-capable chat template every sqlrl policy tokenizer carries (Qwen2.5 "hermes" style).

``TOOL_CHAT_TEMPLATE`` is a Jinja template for HF ``apply_chat_template(messages, tools=..., ...)``:

- the first turn is ``<|im_start|>system\\n...`` (the first message's content when it is a system
  message, otherwise ``DEFAULT_SYSTEM``); with tools it lists each tool as one JSON line inside
  ``<tools></tools>`` and tells the model to answer with
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
- user / system / plain assistant messages: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``;
- assistant messages with ``tool_calls`` (OpenAI shape ``{"function": {"name", "arguments"}}`` or
  flat ``{"name", "arguments"}``; ``arguments`` a dict, or a JSON string kept verbatim) render each
  call as a ``<tool_call>`` JSON block after the content;
- ``tool`` messages render as ``<|im_start|>user\\n<tool_response>\\n{content}\\n</tool_response><|im_end|>\\n``,
  consecutive tool messages grouped into one user turn exactly as Qwen2.5 does;
- ``add_generation_prompt`` appends ``<|im_start|>assistant\\n``.

Prefix stability (what the agent loop relies on to append observation tokens): for messages ``m`` and
every ``k >= 1``, ``render(m[:k])`` (no generation prompt) is a string prefix of ``render(m[:k+1])`` —
**except** when ``m[k]`` is a ``tool`` message directly after another ``tool`` message (the grouping
moves the closing ``<|im_end|>``). So: append all tool responses of one assistant turn together,
then take the delta. Every turn ends with ``<|im_end|>\\n`` and the next starts with the special
token ``<|im_start|>``, so the split is also a token boundary.
"""

from __future__ import annotations

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # the end-of-turn / EOS token
ENDOFTEXT = "<|endoftext|>"  # padding for the tiny tokenizer
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
TOOL_TAGS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)
DEFAULT_SYSTEM = "You are a helpful assistant."

TOOL_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] %}"
    "{%- else %}"
    "{%- set system_message = '" + DEFAULT_SYSTEM + "' %}"
    "{%- endif %}"
    "{{- '<|im_start|>system\\n' + system_message }}"
    "{%- if tools %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}"
    "{{- '\\n' + (tool | tojson) }}"
    "{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>' }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.get('content') %}"
    "{{- '\\n' + message['content'] }}"
    "{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- if call.get('function') is not none %}{%- set call = call['function'] %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": ' + (call['name'] | tojson) + ', \"arguments\": ' }}"
    "{%- if call['arguments'] is string %}{{- call['arguments'] }}"
    "{%- else %}{{- call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
