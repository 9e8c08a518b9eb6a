"""A SQL agent on the plain ``openai`` client with one tool, ``execute_sql``.

One conversation: the model calls ``execute_sql`` to try queries (each result comes back as a
``tool`` message) and ends with its answer, the final query in a ```sql block. At most
``max_turns`` model calls; the final SQL is the answer's query, else the last query it ran
without an error. It takes a base URL, an API key and a task, and knows nothing of sqlrl:

    python -m examples.openai_client_agent.agent --base-url http://127.0.0.1:8000/v1 --api-key KEY \\
        --sqlite shop.sqlite --question "How many customers are there?"

It handles text-to-SQL tasks (``question``) and debugging tasks (``kind: critic``: ``problem`` and the
``issue_sql`` to fix), each with its own system prompt; a task of another kind is refused before any
call (``examples/task_kinds.py``: ``UnsupportedTask``).

Every call carries ``metadata={"tag": "agent"}`` (OpenAI's own request field): the gateway records
it as the call's tag. Its calls extend one conversation, so the gateway's traces merge them into
one training sequence with the tool results masked (docs/gateway_training.md).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping

from openai import OpenAI

from examples.task_kinds import check_kind, request_text

TAG = "agent"
SYSTEM_PROMPT = ("You answer questions about a {dialect} database with one SQL query. Schema:\n\n{schema}\n\n"
                 "Call execute_sql to try queries and read their results. When you are sure, answer with "
                 "the final query in a ```sql code block.")
DEBUG_PROMPT = ("You fix SQL for a {dialect} database: the user's SQL does not do what they need. Schema:\n\n"
                "{schema}\n\nCall execute_sql to try queries and read their results. When you are sure, answer "
                "with the corrected SQL in a ```sql code block (several statements: separate them with ;).")
SYSTEM_PROMPTS = {"text2sql": SYSTEM_PROMPT, "critic": DEBUG_PROMPT}  # by the task's kind (examples/task_kinds.py)
KINDS = tuple(SYSTEM_PROMPTS)  # the task kinds it handles: what examples/run_clients declares when it claims
TOOLS = [{"type": "function", "function": {
    "name": "execute_sql",
    "description": "Run one SQL query on the database and return its result (or its error).",
    "parameters": {"type": "object", "properties": {"sql": {"type": "string", "description": "the query"}},
                   "required": ["sql"]}}}]
CODE_BLOCK = re.compile(r"```(?:sql|sqlite|postgresql|mysql)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


def run_agent(base_url: str, api_key: str, task: Mapping[str, Any], execute: Callable[[str], tuple[str, bool]], *,
              model: str | None = None, max_turns: int = 3, temperature: float | None = None,
              max_tokens: int = 512, max_retries: int = 8, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run the tool loop on one task; returns the final ``query``, ``calls``, ``tool_calls`` and the
    ``messages`` of the conversation."""
    kind = check_kind(task, tuple(SYSTEM_PROMPTS))  # UnsupportedTask before any call
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=max_retries, timeout=timeout_s)
    if model is None:
        model = client.models.list().data[0].id
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPTS[kind].format(dialect=task.get("dialect") or "sqlite",
                                                                  schema=task.get("schema") or "")},
        {"role": "user", "content": request_text(task)}]
    options: dict[str, Any] = {"max_tokens": max_tokens}
    if temperature is not None:
        options["temperature"] = temperature
    last_ok, answer, calls, tool_calls = "", "", 0, 0
    for _ in range(max_turns):
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                  metadata={"tag": TAG}, **options)
        calls += 1
        message = response.choices[0].message
        if not message.tool_calls:
            answer = message.content or ""
            break
        messages.append({"role": "assistant", "content": message.content,
                         "tool_calls": [tc.model_dump(include={"id", "type", "function"}) for tc in message.tool_calls]})
        for tc in message.tool_calls:
            tool_calls += 1
            sql = _sql_argument(tc.function.arguments) if tc.function.name == "execute_sql" else None
            if sql is None:
                observation, is_error = f"Error: unknown tool or bad arguments: {tc.function.name}", True
            else:
                observation, is_error = execute(sql)
                last_ok = last_ok if is_error else sql
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": observation})
    blocks = CODE_BLOCK.findall(answer)
    return {"query": blocks[-1].strip() if blocks else last_ok, "calls": calls, "tool_calls": tool_calls,
            "messages": messages + ([{"role": "assistant", "content": answer}] if answer else [])}


def _sql_argument(arguments: str) -> str | None:
    try:
        sql = json.loads(arguments).get("sql")
    except (ValueError, AttributeError):
        return None
    return sql if isinstance(sql, str) and sql.strip() else None


def main(argv: list[str] | None = None) -> int:
    from examples.sql_exec import cli

    return cli(__doc__.split("\n\n")[0], run_agent, ("query", "calls", "tool_calls"), argv)


if __name__ == "__main__":
    raise SystemExit(main())
