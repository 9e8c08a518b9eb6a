"""Where the example agents run their SQL: the gateway's sealed session, or a local SQLite file.

Both example agents (``langgraph_sql_agent``, ``openai_client_agent``) take an ``execute`` callable,
``sql -> (observation, is_error)``; this module makes one from what the agent was given:

- in training, the task the gateway handed out carries ``session_url``: ``SessionExecutor`` posts the
  SQL there (``POST session_url {"sql"}`` -> ``{"observation", "is_error"}``). The SQL runs on the
  rollout's own trajectory-scoped session on the server, through sqlrl's executor and sandbox: the
  agent never touches a database file, and the observation is the one the built-in agent sees.
- at serving, the user names a local SQLite file: ``SQLiteExecutor`` opens it **read-only**
  (``mode=ro``: a DROP or INSERT fails, the file is never changed) and writes the rows as text.

``executor_for(task, api_key, sqlite_path)`` picks: the SQLite file when one is given, else the
task's ``session_url``. Plain ``sqlite3`` and ``httpx`` (installed with ``openai``); no sqlrl import,
so the examples run anywhere the user's agent runs.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Callable, Mapping

import httpx

Execute = Callable[[str], "tuple[str, bool]"]
MAX_ROWS = 20
MAX_CHARS = 2048


def _truncate(text: str, limit: int = MAX_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"


class SessionExecutor:
    """SQL on the rollout's sealed session on the gateway (``task["session_url"]``)."""

    def __init__(self, session_url: str, api_key: str, timeout_s: float = 60.0) -> None:
        self.url = session_url
        self.client = httpx.Client(headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout_s)

    def __call__(self, sql: str) -> tuple[str, bool]:
        r = self.client.post(self.url, json={"sql": sql})
        r.raise_for_status()  # 409: the rollout completed or expired; the agent stops there
        body = r.json()
        return str(body["observation"]), bool(body["is_error"])

    def close(self) -> None:
        self.client.close()


class SQLiteExecutor:
    """SQL on a local SQLite file, opened read-only."""

    def __init__(self, path: str | Path, max_rows: int = MAX_ROWS) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no SQLite database at {path}")
        self.path, self.max_rows = path, max_rows

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.path.resolve()}?mode=ro", uri=True)

    def __call__(self, sql: str) -> tuple[str, bool]:
        conn = self._connect()
        try:
            cur = conn.execute(sql)
            columns = [d[0] for d in cur.description or ()]
            rows = cur.fetchmany(self.max_rows + 1)
        except sqlite3.Error as exc:
            return f"Error: {exc}", True
        finally:
            conn.close()
        more = len(rows) > self.max_rows
        lines = [" | ".join(columns)] + [" | ".join(map(str, row)) for row in rows[:self.max_rows]]
        if more:
            lines.append(f"... (more than {self.max_rows} rows)")
        return _truncate("\n".join(lines) if columns else "OK (no rows)"), False

    def schema(self) -> str:
        """The file's CREATE TABLE statements (what the agent's prompt shows at serving)."""
        conn = self._connect()
        try:
            rows = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL "
                                "ORDER BY name").fetchall()
        finally:
            conn.close()
        return "\n\n".join(r[0] for r in rows)

    def close(self) -> None:
        pass


def executor_for(task: Mapping[str, Any], api_key: str, sqlite_path: str | Path | None = None) -> Any:
    """The executor for this run: the local SQLite file if given, else the task's ``session_url``."""
    if sqlite_path is not None:
        return SQLiteExecutor(sqlite_path)
    if not task.get("session_url"):
        raise ValueError("the task has no session_url (it did not come from a gateway): give a SQLite file "
                         "to run the SQL on")
    return SessionExecutor(str(task["session_url"]), api_key)


def load_task(task: Mapping[str, Any], executor: Any) -> dict[str, Any]:
    """The task with its schema filled in from a local SQLite file when it has none."""
    out = dict(task)
    if not out.get("schema") and isinstance(executor, SQLiteExecutor):
        out["schema"] = executor.schema()
    out.setdefault("dialect", "sqlite")
    out.setdefault("evidence", "")
    return out


def cli(description: str, run_agent: Callable[..., Mapping[str, Any]], keys: tuple[str, ...],
        argv: list[str] | None = None) -> int:
    """An example agent's command line: one task (``--task`` JSON or ``--question``) on ``--sqlite``
    (serving) or on the task's ``session_url``; prints the result's ``keys`` as JSON."""
    import argparse
    import json

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--base-url", required=True, help="the OpenAI-compatible base URL (ends in /v1)")
    p.add_argument("--api-key", required=True)
    p.add_argument("--sqlite", help="a local SQLite file to run the SQL on (serving)")
    p.add_argument("--task", help="a task as JSON (question, evidence, schema, dialect, session_url)")
    p.add_argument("--question")
    p.add_argument("--model")
    p.add_argument("--max-turns", type=int, default=3)
    args = p.parse_args(argv)
    if not args.task and not args.question:
        p.error("give --task or --question")
    task = json.loads(args.task) if args.task else {"question": args.question}
    execute = executor_for(task, args.api_key, args.sqlite)
    out = run_agent(args.base_url, args.api_key, load_task(task, execute), execute, model=args.model,
                    max_turns=args.max_turns)
    print(json.dumps({k: out[k] for k in keys}, indent=2))
    return 0
