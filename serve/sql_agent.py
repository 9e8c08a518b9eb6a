"""The server-side SQL agent of a served model: ``/v1/sql/debug`` (Talon) and ``/v1/sql/generate``
(Zeno), on the model's async engine, without Ray.

- ``SQL_BODIES``: the request bodies (pydantic; unknown fields are a 400 -- a client names a
  database, never a path or DSN).
- ``SQLAgent.sql(kind, body)``: the multi-turn agent (``AgentLoop.arun``, one coroutine per
  trajectory on the same engine as chat) on the named database from the config, each trajectory
  in its own fresh session (discarded afterwards); ``samples: k`` runs k trajectories, trajectory
  ``i``'s turn ``t`` seeded ``turn_seed(seed, i, t)`` (k different samples), and votes over result
  sets (``sqlrl.eval.vote``, the infer job's rule). Returns the final SQL, a capped preview of its
  result (on another fresh session), the trajectories and timings. Cancelling it aborts its
  generations in the engine (the loop cancels its engine requests).

Guarantees: ``max_tokens``/``samples``/turns were clamped by the ingress and are clamped again
here; SQL runs under the session layer's limits (``sql_timeout_s``, ``sql_max_rows``) and
sandbox; one request's sessions are never shared, and are closed whatever happens (a cancel
included). Sessions are opened, queried and closed in worker threads (the event loop never
blocks on SQL).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field

from sqlrl.agent import DebugRequest, GenerateRequest, LocalSessions, LoopConfig
from sqlrl.agent.loop import AgentLoop
from sqlrl.db.dialects.descriptor import dialect_of
from sqlrl.db.source import SessionRequest
from sqlrl.db.types import Limits
from sqlrl.db.url import dialect_name, parse_url
from sqlrl.eval.vote import vote
from sqlrl.policy.engine import AsyncEngine
from sqlrl.policy.types import SamplingParams
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tasks.types import TaskError

from .config import LimitsSpec, ServeConfig
from .limits import clamp
from .openai_chat import APIError


class SQLBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    database: str = Field(min_length=1)
    dialect: str | None = None
    samples: int = Field(1, ge=1)
    max_turns: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    seed: int | None = None


class DebugBody(SQLBody):
    issue_sql: str | list[str]
    problem: str = Field(min_length=1)


class GenerateBody(SQLBody):
    question: str = Field(min_length=1)
    evidence: str = ""


SQL_BODIES: dict[str, type[SQLBody]] = {"debug": DebugBody, "generate": GenerateBody}


def load_databases(config: ServeConfig) -> tuple[dict[str, dict[str, str]], dict[str, DatabaseSchema]]:
    """``{name: {dialect: url}}`` and the schemas that can be read (SQLite files: a file-based
    engine's database, or ``schema_sqlite``)."""
    catalog, schemas = {}, {}
    for name, spec in config.databases.items():
        url = parse_url(spec.url)
        dialect = dialect_name(url)
        catalog[name] = {dialect: spec.url}
        source = spec.schema_sqlite or (url.database if dialect_of(dialect).file_based else None)
        if source:
            schemas[name] = DatabaseSchema.from_sqlite(source, db_id=name)
    return catalog, schemas


def trajectory_view(t: Any) -> dict[str, Any]:
    """The trajectory as a client reads it: per turn the assistant text, its tool call, the
    observation it got, timings."""
    msgs = [m for m in t.messages if m.get("role") in ("assistant", "tool")]
    turns, k = [], 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        nxt = msgs[i + 1] if i + 1 < len(msgs) and msgs[i + 1]["role"] == "tool" else None
        call = (m.get("tool_calls") or [None])[0]
        timing = t.turns[k] if k < len(t.turns) else None
        k += 1
        turns.append({"assistant": m.get("content") or "",
                      "tool_call": call["function"] if call else None,
                      "observation": nxt["content"] if nxt else None,
                      "error": timing.error if timing else None,
                      "gen_ms": timing.gen_ms if timing else None,
                      "tool_ms": timing.tool_ms if timing else None})
    return {"stop_reason": t.stop_reason, "error": t.error, "submitted_sql": t.submitted_sql,
            "n_turns": len(t.turns), "n_tool_calls": t.n_tool_calls,
            "n_tool_errors": t.n_tool_errors, "n_malformed": t.n_malformed,
            "generated_tokens": t.n_generated, "turns": turns}


class SQLAgent:
    def __init__(self, name: str, engine: AsyncEngine, chat_format: Any, config: ServeConfig,
                 schema_style: str | None = None) -> None:
        """``schema_style``: how agent prompts render the schema -- the style the checkpoint
        records (``sqlrl.agent.prompts.checkpoint_schema_style``), so it is prompted as trained."""
        self.name, self.engine, self.chat_format = name, engine, chat_format
        self.limits: LimitsSpec = config.limits
        self.catalog, self.schemas = load_databases(config)
        self.sessions = LocalSessions(self.catalog, Limits(timeout_s=self.limits.sql_timeout_s,
                                                           max_rows=self.limits.sql_max_rows))
        self.loop = LoopConfig(max_turns=self.limits.max_turns,
                               max_total_tokens=self.limits.max_total_tokens,
                               sampling=SamplingParams(max_new_tokens=self.limits.default_max_tokens,
                                                       temperature=0.0),
                               schema_style=schema_style)

    def make_request(self, kind: str, body: SQLBody) -> Any:
        urls = self.catalog.get(body.database)
        if not urls:
            raise APIError(404, f"unknown database {body.database!r}; this server has: "
                           f"{', '.join(sorted(self.catalog)) or 'none'}", param="database",
                           code="database_not_found")
        dialect = next(iter(urls))
        try:
            if body.dialect is not None and body.dialect not in urls:
                from sqlrl.tasks.types import norm_dialect

                if norm_dialect(body.dialect) not in urls:
                    raise APIError(400, f"database {body.database!r} is {dialect}, not "
                                   f"{body.dialect}", param="dialect")
            rid = f"sql-{uuid.uuid4().hex[:16]}"
            if kind == "debug":
                assert isinstance(body, DebugBody)
                return DebugRequest(rid, body.database, body.problem, tuple(
                    [body.issue_sql] if isinstance(body.issue_sql, str) else body.issue_sql),
                    dialect=dialect)
            assert isinstance(body, GenerateBody)
            return GenerateRequest(rid, body.database, body.question, dialect=dialect,
                                   evidence=body.evidence)
        except TaskError as exc:
            raise APIError(400, str(exc), param="issue_sql" if "issue_sql" in str(exc) else None) from None

    async def run_agent(self, items: Sequence[Any], loop: LoopConfig) -> list[Any]:
        """The agent over ``items`` (requests of one database) on this model's engine, each on its
        own fresh session, closed afterwards whatever happens (a cancel included)."""
        try:
            sessions = await asyncio.to_thread(self.sessions.open_many, [
                SessionRequest(t.db_id, t.dialect, tuple(t.preprocess_sql), key=f"{t.request_id}/{i}")
                for i, t in enumerate(items)])
        except Exception as exc:
            raise APIError(503, f"could not open a session on the database: {exc}",
                           code="database_unavailable") from None
        try:
            schemas = [t.schema or self.schemas.get(t.db_id) for t in items]
            return await AgentLoop(items, sessions, self.engine, self.chat_format, loop,
                                   schemas=schemas).arun()
        finally:
            await asyncio.shield(asyncio.to_thread(self.sessions.close_many, sessions))

    async def sql(self, kind: str, body: SQLBody) -> dict[str, Any]:
        t0 = time.perf_counter()
        request = self.make_request(kind, body)
        k = clamp(body.samples, self.limits.max_samples)
        temperature = body.temperature if body.temperature is not None else (0.8 if k > 1 else 0.0)
        sampling = SamplingParams(temperature=temperature, seed=body.seed,
                                  max_new_tokens=clamp(body.max_tokens, self.limits.max_tokens,
                                                       self.limits.default_max_tokens))
        loop = replace(self.loop, sampling=sampling, max_turns=clamp(body.max_turns, self.limits.max_turns))
        trajectories = await self.run_agent([request] * k, loop)
        t1 = time.perf_counter()
        out = await asyncio.to_thread(self._answer, request, trajectories)
        t2 = time.perf_counter()
        return {"id": request.request_id, "object": f"sql.{kind}", "model": self.name,
                "database": request.db_id, "dialect": request.dialect, **out,
                "trajectories": [trajectory_view(t) for t in trajectories],
                "timings": {"agent_ms": (t1 - t0) * 1000.0, "result_ms": (t2 - t1) * 1000.0,
                            "total_ms": (t2 - t0) * 1000.0,
                            "gen_ms": sum(x.gen_ms for t in trajectories for x in t.turns),
                            "tool_ms": sum(x.tool_ms for t in trajectories for x in t.turns)},
                "usage": {"generated_tokens": sum(t.n_generated for t in trajectories),
                          "turns": sum(len(t.turns) for t in trajectories),
                          "tool_calls": sum(t.n_tool_calls for t in trajectories)}}

    def _answer(self, request: Any, trajectories: Sequence[Any]) -> dict[str, Any]:
        """The voted SQL and its result preview (sync: runs in a worker thread)."""
        url = self.sessions.url(request.db_id, request.dialect)

        def execute(sql: str) -> Any:
            from sqlrl.db import open_session

            with open_session(url, limits=self.sessions.limits) as s:
                return s.execute(sql)

        candidates = [t.submitted_sql for t in trajectories]
        chosen: dict[str, Any] | None = None
        if len(trajectories) > 1:
            lps = [sum(t.old_logprobs) / t.n_generated if t.n_generated else None for t in trajectories]
            v = vote(candidates, execute, logprobs=lps)
            final, index = v.sql, v.index
            chosen = {"index": v.index, "votes": v.votes, "groups": v.groups, "failed": v.failed,
                      "unanimous_failure": v.unanimous_failure}
        else:
            final, index = candidates[0], 0
        preview = None
        if final:
            r = execute(final)
            n = self.limits.preview_rows
            preview = {"columns": list(r.columns), "rows": [list(row) for row in r.rows[:n]],
                       "row_count": r.row_count, "truncated": bool(r.truncated or len(r.rows) > n),
                       "error": None if r.error is None else {"kind": str(r.error.kind.value),
                                                              "message": r.error.message}}
        return {"sql": final, "result": preview, "chosen": index, "vote": chosen}
