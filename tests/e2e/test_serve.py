"""The serve app on a real Ray Serve (private local cluster, loopback HTTP), called with the
official ``openai`` client and raw HTTP.

Models: ``tiny`` (the random-init tiny model's checkpoint folder on the HF backend: real
generation, batching),
``smol`` (SmolLM2-135M: a real instruct model, chat and the SQL agent), ``script`` (the scripted
backend over the tiny tokenizer: deterministic tool calls and SQL agents, serving as Talon and
Zeno), ``gated`` (scripted, waits for a gate file: holds requests in flight so queue limits are
checked by events, never by wall time), ``trickle`` (scripted, stops after three tokens until its
gate opens: streaming is shown token by token by an event, not a clock; a dropped client is shown
to free its sequence in the engine) and ``merge`` (scripted, holds prompts with "LONG" after two
tokens: a request that arrives meanwhile joins the running engine and finishes first). Every
model replica runs ONE async engine (serve/engines.py); ``stats`` reads the requests inside the
replica and the sequences its engine holds. The gated model admits 8 requests at once (room for
the test's own ``stats`` calls). A second application (``/short``) has a 3 s end-to-end timeout
and a model that never answers prompts with "LONG": the 504 path, after which the engine holds
nothing and a short request is answered. Databases: a generated SQLite ``shop`` and, with the
servers of scripts/dbservers.sh, the same data loaded into sealed PostgreSQL and MariaDB bases.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

# The module fixture starts three applications with six model deployments (SmolLM2 among them) on a
# private Ray: one SmolLM2 replica took 265 s to start on a loaded 2-core machine, past the
# suite-wide 300 s hang guard that the first test's set-up counts against. A hang guard, not a
# time assertion.
pytestmark = pytest.mark.timeout(900)

KEYS = ["k-main", "k-chat", "k-stream", "k-sql", "k-burst", "k-queue", "k-rate", "k-bad"]


def tc(name: str, args: dict) -> str:
    return f"Let me check.\n<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def sql_call(name: str, sql: str) -> str:
    return tc(name, {"sql": sql})


SCRIPT = [
    {"match": "weather", "turns": [tc("get_weather", {"city": "Paris"}), "It is sunny in Paris."]},
    {"match": "How many customers", "turns": [
        sql_call("execute_sql", "SELECT count(*) FROM customers"),
        sql_call("submit_solution", "SELECT count(*) FROM customers")]},
    {"match": "HOSTILE", "turns": [
        sql_call("execute_sql", "ATTACH DATABASE '/tmp/sqlrl-evil.db' AS evil"),
        sql_call("execute_sql", "DROP TABLE customers"),
        sql_call("submit_solution", "DELETE FROM orders")]},
    {"match": "ESCAPE THE SERVER", "turns": [
        sql_call("execute_sql", "SELECT pg_read_file('/etc/hostname')"),
        sql_call("execute_sql", "SELECT LOAD_FILE('/etc/hostname')"),
        sql_call("execute_sql", "DROP TABLE customers"),
        sql_call("submit_solution", "SELECT count(*) FROM customers")]},
    {"match": "SELECT nme FROM customers", "turns": [
        sql_call("execute_sql", "SELECT nme FROM customers LIMIT 1"),
        sql_call("submit_solution", "SELECT name FROM customers ORDER BY customer_id LIMIT 3")]},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    from serve.app import build_app
    from sqlrl.policy.load import tiny_path
    from sqlrl.tasks.demo_db import build_demo_database

    tmp = Path(tempfile.mkdtemp(prefix="sqlrl-serve-"))
    db = tmp / "shop.sqlite"
    build_demo_database(str(db))
    gate, trickle = tmp / "gate", tmp / "trickle-gate"
    databases = {"shop": {"url": f"sqlite:///{db}"}}
    servers = {}  # dialect -> admin URL of the servers this run has
    for dialect, var in (("postgresql", "SQLRL_PG_ADMIN_URL"), ("mysql", "SQLRL_MYSQL_ADMIN_URL")):
        if os.environ.get(var):
            from sqlrl.db.provisioning import provision
            from sqlrl.db.provisioning.loader import load_sqlite

            provision.prepare_server(os.environ[var])
            report = load_sqlite(str(db), os.environ[var], "sqlrl_serve_shop", replace=True)
            databases[f"shop_{dialect}"] = {"url": report.session_url, "schema_sqlite": str(db)}
            servers[dialect] = os.environ[var]
    args = {
        "models": {
            # a checkpoint folder (HF weights + the tool chat template), as the curriculum writes
            "tiny": {"policy": {"model": str(tiny_path()), "backend": "hf"}, "max_batch_size": 16,
                     "max_ongoing_requests": 32,
                     "num_cpus": 0.1},
            "smol": {"policy": {"model": "smollm2-135m", "backend": "hf"}, "num_cpus": 0.1, "torch_threads": 2},
            "script": {"policy": {"model": "tiny", "backend": "scripted", "engine_options": {"script": SCRIPT}},
                       "num_cpus": 0.1},
            "gated": {"policy": {"model": "tiny", "backend": "scripted",
                                 "engine_options": {"script": SCRIPT, "gate_file": str(gate)}},
                      "num_cpus": 0.1, "max_batch_size": 4, "max_ongoing_requests": 8, "max_queued_requests": 2},
            "trickle": {"policy": {"model": "tiny", "backend": "scripted", "engine_options": {
                "script": SCRIPT, "gate_file": str(trickle), "gate_after_tokens": 3}}, "num_cpus": 0.1},
            "merge": {"policy": {"model": "tiny", "backend": "scripted", "engine_options": {
                          "script": SCRIPT, "gate_file": str(tmp / "merge-gate"), "gate_after_tokens": 2,
                          "gate_match": "LONG"}},
                      "num_cpus": 0.1, "max_batch_size": 8, "max_ongoing_requests": 8},
        },
        "databases": databases,
        "sql_models": {"debug": "script", "generate": "script"},
        "limits": {"max_body_bytes": 100_000, "max_tokens": 96, "default_max_tokens": 64,
                   "max_n": 2, "max_samples": 3, "max_turns": 4, "rate_limit_per_minute": 1.0,
                   "rate_limit_burst": 40, "request_timeout_s": 120.0},
        "auth": {"api_keys": KEYS},
    }
    short = {"models": {"stuck": {"policy": {"model": "tiny", "backend": "scripted", "engine_options": {
                 "gate_file": str(tmp / "never"), "gate_match": "LONG"}}, "num_cpus": 0.1}},
             "databases": {"shop": {"url": f"sqlite:///{db}"}},
             "sql_models": {"debug": "stuck", "generate": "stuck"},
             "limits": {"request_timeout_s": 3.0}, "auth": {"api_keys": KEYS}}
    colo = {"models": {"script": {"policy": {"model": "tiny", "backend": "scripted",
                                             "engine_options": {"script": SCRIPT}}}},
            "databases": {"shop": {"url": f"sqlite:///{db}"}}, "colocate": True,
            "sql_models": {"debug": "script", "generate": "script"}, "auth": {"api_keys": KEYS}}
    if ray.is_initialized():  # another module's cluster (tests/actors' session one): this module
        ray.shutdown()        # starts its own, private one, and shuts it down at the end
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             namespace="sqlrl-serve-tests", _temp_dir=f"/tmp/sqlrl-srv-{os.getpid()}")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(args, (4.0, 0.0)), name="sqlrl", route_prefix="/")
    serve.run(build_app(short, (4.0, 0.0)), name="short", route_prefix="/short")
    serve.run(build_app(colo, (4.0, 0.0)), name="colo", route_prefix="/colo")
    yield {"url": f"http://127.0.0.1:{port}", "db": db, "gate": gate, "trickle": trickle,
           "merge_gate": tmp / "merge-gate",
           "serve": serve, "servers": servers}
    serve.shutdown()
    ray.shutdown()
    for admin_url in servers.values():
        from sqlrl.db.provisioning import provision

        provision.drop_database(admin_url, "sqlrl_serve_shop")


def client(server, key: str = "k-main", **kw) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key=key, max_retries=0, **kw)


def post(server, path: str, body, key: str | None = "k-main", **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, (bytes, str)):
        return httpx.post(server["url"] + path, content=body, headers={
            **headers, "Content-Type": "application/json"}, timeout=120, **kw)
    return httpx.post(server["url"] + path, json=body, headers=headers, timeout=120, **kw)


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    return err


def stats(server, model: str, app: str = "sqlrl") -> dict:
    h = server["serve"].get_deployment_handle(f"model-{model}", app_name=app)
    return h.stats.remote().result()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- OpenAI endpoints ---------------------------------------------------------------------------

def test_models_listing(server):
    models = client(server).models.list()
    assert sorted(m.id for m in models.data) == ["gated", "merge", "script", "smol", "tiny", "trickle"]


def test_chat_completion_on_the_tiny_model(server):
    r = client(server, "k-chat").chat.completions.create(
        model="tiny", messages=[{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "How many orders are there?"}],
        max_tokens=10_000, n=2, temperature=0.7, top_p=0.9, seed=3, stop=["\n\n"])
    assert r.object == "chat.completion" and len(r.choices) == 2
    assert all(c.message.role == "assistant" and c.finish_reason in ("stop", "length")
               for c in r.choices)
    assert 0 < r.usage.completion_tokens <= 2 * 96  # max_tokens clamped to the configured 96
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_tool_call_round_trip(server):
    c = client(server, "k-chat")
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = c.chat.completions.create(model="script", messages=messages, tools=tools, tool_choice="auto")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'}]
    r2 = c.chat.completions.create(model="script", messages=messages, tools=tools)
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.content == "It is sunny in Paris."
    assert not r2.choices[0].message.tool_calls


def test_tool_choice_none_and_named(server):
    c = client(server, "k-chat")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    msgs = [{"role": "user", "content": "weather please"}]
    # named: the prompt forces the call's opening and a grammar the rest; cut by max_tokens before
    # the call closes, it comes back as text. One token always cuts it, whatever the BPE merges:
    # `</tool_call>` is an added token, never merged, so closing takes it plus at least one token
    # of arguments (at 4 tokens a sampled `{}` closed the call in about 1 of 400 draws: stop 57)
    r = c.chat.completions.create(model="tiny", messages=msgs, tools=tools, max_tokens=1,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls
    assert r.choices[0].message.content.startswith('<tool_call>\n{"name": "get_weather"')
    # with room to finish (96 tokens: even one character per token fits), the random-weight tiny
    # model's forced calls are valid under the schema
    city = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
    bounded = [{"type": "function", "function": {"name": "get_weather", "parameters": city}}]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = c.chat.completions.create(model="tiny", messages=msgs, tools=bounded, max_tokens=96, n=2, seed=5,
                                      temperature=1.0, tool_choice=choice)
        for ch in r.choices:
            assert ch.finish_reason == "tool_calls"
            assert json.loads(ch.message.tool_calls[0].function.arguments)["city"] in ("Paris", "Rome")
    r = c.chat.completions.create(model="script", messages=msgs, tools=tools, tool_choice="none")
    assert r.choices[0].finish_reason == "stop"  # no tools given to the template or the parser


def test_streaming(server):
    c = client(server, "k-stream")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    stream = c.chat.completions.create(model="script", stream=True, tools=tools,
                                       stream_options={"include_usage": True},
                                       messages=[{"role": "user", "content": "weather in Paris"}])
    name, args, reasons, usage = "", "", [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            for tcall in ch.delta.tool_calls or []:
                name += tcall.function.name or ""
                args += tcall.function.arguments or ""
            if ch.finish_reason:
                reasons.append(ch.finish_reason)
    assert name == "get_weather" and json.loads(args) == {"city": "Paris"}
    assert reasons == ["tool_calls"] and usage.completion_tokens > 0
    stream = c.chat.completions.create(model="tiny", stream=True, max_tokens=6,
                                       messages=[{"role": "user", "content": "hello"}])
    text = "".join(ch.delta.content or "" for chunk in stream for ch in chunk.choices)
    assert isinstance(text, str)
    raw = post(server, "/v1/chat/completions", {"model": "script", "stream": True,
               "messages": [{"role": "user", "content": "weather"}]}, "k-stream")
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_streaming_is_token_by_token_and_matches_the_full_answer(server):
    """The trickle model stops after three tokens until its gate opens: content that arrives while
    the gate is shut was sent before the generation finished."""
    server["trickle"].unlink(missing_ok=True)
    c = client(server, "k-stream")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    msgs = [{"role": "user", "content": "weather in Paris"}]
    stream = c.chat.completions.create(model="trickle", stream=True, tools=tools, messages=msgs)
    chunks = iter(stream)
    early = ""
    for chunk in chunks:  # until the first content: the generation is still held by the gate
        early += "".join(ch.delta.content or "" for ch in chunk.choices)
        if early:
            break
    assert early and not server["trickle"].exists()
    assert "Let me check.".startswith(early)  # part of the turn, not the whole of it
    server["trickle"].touch()
    content, calls, reasons = early, {}, []
    for chunk in chunks:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for t in ch.delta.tool_calls or []:
                calls.setdefault(t.index, {"name": "", "arguments": "", "id": None})
                calls[t.index]["name"] += t.function.name or ""
                calls[t.index]["arguments"] += t.function.arguments or ""
                calls[t.index]["id"] = calls[t.index]["id"] or t.id
            reasons += [ch.finish_reason] if ch.finish_reason else []
    full = c.chat.completions.create(model="trickle", tools=tools, messages=msgs).choices[0]
    assert content == full.message.content == "Let me check." and reasons == [full.finish_reason]
    assert [(v["name"], json.loads(v["arguments"])) for v in calls.values()] == [
        (t.function.name, json.loads(t.function.arguments)) for t in full.message.tool_calls]
    assert calls[0]["id"].startswith("call_")


def test_colocated_models_answer_the_same_api(server):
    """colocate: the ingress replica holds the model (no deployment handle): chat with a tool call,
    a stream, and a server-side SQL agent answer as they do behind a model deployment."""
    c = openai.OpenAI(base_url=server["url"] + "/colo/v1", api_key="k-chat", max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    msgs = [{"role": "user", "content": "weather in Paris"}]
    call = c.chat.completions.create(model="script", messages=msgs, tools=tools).choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    streamed = "".join(ch.delta.content or "" for chunk in c.chat.completions.create(
        model="script", messages=msgs, tools=tools, stream=True) for ch in chunk.choices)
    assert streamed == "Let me check."
    r = post(server, "/colo/v1/sql/generate", {"database": "shop", "question": "How many customers?"}, "k-sql")
    assert r.status_code == 200 and r.json()["result"]["rows"] == [[60]], r.text
    assert_openai_error(post(server, "/colo/v1/chat/completions", {"model": "nope", "messages": msgs}, "k-bad"), 404)


def test_stream_errors_before_the_first_token_are_plain_errors(server):
    r = post(server, "/v1/chat/completions", {"model": "tiny", "stream": True, "max_tokens": 5,
             "messages": [{"role": "user", "content": "x " * 34000}]}, "k-bad")
    err = assert_openai_error(r, 400)  # longer than the tiny model's 32768 positions
    assert err["code"] == "context_length_exceeded"


def test_end_to_end_timeout_gives_504_and_aborts_the_work_in_the_engine(server):
    """Each timed-out request is aborted in the engine (it holds no sequence afterwards), so the
    short request after it is answered instead of waiting behind abandoned work."""
    msgs = [{"role": "user", "content": "LONG hello"}]
    for path, body in (("/short/v1/chat/completions", {"model": "stuck", "messages": msgs}),
                       ("/short/v1/chat/completions", {"model": "stuck", "messages": msgs, "stream": True}),
                       ("/short/v1/sql/generate", {"database": "shop", "question": "LONG How many?",
                                                    "samples": 3})):
        err = assert_openai_error(post(server, path, body, "k-bad"), 504)
        assert err["code"] == "timeout" and err["type"] == "timeout"
        wait_for(lambda: stats(server, "stuck", "short")["running"] == 0, "the engine freed the timed-out work")
        r = post(server, "/short/v1/chat/completions", {"model": "stuck", "messages": [
            {"role": "user", "content": "hi"}]}, "k-bad")
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text


# -- SQL endpoints ------------------------------------------------------------------------------

def test_sql_generate(server):
    r = post(server, "/v1/sql/generate", {"database": "shop", "question": "How many customers are there?"},
             "k-sql")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["sql"] == "SELECT count(*) FROM customers" and out["dialect"] == "sqlite"
    assert out["result"]["rows"] == [[60]] and out["result"]["error"] is None
    t = out["trajectories"][0]
    assert t["stop_reason"] == "submitted" and t["n_tool_calls"] == 2
    assert t["turns"][0]["tool_call"]["name"] == "execute_sql" and "60" in t["turns"][0]["observation"]
    assert out["timings"]["total_ms"] >= out["timings"]["agent_ms"] > 0


def test_sql_debug_with_self_consistency(server):
    r = post(server, "/v1/sql/debug", {"database": "shop", "issue_sql": "SELECT nme FROM customers",
                                       "problem": "I want the first three customer names.",
                                       "samples": 50}, "k-sql")
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["trajectories"]) == 3  # samples clamped to max_samples
    assert out["vote"]["votes"] == 3 and out["vote"]["groups"] == 1
    assert out["sql"].startswith("SELECT name FROM customers") and len(out["result"]["rows"]) == 3
    first = out["trajectories"][0]["turns"][0]
    assert first["error"] and "nme" in first["observation"]


def test_hostile_sql_is_contained_and_reported(server):
    before = sha(server["db"])
    r = post(server, "/v1/sql/generate", {"database": "shop", "question": "HOSTILE: wreck it"}, "k-sql")
    assert r.status_code == 200, r.text
    turns = r.json()["trajectories"][0]["turns"]
    assert turns[0]["error"] and "ATTACH" in turns[0]["observation"].upper()
    assert not os.path.exists("/tmp/sqlrl-evil.db")
    assert r.json()["result"]["error"] is None  # DELETE ran in its own throwaway session
    again = post(server, "/v1/sql/generate", {"database": "shop", "question": "How many customers?"},
                 "k-sql").json()
    assert again["result"]["rows"] == [[60]]  # the DROP TABLE of the other request is invisible
    assert sha(server["db"]) == before


def server_db(server, dialect: str) -> str:
    if dialect not in server["servers"]:
        from tests.conftest import _server_url

        _server_url({"postgresql": "SQLRL_PG_ADMIN_URL", "mysql": "SQLRL_MYSQL_ADMIN_URL"}[dialect],
                    f"{dialect} server")
    return f"shop_{dialect}"


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_sql_endpoints_on_sealed_server_bases(server, dialect):
    """Each request's session is its own clone and role: a DROP TABLE in one request is not seen by
    the next, file functions are refused by the server, the base and other sessions untouched."""
    name = server_db(server, dialect)
    r = post(server, "/v1/sql/generate", {"database": name, "question": "How many customers?"}, "k-sql")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["dialect"] == dialect and out["result"]["rows"] == [[60]]
    r = post(server, "/v1/sql/debug", {"database": name, "issue_sql": "SELECT nme FROM customers",
                                       "problem": "I want the first three customer names.", "samples": 2},
             "k-sql")
    assert r.status_code == 200, r.text
    assert len(r.json()["result"]["rows"]) == 3 and r.json()["vote"]["votes"] == 2
    hostile = post(server, "/v1/sql/generate", {"database": name, "question": "ESCAPE THE SERVER"}, "k-sql").json()
    turns = hostile["trajectories"][0]["turns"]
    assert turns[0]["error"] and turns[1]["error"]  # file functions: refused
    assert turns[2]["error"] is None  # DROP TABLE ran -- in this request's own clone
    assert hostile["result"]["rows"] == [[60]]  # the preview runs on another fresh clone
    again = post(server, "/v1/sql/generate", {"database": name, "question": "How many customers?"}, "k-sql")
    assert again.json()["result"]["rows"] == [[60]]


def test_smollm2_through_serve(server):
    """A real instruct model behind the same API: a chat answer and a server-side agent run."""
    c = client(server, "k-chat", timeout=300)
    r = c.chat.completions.create(model="smol", max_tokens=12, temperature=0,
                                  messages=[{"role": "user", "content": "Say hello."}])
    assert r.choices[0].message.content and r.usage.completion_tokens > 0
    out = post(server, "/v1/sql/generate", {"database": "shop", "question": "How many customers are there?",
                                           "model": "smol", "max_turns": 2, "max_tokens": 48}, "k-sql")
    assert out.status_code == 200, out.text
    t = out.json()["trajectories"][0]
    assert t["generated_tokens"] > 0 and 1 <= t["n_turns"] <= 2 and t["stop_reason"]


# -- limits and errors --------------------------------------------------------------------------

def test_auth_failures(server):
    with pytest.raises(openai.AuthenticationError):
        client(server, "wrong-key").models.list()
    err = assert_openai_error(post(server, "/v1/chat/completions", {"model": "tiny"}, key=None), 401)
    assert err["code"] == "invalid_api_key"
    assert_openai_error(httpx.get(server["url"] + "/v1/models"), 401)


def test_oversized_body(server):
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * 200_000}]})
    assert_openai_error(post(server, "/v1/chat/completions", body, "k-bad"), 413)


def test_rate_limit(server):
    c = client(server, "k-rate")
    for _ in range(40):  # the burst
        c.models.list()
    r = httpx.get(server["url"] + "/v1/models", headers={"Authorization": "Bearer k-rate"})
    assert_openai_error(r, 429)
    assert int(r.headers["retry-after"]) >= 1
    with pytest.raises(openai.RateLimitError):
        c.models.list()


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/chat/completions", "{not json", 400, None),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages"),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                              "temperature": 9}, 400, "temperature"),
    ("/v1/chat/completions", {"model": "script", "messages": [
        {"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "y"}]},
     400, "messages[1].tool_call_id"),
    ("/v1/chat/completions", {"model": "script", "messages": [{"role": "user", "content": "x"}],
                              "tool_choice": "required"}, 400, "tool_choice"),
    ("/v1/chat/completions", {"model": "script", "messages": [{"role": "wizard", "content": "x"}]},
     400, "messages[0].role"),
    ("/v1/chat/completions", {"model": "script", "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": 5}]},
     400, "messages[1].tool_calls"),
    ("/v1/chat/completions", {"model": "script", "messages": [{"role": "user", "content": "x"}],
                              "stream": "yes"}, 400, "stream"),
    ("/v1/chat/completions", {"model": "script", "messages": [{"role": "user", "content": "x"}],
                              "n": 3}, 400, "n"),  # above limits.max_n (2): refused, not clamped
    ("/v1/chat/completions", {"model": "script", "messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("/v1/chat/completions", {"model": "script", "messages": [{"role": "user", "content": "x"}],
                              "logit_bias": {"42": 5}}, 400, "logit_bias"),
    ("/v1/chat/completions", {"model": "script", "messages": [{"role": "user", "content": "x"}],
                              "ignore_eos": True}, 400, "ignore_eos"),
    ("/v1/chat/completions", {"model": "script", "messages": [{"role": "user", "content": "x"}],
                              "logprobs": True, "top_logprobs": 3}, 400, "top_logprobs"),
    ("/v1/sql/generate", {"database": "nope", "question": "q"}, 404, "database"),
    ("/v1/sql/generate", {"database": "shop"}, 400, "question"),
    ("/v1/sql/generate", {"database": "shop", "question": "q", "dsn": "postgresql://x"}, 400, "dsn"),
    ("/v1/sql/debug", {"database": "shop", "issue_sql": [], "problem": "p"}, 400, "issue_sql"),
    ("/v1/sql/debug", {"database": "shop", "issue_sql": "SELECT 1", "problem": "p",
                       "dialect": "postgresql"}, 400, "dialect"),
])
def test_bad_input_gets_an_openai_error(server, path, body, status, param):
    err = assert_openai_error(post(server, path, body, "k-bad"), status)
    assert err["param"] == param


def test_unknown_routes_and_methods_answer_openai_errors(server):
    err = assert_openai_error(post(server, "/v1/nope", {"model": "script"}, "k-bad"), 404)
    assert "/v1/nope" in err["message"]
    err = assert_openai_error(httpx.get(server["url"] + "/v1/chat/completions",
                                        headers={"Authorization": "Bearer k-bad"}), 405)
    assert "GET" in err["message"]


def test_text_completions(server):
    c = client(server, "k-chat")
    r = c.completions.create(model="script", prompt="weather in Paris:", max_tokens=64)
    assert r.object == "text_completion" and r.choices[0].text.startswith("Let me check.")
    streamed = "".join(ch.text for chunk in c.completions.create(
        model="script", prompt="weather in Paris:", max_tokens=64, stream=True) for ch in chunk.choices)
    assert streamed == r.choices[0].text
    assert_openai_error(post(server, "/v1/completions", {"model": "script", "prompt": "x", "echo": True},
                             "k-bad"), 400)


def test_logprobs_are_the_sampled_tokens(server):
    c = client(server, "k-chat")
    msgs = [{"role": "user", "content": "hello"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, logprobs=True, seed=1)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens and all(t.logprob <= 0.0 for t in lp)
    streamed = [t for chunk in c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5,
                                                         logprobs=True, seed=1, stream=True)
                for ch in chunk.choices if ch.logprobs for t in ch.logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in lp]  # same seed: same tokens, all reported


def wait_for(predicate, what: str, limit_s: float = 120.0):
    end = time.monotonic() + limit_s  # a safety net for a broken server, not a timing assertion
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def hold(server, ex, n_inside: int, body: dict, key: str, strict: bool = True) -> list:
    """Send requests one by one, each waited for until it is inside the gated replica."""
    futures = []
    for k in range(n_inside):
        futures.append(ex.submit(post, server, "/v1/chat/completions", body, key))
        inside = k + 1 - sum(f.done() for f in futures)
        wait_for(lambda: stats(server, "gated")["inflight"] >= inside or futures[-1].done(),
                 f"{k + 1} requests inside")
        assert not strict or not futures[-1].done(), futures[-1].result().text
    return futures


def test_a_request_joins_the_running_engine_and_finishes_before_a_long_one(server):
    """While a LONG request is mid-generation (held after two tokens), another request to the same
    replica is admitted into the running engine and answered; no batch waits for another."""
    server["merge_gate"].unlink(missing_ok=True)
    c = client(server, "k-burst")
    msgs = [{"role": "user", "content": "LONG: weather in Paris"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    stream = iter(c.chat.completions.create(model="merge", stream=True, tools=tools, messages=msgs))
    early = ""
    for chunk in stream:
        early += "".join(ch.delta.content or "" for ch in chunk.choices)
        if early:
            break
    assert stats(server, "merge")["running"] == 1  # the LONG one, held mid-generation
    short = c.chat.completions.create(model="merge", tools=tools,
                                      messages=[{"role": "user", "content": "weather in Paris"}])
    assert short.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert not server["merge_gate"].exists()  # answered while the LONG request still generates
    server["merge_gate"].touch()
    rest = early + "".join(ch.delta.content or "" for chunk in stream for ch in chunk.choices)
    assert rest == "Let me check."


def test_a_client_that_disconnects_mid_stream_frees_its_sequence(server):
    server["trickle"].unlink(missing_ok=True)
    body = {"model": "trickle", "stream": True, "messages": [{"role": "user", "content": "weather in Paris"}]}
    with httpx.stream("POST", server["url"] + "/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": "Bearer k-stream"}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # kept: a dropped line iterator closes the connection (httpcore)
        for line in lines:
            if '"content": "' in line and '"content": ""' not in line:
                break  # a token arrived: the generation is held at the gate now
        assert stats(server, "trickle")["running"] == 1
    # the connection is closed; the gate is still shut, so only an abort can free the sequence
    wait_for(lambda: stats(server, "trickle")["running"] == 0, "the engine aborted the dropped stream")
    assert not server["trickle"].exists()


def test_queue_full_gives_503_and_the_rest_are_answered(server):
    server["gate"].unlink(missing_ok=True)
    body = {"model": "gated", "messages": [{"role": "user", "content": "weather"}]}
    done: list[int] = []
    lock = threading.Lock()

    def call():
        code = post(server, "/v1/chat/completions", body, "k-queue").status_code
        with lock:
            done.append(code)
        return code

    with ThreadPoolExecutor(13) as ex:
        held = hold(server, ex, 4, body, "k-queue")  # a full batch, generating, held by the gate
        # 9 more at once: 4 free slots + 2 queue places, so exactly 3 are beyond both. The ingress
        # counts them exactly (Serve's own queue count is approximate: with it, CI once saw no
        # refusal at all), so the 3 are refused at once and the other 6 wait for the gate.
        futures = [ex.submit(call) for _ in range(9)]
        wait_for(lambda: done.count(503) >= 3, "the 3 requests beyond ongoing + queued refused")
        with lock:
            assert sorted(done) == [503, 503, 503], done  # the admitted 6 are still held
        server["gate"].touch()
        codes = [f.result().status_code for f in held] + [f.result() for f in futures]
    assert codes[:4] == [200] * 4
    assert sorted(codes[4:]) == [200] * 6 + [503] * 3, codes
    r = post(server, "/v1/chat/completions", body, "k-queue")  # the slots were given back
    assert r.status_code == 200, r.text


def test_concurrent_burst_all_answered(server):
    c = client(server, "k-burst", timeout=120)

    def one(i: int) -> int:
        r = c.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                      messages=[{"role": "user", "content": f"question {i}"}])
        return r.usage.completion_tokens

    with ThreadPoolExecutor(16) as ex:
        tokens = list(ex.map(one, range(16)))
    assert len(tokens) == 16 and all(0 < t <= 4 for t in tokens)
