"""The gateway's HTTP contract with the official ``openai`` client on the scripted engine (real
HTTP on loopback): rollouts claimed, chat (whole and streamed) with structured tool calls, SQL on
the rollout's own session, completion scored by the server's Judge, token-exact traces, tags and
every error path. Events, never time: the clock is fake, held requests wait on gates."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest

from sqlrl.gateway.rollouts import GatewayConfig
from sqlrl.policy.scripted import ScriptedEngine
from sqlrl.tools import tool_schemas

from .conftest import GOLD, KEY, OTHER, QUESTION, SCRIPT, gateway, shop_task

TOOLS = tool_schemas(["execute_sql"])
MESSAGES = [{"role": "system", "content": "You write SQL."}, {"role": "user", "content": QUESTION}]


@pytest.fixture
def gw(tiny, shop_catalog):
    from sqlrl.tasks.schema import DatabaseSchema

    path = shop_catalog["shop"]["sqlite"][len("sqlite:///"):]
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    with gateway(tiny, engine, shop_catalog, window=4096,
                 schemas={"shop": DatabaseSchema.from_sqlite(path, db_id="shop")}) as g:
        g.rollouts.offer("g1", shop_task(), 2)
        yield g


def agent_turns(gw, claim, *, stream=False, **kw):
    """The scripted agent: a tool call, the SQL through session_url, the answer."""
    client = gw.client(claim["base_url"])
    if stream:
        parts = list(client.chat.completions.create(model="anything", messages=MESSAGES, tools=TOOLS,
                                                    stream=True, **kw))
        calls = [tc for p in parts for c in p.choices for tc in (c.delta.tool_calls or [])]
        content = "".join(c.delta.content or "" for p in parts for c in p.choices)
        reasons = [c.finish_reason for p in parts for c in p.choices if c.finish_reason]
        assert reasons == ["tool_calls"] and content == "Let me look."
        call = calls[0]
    else:
        r = client.chat.completions.create(model="anything", messages=MESSAGES, tools=TOOLS, **kw)
        assert r.choices[0].finish_reason == "tool_calls"
        call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "execute_sql" and json.loads(call.function.arguments) == {"sql": GOLD}
    obs = gw.post(claim["session_url"][len(gw.url):], {"sql": json.loads(call.function.arguments)["sql"]})
    assert obs.status_code == 200 and obs.json() == {"observation": "count(*)\n60\n(1 row)", "is_error": False}
    history = MESSAGES + [{"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                         "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": obs.json()["observation"]}]
    r = client.chat.completions.create(model="anything", messages=history, tools=TOOLS, **kw)
    assert r.choices[0].message.content == "There are 60 customers."
    return r


def test_a_rollout_end_to_end_is_traced_token_exactly(gw):
    claim = gw.claim()
    assert claim["task"]["question"] == QUESTION and claim["task"]["database"] == "shop"
    assert "CREATE TABLE" in claim["task"]["schema"] and claim["deadline_s"] == 60
    assert claim["base_url"] == f"{gw.url}/rollouts/{claim['rollout_id']}/v1"
    models = gw.client(claim["base_url"]).models.list()
    assert [m.id for m in models.data] == ["policy"]
    agent_turns(gw, claim, logprobs=True)
    done = gw.post(f"/v1/rollouts/{claim['rollout_id']}/complete", {"sql": GOLD})
    assert done.status_code == 200 and done.json() == {"rollout_id": claim["rollout_id"],
                                                       "status": "completed", "reward": 1.0}
    (trace,) = gw.rollouts.drain()
    assert trace.status == "completed" and trace.reward_source == "judge" and trace.final_sql == GOLD
    assert trace.group_id == "g1" and trace.task_id == "t1" and trace.n_incomplete == 0
    assert len(trace.calls) == 2 == len(gw.recorder.finished)
    for call, (prompt, g) in zip(trace.calls, gw.recorder.finished):
        assert call.prompt_ids == prompt and call.response_ids == g.token_ids
        assert call.logprobs == g.logprobs and call.versions == g.versions
    # the multi-turn prompt extends the first call's prompt + response (the template is append-only)
    assert gw.rollouts.stats().prefix_mismatches == 0
    assert gw.pool.stats().in_use == 0


def test_a_call_that_does_not_extend_the_previous_one_is_counted(gw):
    claim = gw.claim()
    client = gw.client(claim["base_url"])
    client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
    edited = [{"role": "system", "content": "Another system prompt."}] + MESSAGES[1:]
    client.chat.completions.create(model="m", messages=edited, tools=TOOLS)
    gw.post(f"/v1/rollouts/{claim['rollout_id']}/complete", {"sql": GOLD})
    assert gw.rollouts.stats().prefix_mismatches == 1 and gw.rollouts.stats().calls == 2


def test_a_streamed_rollout_is_traced_the_same(gw):
    claim = gw.claim()
    agent_turns(gw, claim, stream=True)
    gw.post(f"/v1/rollouts/{claim['rollout_id']}/complete", {"sql": "SELECT 1"})
    (trace,) = gw.rollouts.drain()
    assert trace.reward == 0.0 and [c.finish_reason for c in trace.calls] == ["eos", "eos"]
    assert [(c.prompt_ids, c.response_ids) for c in trace.calls] == [
        (p, g.token_ids) for p, g in gw.recorder.finished]


def test_tags_from_metadata_header_and_user_in_that_order(gw):
    claim = gw.claim()
    client = gw.client(claim["base_url"], default_headers={"X-Sqlrl-Tag": "check"})
    one = dict(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    client.chat.completions.create(metadata={"tag": "write"}, user="rewrite", **one)
    client.chat.completions.create(user="rewrite", **one)
    gw.client(claim["base_url"]).chat.completions.create(user="rewrite", **one)
    gw.client(claim["base_url"]).chat.completions.create(**one)
    with pytest.raises(openai.BadRequestError, match="metadata.tag"):
        client.chat.completions.create(metadata={"tag": "no spaces"}, **one)
    gw.post(f"/v1/rollouts/{claim['rollout_id']}/complete", {"sql": GOLD})
    (trace,) = gw.rollouts.drain()
    assert [c.tag for c in trace.calls] == ["write", "check", "rewrite", None]
    assert trace.n_incomplete == 0  # the refused call never began


def test_keys_and_rollout_ids(gw):
    claim = gw.claim()
    rid = claim["rollout_id"]
    assert len(rid) >= 24 and gw.claim(OTHER)["rollout_id"] != rid
    assert gw.post("/v1/rollouts", key=None).status_code == 401
    assert gw.post("/v1/rollouts", key="wrong").json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        gw.client(claim["base_url"], key="wrong").models.list()
    with pytest.raises(openai.NotFoundError):  # a foreign key: the rollout does not exist for it
        gw.client(claim["base_url"], key=OTHER).chat.completions.create(model="m", messages=MESSAGES)
    for path, body in ((f"/v1/rollouts/{rid}/sql", {"sql": "SELECT 1"}),
                       (f"/v1/rollouts/{rid}/complete", {"sql": GOLD}),
                       ("/v1/rollouts/not-a-rollout/sql", {"sql": "SELECT 1"})):
        r = gw.post(path, body, key=OTHER)
        assert r.status_code == 404 and r.json()["error"]["code"] == "rollout_not_found", path
    assert httpx.get(f"{claim['base_url']}/models").status_code == 401
    assert gw.rollouts.rollout_status(rid) == "active"  # nothing a foreign key did touched it


def test_bad_requests_are_refused_and_nothing_is_recorded(gw):
    claim = gw.claim()
    rid, base = claim["rollout_id"], claim["base_url"]
    chat = f"/rollouts/{rid}/v1/chat/completions"
    assert gw.post(chat, b"{not json").json()["error"]["message"].startswith("the body is not valid JSON")
    assert gw.post(chat, {"model": "m"}).json()["error"]["param"] == "messages"
    assert gw.post(chat, {"model": "m", "messages": MESSAGES, "n": 2}).json()["error"]["param"] == "n"
    assert gw.post(chat, {"model": "m", "messages": MESSAGES, "stream": "yes"}).status_code == 400
    long = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(openai.BadRequestError) as e:
        gw.client(base).chat.completions.create(model="m", messages=long)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):  # streamed: the same plain error before any event
        gw.client(base).chat.completions.create(model="m", messages=long, stream=True)
    assert gw.post(chat, b"x" * 2_000_000).status_code == 413
    assert gw.post("/v1/rollouts", {"task": "mine"}).status_code == 400
    assert gw.post(f"/v1/rollouts/{rid}/sql", {"sql": ""}).status_code == 400
    assert gw.post(f"/v1/rollouts/{rid}/sql", {"sql": "SELECT 1", "dsn": "x"}).status_code == 400
    assert gw.post(f"/v1/rollouts/{rid}/complete", {}).status_code == 400
    assert gw.post(f"/v1/rollouts/{rid}/complete", {"sql": GOLD, "reward": 1}).status_code == 400
    assert gw.post("/v1/nowhere").json()["error"]["message"].startswith("Invalid URL")
    wrong = httpx.get(gw.url + chat, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert wrong.status_code == 405 and wrong.json()["error"]["message"].startswith("Method not allowed")
    assert gw.rollouts.stats().calls == 0 and gw.rollouts.stats().incomplete == 0
    assert gw.recorder.finished == []


def test_sql_errors_are_observations_and_the_session_is_the_rollouts_own(gw):
    a, b = gw.claim(), gw.claim()
    sql_a, sql_b = (f"/v1/rollouts/{c['rollout_id']}/sql" for c in (a, b))
    r = gw.post(sql_a, {"sql": "SELEC nonsense"}).json()
    assert r["is_error"] and r["observation"].startswith("Error (syntax)")
    assert gw.post(sql_a, {"sql": "DELETE FROM customers"}).json() == {
        "observation": "OK (60 rows affected)", "is_error": False}
    assert gw.post(sql_a, {"sql": GOLD}).json()["observation"] == "count(*)\n0\n(1 row)"
    assert gw.post(sql_b, {"sql": GOLD}).json()["observation"] == "count(*)\n60\n(1 row)"
    # the Judge grades on a fresh session: the rollout's deletes do not change its reward
    assert gw.post(f"/v1/rollouts/{a['rollout_id']}/complete", {"sql": GOLD}).json()["reward"] == 1.0


def test_after_complete_everything_is_409_and_a_forged_reward_is_403(gw):
    claim = gw.claim()
    rid = claim["rollout_id"]
    forged = gw.post(f"/v1/rollouts/{rid}/complete", {"reward": 1.0})
    assert forged.status_code == 403 and forged.json()["error"]["type"] == "permission_error"
    assert gw.rollouts.rollout_status(rid) == "active"
    assert gw.post(f"/v1/rollouts/{rid}/complete", {"sql": "SELECT 1"}).json()["reward"] == 0.0
    for path, body in ((f"/v1/rollouts/{rid}/complete", {"sql": GOLD}),
                       (f"/v1/rollouts/{rid}/sql", {"sql": "SELECT 1"}),
                       (f"/rollouts/{rid}/v1/chat/completions", {"model": "m", "messages": MESSAGES})):
        r = gw.post(path, body)
        assert r.status_code == 409 and r.json()["error"]["code"] == "rollout_closed", path
    with pytest.raises(openai.ConflictError):
        gw.client(claim["base_url"]).models.list()
    assert gw.post(f"/v1/rollouts/{rid}/sql", {"sql": "SELECT 1"}, key=OTHER).status_code == 404
    assert gw.pool.stats().in_use == 0


def test_no_work_now_is_204_and_finished_work_is_410(gw):
    gw.claim(), gw.claim()
    r = gw.post("/v1/rollouts")
    assert r.status_code == 204 and r.headers["retry-after"] == "2"
    gw.rollouts.offer("g2", shop_task("t2"), 1)
    assert gw.claim()["task"]["task_id"] == "t2"
    gw.rollouts.finish()
    r = gw.post("/v1/rollouts")
    assert r.status_code == 410 and r.json()["error"]["code"] == "no_more_work"


def test_a_key_at_its_live_cap_gets_429_and_takes_nothing(tiny, shop_catalog):
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    with gateway(tiny, engine, shop_catalog, config=GatewayConfig(deadline_s=60, max_live_per_key=1)) as g:
        g.rollouts.offer("g", shop_task(), 3)
        first = g.claim()
        r = g.post("/v1/rollouts")
        assert r.status_code == 429 and r.headers["retry-after"] == "2", r.text
        assert r.json()["error"]["code"] == "too_many_live_rollouts"
        assert g.rollouts.stats().waiting == 2  # the refused claim took no rollout
        g.claim(key=OTHER)  # the cap is per key
        r = g.post(f"/v1/rollouts/{first['rollout_id']}/complete", {"sql": GOLD})
        assert r.status_code == 200, r.text
        g.claim()  # its rollout ended: the key may claim again
        assert g.post("/v1/rollouts").status_code == 429


def test_the_live_cap_is_checked(tiny):
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="max_live_per_key"):
            GatewayConfig(max_live_per_key=bad)


def test_a_silent_client_expires_and_its_session_is_released(gw):
    claim = gw.claim()
    gw.client(claim["base_url"]).chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
    assert gw.pool.stats().in_use == 1
    gw.clock.advance(59)
    assert gw.post(f"/v1/rollouts/{claim['rollout_id']}/sql", {"sql": "SELECT 1"}).status_code == 200
    gw.clock.advance(1)
    assert gw.post("/v1/rollouts", key=OTHER).status_code == 200  # any request expires what is due
    assert gw.pool.stats().in_use == 1  # the new claim's session only
    (trace,) = gw.rollouts.drain()
    assert trace.status == "expired" and trace.reward is None and len(trace.calls) == 1
    r = gw.post(f"/v1/rollouts/{claim['rollout_id']}/complete", {"sql": GOLD})
    assert r.status_code == 409
    assert gw.rollouts.stats().expired == 1


def test_a_call_in_flight_when_its_rollout_expires_is_cancelled_and_counted(gw):
    import concurrent.futures

    claim = gw.claim()
    gate = gw.engine.hold("How many customers", after_tokens=2)
    client = gw.client(claim["base_url"])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(client.chat.completions.create, model="m", messages=MESSAGES, tools=TOOLS)
        assert gate.reached.wait_sync(60)
        gw.clock.advance(61)
        assert gw.post("/v1/rollouts", key=OTHER).status_code == 200  # expires the held rollout
        with pytest.raises(openai.ConflictError):
            held.result(60)
    assert gw.engine.in_flight == 0 and gw.engine.log[-1][0] == "abort"  # aborted before the 409 went out
    (trace,) = gw.rollouts.drain()
    assert trace.status == "expired" and trace.calls == () and trace.n_incomplete == 1
    gate.open()


def test_a_stream_cancelled_halfway_records_nothing(gw):
    claim = gw.claim()
    gate = gw.engine.hold("How many customers", after_tokens=3)
    with httpx.stream("POST", f"{claim['base_url']}/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "m", "messages": MESSAGES, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert json.loads(first[5:])["choices"][0]["delta"]["role"] == "assistant"
        assert gate.reached.wait_sync(60)
    # the client went away mid-stream: its engine request is aborted, then the call is abandoned
    assert gw.rollouts.wait_until(lambda: gw.rollouts.stats().incomplete == 1, 60)
    assert gw.engine.in_flight == 0 and gw.engine.log[-1][0] == "abort" and gw.recorder.finished == []
    gate.open()
    gw.post(f"/v1/rollouts/{claim['rollout_id']}/complete", {"sql": GOLD})
    (trace,) = gw.rollouts.drain()
    assert trace.calls == () and trace.n_incomplete == 1


def test_a_client_gone_before_a_plain_answer_records_nothing(gw):
    """A non-streamed call whose client disconnects first (its timeout; it will retry) is aborted
    and counted incomplete: the trace never holds an answer the agent did not receive."""
    import socket
    from urllib.parse import urlsplit

    claim = gw.claim()
    gate = gw.engine.hold("How many customers", after_tokens=2)
    url = urlsplit(f"{claim['base_url']}/chat/completions")
    body = json.dumps({"model": "m", "messages": MESSAGES}).encode()
    head = (f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(head + body)
        assert gate.reached.wait_sync(60)  # the engine is generating the answer
    # the client went away before the answer: its engine request is aborted, the call abandoned
    assert gw.rollouts.wait_until(lambda: gw.rollouts.stats().incomplete == 1, 60)
    assert gw.engine.in_flight == 0 and gw.engine.log[-1][0] == "abort" and gw.recorder.finished == []
    gate.open()
    r = gw.client(claim["base_url"]).chat.completions.create(model="m", messages=MESSAGES)  # the retry
    assert r.choices[0].message.content
    gw.post(f"/v1/rollouts/{claim['rollout_id']}/complete", {"sql": GOLD})
    (trace,) = gw.rollouts.drain()
    assert len(trace.calls) == 1 and trace.n_incomplete == 1  # only the answer the client received


def test_the_apps_sql_threads_end_with_its_server(tiny, shop_catalog):
    """The app's own SQL pool is shut down when its server stops: no idle worker threads are
    left behind per app (a process that builds many gateways would collect them)."""
    with gateway(tiny, ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT), shop_catalog) as g:
        g.rollouts.offer("g", shop_task(), 1)
        claim = g.claim()
        assert g.post(f"/v1/rollouts/{claim['rollout_id']}/sql", {"sql": "SELECT 1"}).status_code == 200
        pool = g.app.state.sql_pool
        threads = list(pool._threads)  # the executor's workers (no public handle on them)
        assert threads and all(t.is_alive() for t in threads)
    for t in threads:
        t.join(timeout=60)  # they end once the pool is shut down; idle ones otherwise wait forever
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit(print)


def test_weight_updates_reject_new_calls_with_429_when_configured(tiny, shop_catalog):
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    with gateway(tiny, engine, shop_catalog, config=GatewayConfig(deadline_s=60, during_update="reject")) as g:
        g.rollouts.offer("g", shop_task(), 1)
        claim = g.claim()
        g.rollouts.begin_update()
        r = g.post(f"/rollouts/{claim['rollout_id']}/v1/chat/completions", {"model": "m", "messages": MESSAGES})
        assert r.status_code == 429 and r.headers["retry-after"] == "2"
        g.rollouts.end_update()
        assert g.post(f"/rollouts/{claim['rollout_id']}/v1/chat/completions",
                      {"model": "m", "messages": MESSAGES}).status_code == 200
        assert g.rollouts.stats().incomplete == 0  # the refused call never began


def test_calls_during_a_weight_update_wait_for_it_by_default(gw):
    import asyncio
    import concurrent.futures

    claim = gw.claim()
    client = gw.client(claim["base_url"])
    gate = gw.engine.hold("How many customers", after_tokens=1)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        held = pool.submit(client.chat.completions.create, model="m", messages=MESSAGES)
        assert gate.reached.wait_sync(60)
        update = pool.submit(asyncio.run, gw.rollouts.update_weights(gw.engine, {"scripted.weight": np.zeros(1)}))
        waiting = pool.submit(client.chat.completions.create, model="m", max_tokens=3,
                              messages=[{"role": "user", "content": "hello"}])
        assert gw.rollouts.wait_until(lambda: gw.rollouts.stats().in_flight == 2, 60)
        assert not update.done() and not waiting.done()  # draining: the new call waits, it is not refused
        gate.open()
        assert update.result(60) == 1 and held.result(60).choices[0].message.content.startswith("Let me look.")
        assert waiting.result(60).choices[0].message.content
    gw.post(f"/v1/rollouts/{claim['rollout_id']}/complete", {"sql": GOLD})
    (trace,) = gw.rollouts.drain()
    assert [set(c.versions) for c in trace.calls] == [{0}, {1}]  # the held call drained on the old weights


def test_client_rewards_when_the_job_allows_them(tiny, shop_catalog):
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    with gateway(tiny, engine, shop_catalog, config=GatewayConfig(deadline_s=60, client_rewards=True)) as g:
        g.rollouts.offer("g", shop_task(), 1)
        rid = g.claim()["rollout_id"]
        assert g.post(f"/v1/rollouts/{rid}/complete", {"reward": "1"}).status_code == 400
        assert g.post(f"/v1/rollouts/{rid}/complete", {"reward": 0.25}).json()["reward"] == 0.25
        (trace,) = g.rollouts.drain()
        assert trace.reward_source == "client" and trace.final_sql is None


def test_rate_limits_and_token_clamps_apply_per_key(tiny, shop_catalog):
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    limits = {"rate_limit_per_minute": 1, "rate_limit_burst": 3, "max_tokens": 4}
    with gateway(tiny, engine, shop_catalog, limits=limits) as g:
        g.rollouts.offer("g", shop_task(), 2)
        claim = g.claim()
        r = g.client(claim["base_url"]).chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=100)
        assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
        g.post(f"/v1/rollouts/{claim['rollout_id']}/sql", {"sql": "SELECT 1"})
        limited = g.post(f"/v1/rollouts/{claim['rollout_id']}/sql", {"sql": "SELECT 1"})
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert g.claim(OTHER)["rollout_id"]  # another key has its own bucket
    # the gateway stopped: its live rollouts failed; the clamped call was traced with its 4 tokens
    traces = {t.rollout_id: t for t in g.rollouts.drain()}
    assert [len(c.response_ids) for c in traces[claim["rollout_id"]].calls] == [4]
    assert {t.status for t in traces.values()} == {"failed"} and g.pool.stats().in_use == 0
