"""The gateway under a hostile client, part 2: bad input within the limits, and identity (real HTTP
on loopback, the scripted engine; docs/gateway.md "Attacks tried"). Every case is answered with
OpenAI's error body (never a 500), nothing refused is recorded, and the gateway serves on after it.

- JSON nested past the parser's depth (a 500 before: ``RecursionError``), and nested within it in
  tool arguments, tool schemas and ``metadata``; thousands of messages, tools, stop strings.
- Sampling parameters out of range: ``max_tokens``, ``temperature`` / ``top_p`` as NaN / Infinity
  literals, ``seed`` beyond 2**64, ``logprobs`` / ``top_logprobs``, ``n`` as a string, unknown
  ``tool_choice``.
- Lone surrogates (``"\\ud800"``) in messages, tool arguments, tags, kinds, SQL -- and in the final
  SQL of ``complete`` (accepted before, and with a journal its end record could not be written:
  a 500 and a rollout stuck half ended).
- Client rewards NaN / inf / huge / strings (1e308 and 10**400 were accepted / a 500 before).
- Identity: path tricks, url-encoding, long ids, ``Authorization`` forms, key prefixes, rate limits
  per key for a claim loop.
"""

from __future__ import annotations

import json

import httpx
import pytest

from sqlrl.gateway.journal import Journal, replay
from sqlrl.gateway.rollouts import GatewayConfig
from sqlrl.policy.scripted import ScriptedEngine

from .conftest import GOLD, KEY, OTHER, QUESTION, SCRIPT, gateway, shop_task

MESSAGES = [{"role": "system", "content": "You write SQL."}, {"role": "user", "content": QUESTION}]
SURROGATE = "\ud800"


@pytest.fixture
def gw(tiny, shop_catalog, tmp_path):
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    config = GatewayConfig(deadline_s=60, client_rewards=True)
    with gateway(tiny, engine, shop_catalog, window=4096, config=config,
                 journal=Journal(tmp_path / "journal.jsonl")) as g:
        g.rollouts.offer("g1", shop_task(), 4)
        g.extra["journal"] = tmp_path / "journal.jsonl"
        yield g


def raw(gw, path: str, text: str, key: str = KEY) -> httpx.Response:
    """``text`` sent as the body as it is (JSON literals ``NaN``, ``\\ud800`` escapes, deep nesting)."""
    return gw.post(path, text.encode(), key=key, headers={"content-type": "application/json"})


def nothing_recorded(gw) -> bool:
    s = gw.rollouts.stats()
    return s.calls == 0 and s.incomplete == 0 and gw.recorder.finished == []


def test_json_nested_past_the_parsers_depth_is_a_400_on_every_route(gw):
    rid = gw.claim()["rollout_id"]
    deep = "[" * 100_000 + "]" * 100_000  # 200 kB: well under limits.max_body_bytes
    for path, field in ((f"/rollouts/{rid}/v1/chat/completions", "messages"), ("/v1/rollouts", "kinds"),
                        (f"/v1/rollouts/{rid}/sql", "sql"), (f"/v1/rollouts/{rid}/complete", "sql")):
        r = raw(gw, path, f'{{"{field}": {deep}}}')
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["message"] == "the body is not valid JSON: nested too deeply"
    assert gw.post(f"/v1/rollouts/{rid}/sql", {"sql": "SELECT 1 AS one"}).json()["observation"] == "one\n1\n(1 row)"
    assert gw.rollouts.rollout_status(rid) == "active" and nothing_recorded(gw)


def test_json_nested_within_the_parsers_depth_is_answered_not_a_500(gw):
    rid = gw.claim()["rollout_id"]
    chat = f"/rollouts/{rid}/v1/chat/completions"
    deep: dict = {"a": 1}
    for _ in range(900):
        deep = {"a": deep}
    call = {"id": "c1", "type": "function", "function": {"name": "execute_sql", "arguments": deep}}
    history = MESSAGES + [{"role": "assistant", "content": "", "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": "c1", "content": "x"}]
    assert gw.post(chat, {"model": "m", "messages": history, "max_tokens": 2}).status_code == 200
    params = [{"type": "function", "function": {"name": "f", "parameters": deep}}]
    assert gw.post(chat, {"model": "m", "messages": MESSAGES, "tools": params, "max_tokens": 2}).status_code == 200
    r = gw.post(chat, {"model": "m", "messages": MESSAGES, "metadata": deep})
    assert r.status_code == 400 and r.json()["error"]["param"] == "metadata"
    assert gw.rollouts.stats().calls == 2


