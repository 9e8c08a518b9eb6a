"""A self-correcting SQL agent in LangGraph: write -> execute -> check -> rewrite (up to 3 turns).

Written as LangGraph users write it (the Agent Lightning SQL agent's workflow): a ``StateGraph`` of
four nodes, ``langchain_openai.ChatOpenAI`` for every LLM call, prompts as ``ChatPromptTemplate``.
It knows nothing of sqlrl. It takes a base URL, an API key and a task; pointing the base URL at the
sqlrl gateway (training) or at ``jobs.serve`` (serving) is the whole integration:

    python -m examples.langgraph_sql_agent.agent --base-url http://127.0.0.1:8000/v1 --api-key KEY \\
        --sqlite shop.sqlite --question "How many customers are there?"

``streaming=True`` makes every call a streamed one (``stream: true``, SSE chunks joined by
LangChain); the answers are the same. Each node's calls carry their role in the ``X-Sqlrl-Tag`` header (``write``, ``check``, ``rewrite``):
the gateway records it, and the training job's ``train_tags`` picks the roles that train (Agent
Lightning trained ``write`` and ``rewrite``). Other servers ignore the header.

Tasks: text-to-SQL (``question``, ``evidence``) and debugging (``kind: critic``: ``problem`` and the
``issue_sql`` that does not do it; the first query is then the user's SQL fixed, ``DEBUG_QUERY_PROMPT``,
still tagged ``write``); another kind is refused before any call (``examples/task_kinds.py``).

The turn structure: ``write_query`` writes the first query; ``execute_query`` runs it (the task's
``session_url`` on the gateway, or a local SQLite file, ``examples/sql_exec.py``); ``check_query``
reads query + result and ends with ``THE QUERY IS CORRECT.`` or ``THE QUERY IS INCORRECT.``; on
incorrect, ``rewrite_query`` writes a new query, which is executed and checked again. At most
``max_turns`` queries are written (write + rewrites): 3 by default, so at most 6 LLM calls.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, TypedDict

from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from examples import task_kinds

WRITE_QUERY_PROMPT = ChatPromptTemplate.from_messages([
    ("system", "You are an agent that answers questions about a {dialect} database by writing one SQL "
               "query. Use only the tables and columns in this schema:\n\n{schema}\n\n"
               "Write a syntactically correct {dialect} query that answers the question. Answer with "
               "the query in a ```sql code block."),
    ("user", "{request}"),
])

# A debugging task (``kind: critic``): the first query is the user's SQL, fixed; check and rewrite as above.
DEBUG_QUERY_PROMPT = ChatPromptTemplate.from_messages([
    ("system", "You are an agent that debugs {dialect} SQL: a user's SQL does not do what they need. Use only "
               "the tables and columns in this schema:\n\n{schema}\n\nWrite {dialect} SQL that solves the "
               "user's problem. Answer with the SQL in a ```sql code block."),
    ("user", "{request}"),
])

CHECK_QUERY_PROMPT = ChatPromptTemplate.from_messages([
    ("system", "You are a SQL expert who double-checks {dialect} queries. Schema:\n\n{schema}\n\n"
               "Check the query against the question and its execution result: wrong tables or "
               "columns, wrong joins or filters, NULL handling, missing GROUP BY or ORDER BY, an "
               "error in the result. List the mistakes you find, then end with exactly one of "
               "THE QUERY IS CORRECT. or THE QUERY IS INCORRECT."),
    ("user", "{request}\n\nQuery:\n```sql\n{query}\n```\n\nExecution result:\n{execution}"),
])

REWRITE_QUERY_PROMPT = ChatPromptTemplate.from_messages([
    ("system", "You are an agent that fixes {dialect} queries. Schema:\n\n{schema}\n\n"
               "Rewrite the query so that it answers the question, using the feedback. Answer with "
               "the new query in a ```sql code block."),
    ("user", "{request}\n\nQuery:\n```sql\n{query}\n```\n\nExecution result:\n"
             "{execution}\n\nFeedback:\n{feedback}"),
])

CORRECT = "THE QUERY IS CORRECT."
CODE_BLOCK = re.compile(r"```(?:sql|sqlite|postgresql|mysql)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
BARE_QUERY = re.compile(r"\b(SELECT|WITH)\b.*", re.DOTALL | re.IGNORECASE)


# The task as the user's request, by its kind (examples/task_kinds.py); the first query's prompt by kind.
REQUESTS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "text2sql": lambda t: f"Question: {t['question']}\n{t.get('evidence') or ''}", "critic": task_kinds.REQUESTS["critic"]}
FIRST_PROMPTS = {"text2sql": WRITE_QUERY_PROMPT, "critic": DEBUG_QUERY_PROMPT}
KINDS = tuple(REQUESTS)  # the task kinds it handles: what examples/run_clients declares when it claims


class State(TypedDict, total=False):
    kind: str
    request: str
    schema: str
    dialect: str
    query: str
    execution: str
    feedback: str
    num_turns: int
    calls: int


def parse_query(text: str) -> str:
    """The last ```sql block of an answer, else the text from its first SELECT/WITH, else ''."""
    blocks = CODE_BLOCK.findall(text or "")
    if blocks:
        return blocks[-1].strip()
    bare = BARE_QUERY.search(text or "")
    return bare.group(0).strip() if bare else ""


class SQLAgent:
    """The graph and its LLMs. ``execute``: ``sql -> (observation, is_error)``."""

    def __init__(self, base_url: str, api_key: str, execute: Callable[[str], tuple[str, bool]], *,
                 model: str | None = None, max_turns: int = 3, temperature: float | None = None,
                 max_tokens: int = 512, max_retries: int = 8, timeout_s: float = 300.0,
                 streaming: bool = False) -> None:
        if model is None:  # the server's first model (the gateway serves the one policy)
            model = _first_model(base_url, api_key, timeout_s)
        self.execute, self.max_turns = execute, max_turns

        def llm(role: str) -> ChatOpenAI:
            return ChatOpenAI(model=model, base_url=base_url, api_key=api_key, temperature=temperature,
                              max_tokens=max_tokens, max_retries=max_retries, timeout=timeout_s,
                              streaming=streaming, default_headers={"X-Sqlrl-Tag": role})

        self.write_llm, self.check_llm, self.rewrite_llm = llm("write"), llm("check"), llm("rewrite")

    def _ask(self, llm: ChatOpenAI, prompt: ChatPromptTemplate, state: State) -> str:
        values = {"request": state["request"], "schema": state["schema"], "dialect": state.get("dialect", "sqlite"),
                  "query": state.get("query", ""), "execution": state.get("execution", ""),
                  "feedback": state.get("feedback", "")}
        return str(llm.invoke(prompt.invoke(values)).content or "")

    def write_query(self, state: State) -> State:
        answer = self._ask(self.write_llm, FIRST_PROMPTS[state.get("kind", "text2sql")], state)
        return {"query": parse_query(answer), "num_turns": 1, "calls": state.get("calls", 0) + 1}

    def execute_query(self, state: State) -> State:
        query = state.get("query", "")
        if not query:
            return {"execution": "Error: the answer held no SQL query."}
        observation, _ = self.execute(query)
        return {"execution": observation}

    def check_query(self, state: State) -> State:
        return {"feedback": self._ask(self.check_llm, CHECK_QUERY_PROMPT, state), "calls": state["calls"] + 1}

    def rewrite_query(self, state: State) -> State:
        answer = self._ask(self.rewrite_llm, REWRITE_QUERY_PROMPT, state)
        return {"query": parse_query(answer) or state.get("query", ""), "num_turns": state["num_turns"] + 1,
                "calls": state["calls"] + 1}

    def should_continue(self, state: State) -> str:
        if CORRECT in state.get("feedback", "").upper() or state["num_turns"] >= self.max_turns:
            return END
        return "rewrite_query"

    def graph(self) -> Any:
        builder = StateGraph(State)
        builder.add_node("write_query", self.write_query)
        builder.add_node("execute_query", self.execute_query)
        builder.add_node("check_query", self.check_query)
        builder.add_node("rewrite_query", self.rewrite_query)
        builder.add_edge(START, "write_query")
        builder.add_edge("write_query", "execute_query")
        builder.add_edge("execute_query", "check_query")
        builder.add_conditional_edges("check_query", self.should_continue, ["rewrite_query", END])
        builder.add_edge("rewrite_query", "execute_query")
        return builder.compile()


def run_agent(base_url: str, api_key: str, task: Mapping[str, Any], execute: Callable[[str], tuple[str, bool]],
              **options: Any) -> dict[str, Any]:
    """Run the graph on one task (``question`` + ``evidence``, or for ``kind: critic`` ``problem`` +
    ``issue_sql``; ``schema``, ``dialect``); returns the final ``query``, its ``execution``, the
    ``feedback``, ``num_turns`` and ``calls`` (LLM calls). Another kind: ``UnsupportedTask``, no call made."""
    kind = task_kinds.check_kind(task, tuple(REQUESTS))
    agent = SQLAgent(base_url, api_key, execute, **options)
    state: State = {"kind": kind, "request": REQUESTS[kind](task),
                    "schema": str(task.get("schema") or ""), "dialect": str(task.get("dialect") or "sqlite")}
    out = agent.graph().invoke(state, {"recursion_limit": 4 * agent.max_turns + 4})
    return {k: out.get(k) for k in ("query", "execution", "feedback", "num_turns", "calls")}


def _first_model(base_url: str, api_key: str, timeout_s: float) -> str:
    from openai import OpenAI

    models = OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s).models.list().data
    if not models:
        raise RuntimeError(f"{base_url}/models lists no model")
    return models[0].id


def main(argv: list[str] | None = None) -> int:
    from examples.sql_exec import cli

    return cli(__doc__.split("\n\n")[0], run_agent, ("query", "execution", "feedback", "num_turns", "calls"), argv)


if __name__ == "__main__":
    raise SystemExit(main())
