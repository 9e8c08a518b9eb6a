"""The Ray-free serving core: unlabelled requests through the Agent factory, OpenAI chat
semantics (tool calls, tool_choice, stop, errors), API keys and the rate limiter."""

from __future__ import annotations

import json

import pytest

from serve.limits import RateLimiter, check_api_key, clamp
from serve.openai_chat import APIError, ChatRequest, prepare
from sqlrl.agent import (Agent, DebugRequest, GenerateRequest, LocalSessions, LoopConfig,
                         request_from_task)
from sqlrl.agent.prompts import build_messages
from sqlrl.tasks.types import CriticTask, TaskError, Text2SQLTask

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def test_requests_need_no_gold_and_prompt_like_their_tasks():
    t = Text2SQLTask(task_id="t1", db_id="shop", question="How many?", gold_sql="SELECT 1",
                     evidence="e")
    c = CriticTask(instance_id="c1", db_id="shop", query="fix it", issue_sql=("SELECT x",),
                   sol_sql=("SELECT 1",))
    for task in (t, c):
        req = request_from_task(task)
        assert not hasattr(req, "gold_sql") and not hasattr(req, "sol_sql")
        assert build_messages(req, None) == build_messages(task, None)
    with pytest.raises(TaskError, match="issue_sql"):
        DebugRequest("r", "shop", "fix", ())
    with pytest.raises(TaskError, match="dialect"):
        GenerateRequest("r", "shop", "q", dialect="nosql")
    assert GenerateRequest("r", "shop", "q", dialect="postgres").dialect == "postgresql"


@pytest.fixture(scope="module")
def tiny():
    from sqlrl.policy.load import load_policy

    return load_policy("tiny")


def call(name: str, sql: str) -> str:
    return "ok\n<tool_call>\n" + json.dumps({"name": name, "arguments": {"sql": sql}}) + "\n</tool_call>"


def test_agent_factory_runs_unlabelled_requests_on_fresh_sessions(tiny, tmp_path):
    from sqlrl.agent.chat_format import HFChatFormat
    from sqlrl.policy.backends import make_backend
    from sqlrl.tasks.demo_db import build_demo_database

    db = tmp_path / "shop.sqlite"
    build_demo_database(str(db))
    script = [{"match": "How many customers", "turns": [
        call("execute_sql", "CREATE TABLE mine AS SELECT 1 AS x"),
        call("execute_sql", "SELECT count(*) FROM mine"),
        call("submit_solution", "SELECT count(*) FROM customers")]}]
    backend = make_backend("scripted", tiny, script=script)
    agent = Agent(tiny, backend, HFChatFormat(tiny.tokenizer), LoopConfig(max_turns=4),
                  LocalSessions({"shop": {"sqlite": f"sqlite:///{db}"}}))
    reqs = [GenerateRequest(f"r{i}", "shop", "How many customers?") for i in range(2)]
    out = agent.run(reqs)
    assert [t.stop_reason for t in out] == ["submitted", "submitted"]
    assert backend.calls == [2, 2, 2]  # both requests in one generation call per round
    assert all(t.n_tool_errors == 0 for t in out)  # each made `mine` in its own session
    bad = agent.run([GenerateRequest("x", "nope", "q")])
    assert bad[0].stop_reason == "error" and "unknown database" in bad[0].error


def test_prepare_tool_choice_and_messages():
    req = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                      tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert prepare(req).prefix.startswith('<tool_call>\n{"name": "get_weather"')
    assert prepare(ChatRequest(model="m", messages=[{"role": "user", "content": "x"}],
                               tools=TOOLS, tool_choice="none")).tools is None
    for choice, param in [("required", "tool_choice"), ("sometimes", "tool_choice")]:
        with pytest.raises(APIError) as e:
            prepare(ChatRequest(model="m", messages=[{"role": "user", "content": "x"}],
                                tool_choice=choice))
        assert e.value.status == 400 and e.value.param == param
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "P"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    p = prepare(ChatRequest(model="m", messages=msgs, tools=TOOLS, stop="END"))
    assert p.messages[0]["content"] == "ab"
    assert p.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "P"}
    assert p.stop == ("END",)


def test_api_keys_rate_limit_and_clamps():
    keys = frozenset({"k1"})
    assert check_api_key("Bearer k1", keys) == "k1"
    for header in (None, "k1", "Bearer ", "Bearer k2", "Basic k1"):
        with pytest.raises(APIError) as e:
            check_api_key(header, keys)
        assert e.value.status == 401
    assert check_api_key(None, keys, required=False) == "anonymous"
    now = [0.0]
    rl = RateLimiter(per_minute=60, burst=2, clock=lambda: now[0])
    rl.take("a"), rl.take("a")
    with pytest.raises(APIError) as e:
        rl.take("a")
    assert e.value.status == 429 and e.value.headers["Retry-After"] == "1"
    rl.take("b")  # per key
    now[0] += 1.0
    rl.take("a")
    assert clamp(10_000, 512) == 512 and clamp(None, 512, 64) == 64 and clamp(0, 8) == 1