def test_thousands_of_messages_tools_and_stop_strings_are_refused_before_the_engine(gw):
    chat = f"/rollouts/{gw.claim()['rollout_id']}/v1/chat/completions"
    many = {"messages": [{"role": "user", "content": "x"}] * 20_000,
            "tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(5_000)]}
    for field, value in many.items():
        body = {"model": "m", "messages": MESSAGES, field: value}
        r = gw.post(chat, body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", field
    r = gw.post(chat, {"model": "m", "messages": MESSAGES, "stop": ["x"] * 5_000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    assert nothing_recorded(gw)


@pytest.mark.parametrize("field, literal", [
    ("max_tokens", "0"), ("max_tokens", "-1"), ("max_tokens", "1.5"), ("max_tokens", "1e400"),
    ("temperature", "NaN"), ("temperature", "Infinity"), ("temperature", "-1"), ("top_p", "NaN"),
    ("top_p", "-Infinity"), ("top_p", "0"), ("seed", "1.5"), ("logprobs", "1"), ("logprobs", '"true"'),
    ("top_logprobs", "5"), ("top_logprobs", "-1"), ("n", '"2"'), ("n", "0"), ("tool_choice", '"any"'),
    ("tool_choice", '{"type": "function", "function": "x"}'), ("tool_choice", '["auto"]'),
    ("stream", '"yes"'), ("max_tokens", "1" + "0" * 5000)])
def test_sampling_parameters_out_of_range_are_400s_naming_them(gw, field, literal):
    chat = f"/rollouts/{gw.claim()['rollout_id']}/v1/chat/completions"
    r = raw(gw, chat, f'{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "{field}": {literal}}}')
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] in (field, None) or r.json()["error"]["param"].startswith(field)
    assert nothing_recorded(gw)


def test_seeds_beyond_64_bits_and_a_huge_max_tokens_are_served_and_recorded(gw):
    rid = gw.claim()["rollout_id"]
    chat = f"/rollouts/{rid}/v1/chat/completions"
    for seed in (2**64, 2**200, -2**70):
        assert gw.post(chat, {"model": "m", "messages": MESSAGES, "seed": seed, "max_tokens": 2}).status_code == 200
    r = gw.post(chat, {"model": "m", "messages": MESSAGES, "max_tokens": 10**30})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= gw.model.limits.max_tokens
    assert gw.rollouts.stats().calls == 4


def test_lone_surrogates_are_400s_everywhere_and_nothing_is_recorded(gw):
    rid = gw.claim()["rollout_id"]
    chat = f"/rollouts/{rid}/v1/chat/completions"
    bad = SURROGATE
    call = {"id": "c1", "type": "function", "function": {"name": "execute_sql", "arguments": json.dumps({"sql": bad})}}
    for body in ({"model": "m", "messages": [{"role": "user", "content": f"hi {bad}"}]},
                 {"model": "m", "messages": [{"role": "user", "content": f"hi {bad}"}], "stream": True},
                 {"model": "m", "messages": MESSAGES + [{"role": "assistant", "content": "", "tool_calls": [call]},
                                                       {"role": "tool", "tool_call_id": "c1", "content": "x"}]},
                 {"model": "m", "messages": MESSAGES, "user": bad},
                 {"model": "m", "messages": MESSAGES, "tool_choice": {"type": "function", "function": {"name": bad}}}):
        assert raw(gw, chat, json.dumps(body)).status_code == 400, body
    assert raw(gw, "/v1/rollouts", json.dumps({"kinds": [bad]})).json()["error"]["param"] == "kinds"
    assert raw(gw, f"/v1/rollouts/{rid}/sql", json.dumps({"sql": f"SELECT '{bad}'"})).status_code == 400
    assert nothing_recorded(gw)


def test_a_final_sql_with_a_lone_surrogate_is_a_400_and_the_rollout_stays_whole(gw):
    """Before: accepted, scored 0, then its journal record could not be written (UTF-8 has no lone
    surrogates): a 500, the rollout left ``closing`` -- never ended, never drained, the job's step
    wait stuck."""
    rid = gw.claim()["rollout_id"]
    r = raw(gw, f"/v1/rollouts/{rid}/complete", json.dumps({"sql": f"SELECT '{SURROGATE}'"}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "sql"
    assert gw.rollouts.rollout_status(rid) == "active"
    assert gw.post(f"/v1/rollouts/{rid}/complete", {"sql": GOLD}).json()["reward"] == 1.0
    (trace,) = gw.rollouts.drain()
    assert trace.status == "completed" and list(replay(gw.extra["journal"]).done) == [rid]


def test_the_journal_writes_and_replays_any_string(tmp_path):
    from sqlrl.gateway.trace import RolloutTrace

    journal = Journal(tmp_path / "j.jsonl")
    trace = RolloutTrace(rollout_id="r", task_id="t", group_id="g", calls=(), status="failed",
                         error=f"scoring failed on SELECT '{SURROGATE}' and é")
    journal.append("end", trace=trace.to_dict(), key=None)
    (back,) = replay(tmp_path / "j.jsonl").ended
    assert back == trace


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e308", "-1e7", "1" + "0" * 400,
                                     "1" + "0" * 5000, '"1"', "true", "null", "[1]"])
def test_client_rewards_that_are_not_bounded_numbers_are_400s(gw, literal):
    rid = gw.claim()["rollout_id"]
    r = raw(gw, f"/v1/rollouts/{rid}/complete", f'{{"reward": {literal}}}')
    assert r.status_code == 400, r.text
    assert gw.rollouts.rollout_status(rid) == "active"
    assert gw.post(f"/v1/rollouts/{rid}/complete", {"reward": -1e6}).json()["reward"] == -1e6


def test_the_default_client_reward_bound_keeps_a_groups_advantages_finite():
    import math

    from sqlrl.gateway.sequences import rollout_advantages
    from sqlrl.learn.config import GRPOConfig

    limit = GatewayConfig().client_reward_limit
    adv = rollout_advantages([limit, -limit, 0.5, limit], ["g"] * 4, GRPOConfig())
    assert all(math.isfinite(a) for a in adv) and adv[0] > 0 > adv[1]  # 1e308 made this raise (docs)


def test_client_reward_limit_is_checked():
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="client_reward_limit"):
            GatewayConfig(client_reward_limit=bad)


def test_rollout_ids_path_tricks_and_long_ids_are_404s_that_touch_nothing(gw):
    rid = gw.claim()["rollout_id"]
    other = gw.claim(OTHER)["rollout_id"]
    for bad in ("..%2F..%2Fhealthz", "%2e%2e", f"..%2F{other}", f"{rid}%00", rid.upper(), f"{rid}%20",
                rid[:-1], "x" * 10_000, f"{other}", f"{rid}%2Fsql"):
        for path in (f"/v1/rollouts/{bad}/sql", f"/v1/rollouts/{bad}/complete"):
            r = gw.post(path, {"sql": "SELECT 1"})
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", (bad, r.text)
    assert gw.rollouts.rollout_status(rid) == gw.rollouts.rollout_status(other) == "active"
    ids = {gw.rollouts.claim(KEY).rollout_id for _ in range(2)} | {rid, other}
    assert len(ids) == 4 and all(len(i) == 24 and set(i) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") for i in ids)


def test_authorization_header_forms_and_key_prefixes(gw):
    ok = {"Authorization": f"bearer {KEY}"}, {"Authorization": f"BEARER  {KEY}"}
    for headers in ok:
        assert gw.post("/v1/rollouts", key=None, headers=headers).status_code == 200, headers
    for key in (KEY[:-1], KEY + "x", KEY[:3], KEY.upper(), f"{KEY},{OTHER}"):
        assert gw.post("/v1/rollouts", key=key).status_code == 401, key
    for value in (f"Basic {KEY}", KEY, "Bearer", f"Token {KEY}", b"Bearer \xff\xfe"):
        r = gw.post("/v1/rollouts", key=None, headers={"Authorization": value})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", value
    assert gw.rollouts.stats().claimed == 2


def test_a_claim_loop_is_rate_limited_per_key_and_wrong_keys_take_no_bucket(tiny, shop_catalog):
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    with gateway(tiny, engine, shop_catalog, limits={"rate_limit_per_minute": 1, "rate_limit_burst": 3}) as g:
        codes = [g.post("/v1/rollouts").status_code for _ in range(6)]
        assert codes == [204, 204, 204, 429, 429, 429]
        assert all(g.post("/v1/rollouts", key=f"guess-{i}").status_code == 401 for i in range(10))
        g.rollouts.offer("g", shop_task(), 1)
        assert g.claim(OTHER)["task"]["task_id"] == "t1"  # another key has its own bucket
        limited = g.post("/v1/rollouts")
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1


def test_a_chunked_body_over_the_limit_is_a_413_while_it_is_read(gw):
    rid = gw.claim()["rollout_id"]

    def chunks():
        yield b'{"sql": "'
        for _ in range(300):
            yield b"x" * 4096
        yield b'"}'
    r = httpx.post(f"{gw.url}/v1/rollouts/{rid}/sql", content=chunks(), timeout=60,
                   headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 413 and "content-length" not in {k.lower() for k in r.request.headers}


def test_sql_that_tries_to_leave_or_hog_the_session_is_an_observation(gw, tmp_path):
    rid = gw.claim()["rollout_id"]
    outside = tmp_path / "outside.db"
    cases = {"SELECT 1\x00; DROP TABLE customers": "null character",
             "SELECT '" + "x" * 900_000 + "'": "the limit is",
             f"ATTACH DATABASE '{outside}' AS e": "ATTACH is not allowed",
             f"VACUUM INTO '{outside}'": "VACUUM is not allowed",
             "SELECT load_extension('x')": "not authorized",
             "PRAGMA writable_schema=1": "not authorized"}
    for sql, error in cases.items():
        r = gw.post(f"/v1/rollouts/{rid}/sql", {"sql": sql}).json()
        assert r["is_error"] and error in r["observation"], (sql[:40], r)
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c"
    r = gw.post(f"/v1/rollouts/{rid}/sql", {"sql": endless}).json()
    assert not r["is_error"] and "more than 1000 rows" in r["observation"]  # gateway.sql_max_rows
    for sql in ("SELECT count(*) FROM customers\x00", f"ATTACH DATABASE '{outside}' AS e; SELECT 60"):
        assert gw.post(f"/v1/rollouts/{gw.claim()['rollout_id']}/complete", {"sql": sql}).json()["reward"] == 0.0
    assert not outside.exists()
    assert gw.post(f"/v1/rollouts/{rid}/sql", {"sql": GOLD}).json()["observation"] == "count(*)\n60\n(1 row)"


def test_a_key_that_is_a_prefix_of_another_owns_only_its_own_rollouts(gw):
    from serve.gateway import build_gateway_app, serving

    app = build_gateway_app(gw.rollouts, gw.model, keys=frozenset({"pre", "prefix"}))
    with serving(app) as url:
        def post(path, body, key):
            return httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        short, long = (post("/v1/rollouts", {}, k).json()["rollout_id"] for k in ("pre", "prefix"))
        for rid, foreign in ((short, "prefix"), (long, "pre")):
            r = post(f"/v1/rollouts/{rid}/sql", {"sql": "SELECT 1"}, foreign)
            assert r.status_code == 404 and r.json()["error"]["code"] == "rollout_not_found"
        assert post(f"/v1/rollouts/{short}/sql", {"sql": "SELECT 1 AS one"}, "pre").json()["observation"] == \
            "one\n1\n(1 row)"
        assert post("/v1/rollouts", {}, "pref").status_code == 401


def test_client_caused_409_and_410_are_not_labelled_server_errors(gw):
    """Before: ``type: server_error`` (the status was missing from ``ERROR_TYPES``), which tells a
    client that branches on the type to retry a rollout that has ended."""
    rid = gw.claim()["rollout_id"]
    gw.post(f"/v1/rollouts/{rid}/complete", {"sql": GOLD})
    closed = gw.post(f"/v1/rollouts/{rid}/sql", {"sql": "SELECT 1"}).json()["error"]
    assert (closed["code"], closed["type"]) == ("rollout_closed", "invalid_request_error")
    gw.rollouts.finish()
    while (r := gw.post("/v1/rollouts")).status_code == 200:
        pass
    assert r.status_code == 410 and r.json()["error"]["type"] == "invalid_request_error"
