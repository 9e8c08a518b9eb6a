"""The Ray-free serving core: unlabelled requests through the Agent factory, OpenAI chat
semantics (tool calls, tool_choice, stop, errors), API keys and the rate limiter."""

from __future__ import annotations

import json

import pytest

from serve.limits import Admission, RateLimiter, check_api_key, clamp
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


def test_admission_refuses_beyond_the_limit_and_frees_slots():
    adm = Admission({"m": 2, "free": None})
    first = adm.enter("m")
    adm.enter("m")
    with pytest.raises(APIError) as err:
        adm.enter("m")
    assert err.value.status == 503 and err.value.body()["error"]["code"] == "queue_full"
    assert adm.inflight["m"] == 2  # a refusal takes no slot
    first()
    first()  # a second release of the same request frees nothing more
    assert adm.inflight["m"] == 1
    adm.enter("m")  # the slot given back is usable again
    with pytest.raises(APIError):
        adm.enter("m")
    for _ in range(100):
        adm.enter("free")  # no limit configured
    assert adm.inflight == {"m": 2, "free": 100}


class _FakeStream:
    """What ``handle.options(stream=True).chat_stream.remote`` returns: the replica's items."""

    def __init__(self, items):
        self.items, self.cancelled = list(items), False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    def cancel(self):
        self.cancelled = True


class _FakeHandle:
    def __init__(self, items):
        self.items = items

    def options(self, **_):
        return self

    @property
    def chat_stream(self):
        return self

    def remote(self, data):
        return _FakeStream(self.items)


def test_a_stream_holds_its_admission_until_its_body_ends_or_is_dropped():
    import asyncio
    import gc
    import types

    from serve.app import Ingress

    cls = Ingress.func_or_class  # the class under Serve's ingress wrapper
    ing = types.SimpleNamespace(admission=Admission({"m": 1}))
    ing._call = lambda aw, cancel, deadline: cls._call(ing, aw, cancel, deadline)
    items = [("ok", 200, None), {"choices": [{"delta": {"content": "hi"}}]}]

    async def main():
        # streamed to the end: the slot is held while the body runs, then given back
        resp = await cls._stream(ing, "m", _FakeHandle(items), {}, deadline=1e18)
        assert ing.admission.inflight["m"] == 1
        with pytest.raises(APIError):  # the model is full while the stream is open
            ing.admission.enter("m")
        body = [part async for part in resp.body_iterator]
        assert body[-1] == "data: [DONE]\n\n" and ing.admission.inflight["m"] == 0
        # the client went away before the body started: freed when the response is collected
        resp = await cls._stream(ing, "m", _FakeHandle(items), {}, deadline=1e18)
        assert ing.admission.inflight["m"] == 1
        del resp
        gc.collect()
        assert ing.admission.inflight["m"] == 0
        # an error before the first token: a plain error, and the slot given back at once
        bad = [("error", 400, {"error": {"message": "too long", "param": None, "code": None}})]
        with pytest.raises(APIError):
            await cls._stream(ing, "m", _FakeHandle(bad), {}, deadline=1e18)
        assert ing.admission.inflight["m"] == 0

    asyncio.run(main())


@pytest.mark.parametrize("style", ["compact", "create"])
def test_a_served_model_is_prompted_with_the_schema_style_its_checkpoint_records(tiny, tmp_path, style):
    from serve.config import load_serve_config
    import asyncio

    from serve.engine import ModelEngine
    from sqlrl.agent.prompts import checkpoint_schema_style, record_schema_style
    from sqlrl.policy.backends import make_engine
    from sqlrl.tasks.demo_db import build_demo_database

    db = tmp_path / "shop.sqlite"
    build_demo_database(str(db))
    record_schema_style(tmp_path, style)  # what the curriculum writes next to the weights
    config = load_serve_config({"models": {"t": {"policy": {"model": str(tmp_path)}}},
                                "databases": {"shop": {"url": f"sqlite:///{db}"}}})
    script = [{"match": "How many customers", "turns": [call("submit_solution", "SELECT count(*) FROM customers")]}]
    engine = ModelEngine("t", tiny, make_engine("scripted", tiny, script=script), config,
                         schema_style=checkpoint_schema_style(tmp_path))  # as ModelServer does
    agent = engine.agent
    (t,) = asyncio.run(agent.run_agent([GenerateRequest("r", "shop", "How many customers?")], agent.loop))
    system = t.messages[0]["content"]
    assert t.stop_reason == "submitted"
    assert ("CREATE TABLE" in system) == (style == "create") and ("PK = primary key" in system) == (style == "compact")


def test_the_ingress_cancels_the_replica_stream_when_the_client_goes_away():
    """A dropped client (the body iterator closed mid-stream) cancels the replica's stream, which
    aborts its engine requests; a stream read to its end, or ended by an error item, is not."""
    import asyncio
    import types

    from serve.app import Ingress

    cls = Ingress.func_or_class
    ing = types.SimpleNamespace(admission=Admission({"m": None}))
    ing._call = lambda aw, cancel, deadline: cls._call(ing, aw, cancel, deadline)
    chunk = {"choices": [{"delta": {"content": "hi"}}]}

    async def main():
        handle = _FakeHandle([("ok", 200, None), chunk, chunk, chunk])
        stream = handle.remote(None)
        handle.remote = lambda data: stream
        resp = await cls._stream(ing, "m", handle, {}, deadline=1e18)
        body = resp.body_iterator
        assert json.loads((await anext(body)).removeprefix("data: ")) == chunk
        await body.aclose()  # the client went away
        assert stream.cancelled and ing.admission.inflight["m"] == 0
        timeout = ("error", 504, {"error": {"message": "late", "type": "timeout", "param": None, "code": "timeout"}})
        handle = _FakeHandle([("ok", 200, None), chunk, timeout, chunk])
        stream = handle.remote(None)
        handle.remote = lambda data: stream
        parts = [p async for p in (await cls._stream(ing, "m", handle, {}, deadline=1e18)).body_iterator]
        assert json.loads(parts[1].removeprefix("data: "))["error"]["code"] == "timeout"
        assert parts[2:] == ["data: [DONE]\n\n"] and not stream.cancelled

    asyncio.run(main())
