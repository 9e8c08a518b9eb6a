"""A small fake of the training gateway's HTTP contract (issue 44), for the example clients' tests.

It implements exactly what the clients use: ``POST /v1/rollouts`` (200 claim / 204 + Retry-After /
410), ``<base_url>/models`` and ``<base_url>/chat/completions`` (non-streaming, tools), the tag
from ``metadata.tag`` or the ``X-Sqlrl-Tag`` header, ``POST session_url {"sql"}`` on a SQLite copy,
``POST complete_url {"sql"}`` (reward 1.0 when the result equals the gold's), 409 after completion.
Answers come from canned rules on the prompt text, like the scripted engine. Everything a client
did is recorded in ``FakeGateway.calls / sql / completed`` for the tests to assert on.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

KEY = "k-fake"


def tool_call(sql: str) -> dict[str, Any]:
    return {"tool_calls": [{"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                            "function": {"name": "execute_sql", "arguments": json.dumps({"sql": sql})}}]}


# (text the prompt holds, number of assistant turns or None for any) -> the answer; first match wins
RULES: list[tuple[str, int | None, dict[str, Any]]] = [
    ("that fixes", None, {"content": "```sql\nSELECT count(*) FROM customers\n```"}),
    ("SELECT count(nme)", None, {"content": "Column nme does not exist. THE QUERY IS INCORRECT."}),
    ("SELECT count(*)", None, {"content": "It counts every customer. THE QUERY IS CORRECT."}),
    ("by writing one SQL query", None, {"content": "```sql\nSELECT count(nme) FROM customers\n```"}),
    ("execute_sql to try", 0, tool_call("SELECT nme FROM customers")),
    ("execute_sql to try", 1, tool_call("SELECT count(*) FROM customers")),
    ("execute_sql to try", 2, {"content": "Done.\n```sql\nSELECT count(*) FROM customers\n```"}),
]
GOLD = "SELECT count(*) FROM customers"


@dataclass
class Rollout:
    rollout_id: str
    task: dict[str, Any]
    status: str = "running"
    reward: float | None = None


@dataclass
class FakeGateway:
    db: str  # a SQLite file: sessions run on it read-only
    tasks: list[dict[str, Any]]
    waits: int = 1  # answer 204 this many times before the first claim
    fail_chat: set[str] = field(default_factory=set)  # questions whose chat calls answer 500
    expire: set[str] = field(default_factory=set)  # questions whose rollout expires before completion
    forget: set[str] = field(default_factory=set)  # questions whose rollout is unknown at completion (a restarted job)
    rollouts: dict[str, Rollout] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)  # rollout_id, tag, n_messages, tools
    sql: list[tuple[str, str]] = field(default_factory=list)
    completed: list[tuple[str, str, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run_sql(self, sql: str) -> tuple[Any, str | None]:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return conn.execute(sql).fetchall(), None
        except sqlite3.Error as exc:
            return None, str(exc)
        finally:
            conn.close()

    def session_sql(self, r: Rollout, sql: str) -> tuple[dict[str, Any], int]:
        self.sql.append((r.rollout_id, sql))
        rows, error = self.run_sql(sql)
        return {"observation": f"Error: {error}" if error else json.dumps(rows), "is_error": error is not None}, 200

    def complete(self, r: Rollout, sql: str) -> tuple[dict[str, Any], int]:
        if r.task["question"] in self.expire:
            r.status = "expired"
            return {"error": {"message": "the rollout expired"}}, 409
        if r.task["question"] in self.forget:
            r.status = "forgotten"
            return {"error": {"message": "unknown rollout"}}, 404
        got, _ = self.run_sql(sql)
        r.status, r.reward = "completed", float(got is not None and got == self.run_sql(GOLD)[0])
        self.completed.append((r.rollout_id, sql, r.reward))
        return {"rollout_id": r.rollout_id, "status": "completed", "reward": r.reward}, 200

    def app(self, base: str) -> FastAPI:
        app = FastAPI()

        def authorised(request: Request) -> bool:
            return request.headers.get("authorization") == f"Bearer {KEY}"

        def rollout(rid: str) -> Rollout | None:
            return self.rollouts.get(rid)

        async def running(rid: str, request: Request) -> tuple[Rollout | None, Any]:
            """The running rollout and the request's body, or (None, the 409 to answer)."""
            r = rollout(rid)
            if not authorised(request) or r is None or r.status != "running":
                return None, JSONResponse({"error": {"message": "no such running rollout"}}, status_code=409)
            return r, await request.json()

        @app.post("/v1/rollouts")
        async def claim(request: Request) -> Response:
            if not authorised(request):
                return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
            with self.lock:
                if self.waits > 0:
                    self.waits -= 1
                    return Response(status_code=204, headers={"Retry-After": "0"})
                if not self.tasks:
                    return Response(status_code=410)
                task = self.tasks.pop(0)
                rid = uuid.uuid4().hex
                self.rollouts[rid] = Rollout(rid, task)
            root = f"{base}/rollouts/{rid}"
            return JSONResponse({"rollout_id": rid, "base_url": f"{root}/v1", "task": task,
                                 "session_url": f"{root}/sql", "complete_url": f"{root}/complete",
                                 "deadline_s": 600})

        @app.get("/rollouts/{rid}/v1/models")
        async def models(rid: str, request: Request) -> Response:
            if not authorised(request) or rollout(rid) is None:
                return JSONResponse({"error": {"message": "no"}}, status_code=404)
            return JSONResponse({"object": "list", "data": [{"id": "policy", "object": "model", "created": 0,
                                                             "owned_by": "sqlrl"}]})

        @app.post("/rollouts/{rid}/v1/chat/completions")
        async def chat(rid: str, request: Request) -> Response:
            r, body = await running(rid, request)
            if r is None:
                return body
            if r.task["question"] in self.fail_chat:
                return JSONResponse({"error": {"message": "engine failed", "type": "server_error"}},
                                    status_code=500)
            tag = (body.get("metadata") or {}).get("tag") or request.headers.get("x-sqlrl-tag")
            messages = body["messages"]
            text = "\n".join(str(m.get("content") or "") for m in messages)
            turns = sum(m["role"] == "assistant" for m in messages)
            self.calls.append({"rollout_id": rid, "tag": tag, "n_messages": len(messages),
                               "tools": [t["function"]["name"] for t in body.get("tools") or []],
                               "roles": [m["role"] for m in messages]})
            answer = next(a for match, k, a in RULES if match in text and (k is None or k == turns))
            message = {"role": "assistant", "content": answer.get("content"), **({"tool_calls": answer["tool_calls"]}
                                                                                 if "tool_calls" in answer else {})}
            return JSONResponse({"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": 0,
                                 "model": body["model"], "choices": [{
                                     "index": 0, "message": message, "logprobs": None,
                                     "finish_reason": "tool_calls" if "tool_calls" in answer else "stop"}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        @app.post("/rollouts/{rid}/{action}")
        async def rollout_action(rid: str, action: str, request: Request) -> Response:
            """``session_url`` (``sql``) and ``complete_url`` (``complete``): ``{"sql"}`` on a running rollout."""
            if action not in ("sql", "complete"):
                return JSONResponse({"error": {"message": f"no route {action}"}}, status_code=404)
            r, body = await running(rid, request)
            if r is None:
                return body
            body, status = (self.session_sql if action == "sql" else self.complete)(r, body["sql"])
            return JSONResponse(body, status_code=status)

        return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A uvicorn server for an app on a thread, on loopback; ``started`` is an event, not a sleep."""

    def __init__(self, make_app) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(make_app(self.url), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "Served":
        self.thread.start()
        while not self.server.started:  # set by uvicorn once it listens
            if not self.thread.is_alive():
                raise RuntimeError("the fake gateway did not start")
            self.thread.join(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join()
