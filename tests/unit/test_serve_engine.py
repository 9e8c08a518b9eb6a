"""The serving core on one async engine, without Ray: ``ModelEngine`` over ``ScriptedEngine``
(gates: every test waits on events, never on time), the resource fitting of the app, and the
OpenAI errors for bad input."""

from __future__ import annotations

import asyncio
import json

import pytest

from serve.config import load_serve_config
from serve.engine import ModelEngine, choice_seed
from serve.sql_agent import GenerateBody
from serve.openai_chat import APIError, ChatRequest
from serve.resources import ResourceError, fit
from sqlrl.policy.engine import check_engine_class
from sqlrl.policy.scripted import ScriptedEngine


def call(name, args):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


SCRIPT = [{"match": "weather", "turns": ["Let me check." + call("get_weather", {"city": "Paris"})]},
          {"match": "How many customers", "turns": [call("submit_solution", {"sql": "SELECT count(*) FROM customers"})]}]


@pytest.fixture(scope="module")
def tiny():
    from sqlrl.policy.load import load_policy

    return load_policy("tiny")


class Recording(ScriptedEngine):
    """The scripted engine, recording every request's sampling parameters."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.samplings = []

    async def stream(self, prompt_ids, sampling, *, request_id=None):
        self.samplings.append(sampling)
        async for delta in super().stream(prompt_ids, sampling, request_id=request_id):
            yield delta


check_engine_class(Recording)


def served(tiny, tmp_path, *, limits=None, window=None):
    from sqlrl.tasks.demo_db import build_demo_database

    db = tmp_path / "shop.sqlite"
    if not db.exists():
        build_demo_database(str(db))
    config = load_serve_config({"models": {"m": {"policy": {"model": "tiny"}}},
                                "databases": {"shop": {"url": f"sqlite:///{db}"}},
                                "limits": {"max_n": 3, **(limits or {})}})
    engine = Recording(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    return ModelEngine("m", tiny, engine, config, window=window), engine


def chat(**kw):
    return ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "weather?"}], **kw})


def test_each_choice_is_its_own_engine_request_with_its_own_seed(tiny, tmp_path):
    model, engine = served(tiny, tmp_path)
    out = asyncio.run(model.chat(model.chat_plan(chat(n=3, seed=11, logprobs=True))))
    assert [s.seed for s in engine.samplings] == [choice_seed(11, i) for i in range(3)]
    assert len({s.seed for s in engine.samplings}) == 3 and all(s.n == 1 for s in engine.samplings)
    assert [c["finish_reason"] for c in out["choices"]] == ["stop"] * 3  # no tools given: text
    lp = out["choices"][0]["logprobs"]["content"]
    assert len(lp) == out["usage"]["completion_tokens"] // 3 and lp[0]["top_logprobs"] == []
    assert engine.in_flight == 0


def test_self_consistency_samples_draw_from_different_seeds(tiny, tmp_path):
    model, engine = served(tiny, tmp_path)
    out = asyncio.run(model.sql("generate", GenerateBody(database="shop", question="How many customers?",
                                                         samples=3, seed=11)))
    assert out["result"]["rows"] == [[60]] and out["vote"]["votes"] == 3
    seeds = [s.seed for s in engine.samplings]
    assert len(seeds) == 3 and len(set(seeds)) == 3 and None not in seeds


def test_a_closed_stream_aborts_its_engine_request_and_others_go_on(tiny, tmp_path):
    model, engine = served(tiny, tmp_path)
    gate = engine.hold("weather", after_tokens=3)

    async def main():
        chunks = model.chat_chunks(model.chat_plan(chat(tools=[{"type": "function", "function": {
            "name": "get_weather", "parameters": {}}}])))
        first = [await anext(chunks) for _ in range(2)]  # the role chunk, then the first content
        assert first[1]["choices"][0]["delta"]["content"]
        await gate.reached.wait()
        assert engine.in_flight == 1
        await chunks.aclose()  # the client went away
        assert engine.in_flight == 0 and engine.log[-1][0] == "abort"
        gate.open()
        later = await model.chat(model.chat_plan(chat(max_tokens=2)))
        assert later["choices"][0]["finish_reason"] == "length"

    asyncio.run(main())


def test_a_cancelled_request_is_aborted_in_the_engine(tiny, tmp_path):
    """What a timeout does (the replica's wait_for, the ingress's cancel): the engine frees it."""
    model, engine = served(tiny, tmp_path)
    engine.hold("weather", after_tokens=1)  # never opened: only an abort ends the request

    async def main():
        task = asyncio.ensure_future(model.chat(model.chat_plan(chat(n=2))))
        await engine.gates[0].reached.wait()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(task, 0)  # a timeout that has passed
        assert engine.in_flight == 0 and [e for e, _ in engine.log].count("abort") == 2
        ok = await model.chat(model.chat_plan(ChatRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]})))
        assert ok["choices"][0]["message"]["content"]

    asyncio.run(main())


def test_an_engine_error_before_the_first_token_is_a_plain_error(tiny, tmp_path):
    model, engine = served(tiny, tmp_path)
    model.engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=[
        {"match": "weather", "turns": [{"error": "the model broke", "after_tokens": 0}]}])

    async def main():
        with pytest.raises(APIError) as e:
            await anext(model.chat_chunks(model.chat_plan(chat())))
        assert e.value.status == 500 and "the model broke" in e.value.message
        with pytest.raises(APIError):
            await model.chat(model.chat_plan(chat()))

    asyncio.run(main())


@pytest.mark.parametrize("body,param,code", [
    ({"n": 4}, "n", None),
    ({"response_format": {"type": "json_schema"}}, "response_format", "unsupported_parameter"),
    ({"logit_bias": {"1": 2}}, "logit_bias", "unsupported_parameter"),
    ({"ignore_eos": True}, "ignore_eos", "unsupported_parameter"),
    ({"max_tokens": 64, "messages": [{"role": "user", "content": "x " * 100}]}, "messages", "context_length_exceeded"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": 7}]},
     "messages[1].tool_calls", None),
])
def test_bad_chat_input_is_a_400_naming_the_parameter(tiny, tmp_path, body, param, code):
    model, _ = served(tiny, tmp_path, window=128)
    with pytest.raises(APIError) as e:
        model.chat_plan(chat(**body))
    assert e.value.status == 400 and e.value.param == param and e.value.code == code
    if param == "n":
        assert "limit of 3" in e.value.message  # names the limit instead of clamping


def test_stream_must_be_a_boolean():
    with pytest.raises(Exception, match="stream"):
        chat(stream="yes")
    assert chat(stream=True).stream is True


# -- resources ------------------------------------------------------------------------------------

def two_models(**spec):
    tiny = {"model": "tiny"}
    return load_serve_config({"models": {"talon": {"policy": tiny, **spec}, "zeno": {"policy": tiny, **spec}}})


def test_default_asks_fit_a_two_core_machine():
    asks = fit(two_models(), cpus=2)
    assert asks.ingress_cpus + sum(asks.model_cpus.values()) <= 2
    assert asks.model_cpus == {"talon": 0.875, "zeno": 0.875}
    assert fit(two_models(), cpus=16).model_cpus == {"talon": 1.0, "zeno": 1.0}  # at most 1 each


def test_asks_that_cannot_fit_are_refused_in_one_line_naming_the_setting():
    with pytest.raises(ResourceError) as e:
        fit(two_models(num_cpus=1), cpus=2)
    msg = str(e.value)
    assert "\n" not in msg and "2.25 CPU" in msg and "models.talon.num_cpus" in msg
    with pytest.raises(ResourceError, match="models.talon.num_gpus"):
        fit(two_models(num_gpus=1), cpus=8, gpus=1)
    many = load_serve_config({"models": {"m": {"policy": {"model": "tiny"}, "num_replicas": 64}}})
    with pytest.raises(ResourceError, match="num_replicas"):
        fit(many, cpus=2)


def test_build_app_refuses_before_deploying(monkeypatch):
    from serve.app import build_app

    tiny = {"model": "tiny"}
    args = {"models": {"talon": {"policy": tiny, "num_cpus": 1}, "zeno": {"policy": tiny, "num_cpus": 1}}}
    with pytest.raises(ResourceError):
        build_app(args, (2.0, 0.0))
    build_app({"models": {"talon": {"policy": tiny}, "zeno": {"policy": tiny}}}, (2.0, 0.0))  # fits


def test_unknown_routes_and_methods_are_openai_errors():
    from fastapi.testclient import TestClient

    from serve.app import api

    c = TestClient(api)
    r = c.post("/v1/nope", json={})
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert "POST /v1/nope" in r.json()["error"]["message"]


# -- /v1/completions ------------------------------------------------------------------------------

def test_text_completions_use_the_raw_prompt_and_stream_the_same_text(tiny, tmp_path):
    from serve.completions import CompletionRequest, text_chunk, text_plan, text_result

    model, engine = served(tiny, tmp_path)
    req = CompletionRequest.model_validate({"model": "m", "prompt": "weather report:", "max_tokens": 40,
                                            "n": 2, "seed": 5, "logprobs": 0})
    plan = text_plan(model, req)
    assert plan.ids == list(tiny.tokenizer.encode("weather report:", add_special_tokens=False))
    out = text_result(model, plan, asyncio.run(model.generate(plan)))
    assert out["object"] == "text_completion" and len(out["choices"]) == 2
    assert [s.seed for s in engine.samplings] == [choice_seed(5, 0), choice_seed(5, 1)]
    text = out["choices"][0]["text"]
    assert text.startswith("Let me check.") and len(out["choices"][0]["logprobs"]["tokens"]) == out["usage"]["completion_tokens"] // 2

    async def streamed():
        chunks = [text_chunk(c) async for c in model.chat_chunks(text_plan(model, req))]
        return "".join(ch["text"] for c in chunks if c for ch in c["choices"] if ch["index"] == 0)

    assert asyncio.run(streamed()) == text


@pytest.mark.parametrize("body,param", [({"echo": True}, "echo"), ({"suffix": "x"}, "suffix"),
                                        ({"best_of": 3}, "best_of"), ({"logprobs": 2}, "logprobs"),
                                        ({"prompt": ["a", "b"]}, "prompt"), ({"n": 9}, "n")])
def test_bad_text_completion_input_is_a_400(tiny, tmp_path, body, param):
    from serve.completions import CompletionRequest, text_plan

    model, _ = served(tiny, tmp_path)
    with pytest.raises(APIError) as e:
        text_plan(model, CompletionRequest.model_validate({"model": "m", "prompt": "x", **body}))
    assert e.value.status == 400 and e.value.param == param


@pytest.mark.slow  # builds two model replicas (vLLM's faked, HF's real)
def test_a_vllm_replica_builds_no_hf_model_beside_its_engine(tiny, monkeypatch):
    """The replica hands vLLM's factory a policy without weights (one copy of the weights: vLLM's),
    with the tokenizer and end tokens ``load_policy`` would give; an HF replica still loads them."""
    import sqlrl.policy.load as load
    from serve.model_server import ModelServer
    from sqlrl.policy import backends

    built, loaded = [], []
    real_load = load.load_policy

    def fake_vllm(policy, seed=None, **options):
        built.append((policy, options))
        engine = ScriptedEngine(policy.tokenizer, policy.eos_token_ids, script=SCRIPT)
        engine.max_model_len = 2048
        return engine

    monkeypatch.setitem(backends.ENGINES, "vllm", fake_vllm)
    monkeypatch.setattr(load, "load_policy", lambda *a, **kw: loaded.append(kw["weights"]) or real_load(*a, **kw))
    server = ModelServer("m", {"models": {"m": {"policy": {"model": "tiny", "backend": "vllm", "dtype": "fp32",
                                                           "engine_options": {"kv_cache_gb": 1}},
                                                "max_batch_size": 4}}})
    (policy, options), = built
    assert policy.model is None and loaded == [False]  # the tokenizer and end tokens only
    assert policy.dtype == "float32" and options == {"kv_cache_gb": 1, "max_num_seqs": 4}
    assert (policy.eos_token_ids, policy.pad_token_id) == (tiny.eos_token_ids, tiny.pad_token_id)
    assert policy.tokenizer.padding_side == "left" and server.model.window == 2048
    out = asyncio.run(server.chat({"model": "m", "messages": [{"role": "user", "content": "weather?"}]}))
    assert out[0] == "ok" and "Let me check." in out[2]["choices"][0]["message"]["content"]

    ModelServer("h", {"models": {"h": {"policy": {"model": "tiny", "backend": "scripted"}}}})
    assert loaded == [False, True]  # the other kinds load the model, once (the scripted one reads its window)


def test_a_served_model_is_built_by_its_policy_spec_with_the_batch_bound_as_the_engines_option():
    """``build_served``: training's load and engine factory (``PolicySpec``), ``max_batch_size`` as
    the engine's own option (hf: ``max_batch``), ``auto`` resolved on the checkpoint folder."""
    from serve.config import load_serve_config
    from serve.engines import KINDS, build_served
    from sqlrl.policy.backends import vllm_unavailable

    spec = load_serve_config({"models": {"m": {"policy": {"model": "tiny", "backend": "hf", "dtype": "bf16"},
                                               "max_batch_size": 3}}}).models["m"]
    served = build_served(spec, seed=5)
    try:
        assert served.kind is KINDS["hf"] and served.engine._scheduler.max_batch == 3
        assert str(next(served.policy.model.parameters()).dtype) == "torch.bfloat16"
    finally:
        asyncio.run(served.engine.close())
    auto = load_serve_config({"models": {"m": {"policy": {"model": "tiny"}}}}).models["m"]  # backend: auto
    served = build_served(auto)
    try:
        assert served.kind is KINDS["hf" if vllm_unavailable(served.policy) else "vllm"]
    finally:
        asyncio.run(served.engine.close())


@pytest.mark.parametrize("backend", ["hf", "scripted", "auto"])
def test_a_served_model_loads_its_tokenizer_once(backend, monkeypatch):
    """Every backend, a resolution (``auto``) included, reads the checkpoint's tokenizer once: the
    weight-less policy ``auto`` resolves on is the one the model is added to."""
    from serve.engines import build_served
    from sqlrl.policy import load

    real, calls = load.load_tokenizer, []
    monkeypatch.setattr(load, "load_tokenizer", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    spec = load_serve_config({"models": {"m": {"policy": {"model": "tiny", "backend": backend}}}}).models["m"]
    served = build_served(spec)
    try:
        assert len(calls) == 1
        if served.kind.loads_weights:
            assert served.policy.model is not None and not served.policy.model.training
    finally:
        asyncio.run(served.engine.close())


def test_auto_is_a_registered_resolution_and_every_served_name_an_engine():
    """Serving's names are its resolutions and its kinds, each one a registered engine (so the
    config check, the error text and ``PolicySpec`` agree); the message lists them all."""
    from serve.engines import KINDS, RESOLUTIONS, check_served, served_names
    from sqlrl.policy.backends import ENGINES

    assert "auto" in RESOLUTIONS and set(served_names()) <= set(ENGINES)
    assert served_names() == ("auto", *KINDS) and check_served("auto") == "auto"
    with pytest.raises(ValueError, match=r"'hf-batched' cannot serve; serving runs: auto, hf, vllm, scripted \(an engine"):
        check_served("hf-batched")
    with pytest.raises(ValueError, match=r"'nothing' cannot serve; serving runs: auto, hf, vllm, scripted$"):
        check_served("nothing")


def test_a_registered_engine_serving_has_no_kind_for_names_where_its_kind_goes(monkeypatch):
    from serve.engines import check_served
    from sqlrl.policy import backends

    monkeypatch.setitem(backends.ENGINES, "echo", backends.ENGINES["scripted"])
    with pytest.raises(ValueError, match=r"'echo' cannot serve; .* serves once serve/engines.py::KINDS has its EngineKind"):
        check_served("echo")


def test_a_resolution_that_picks_an_engine_serving_has_no_kind_for_is_refused(monkeypatch):
    """Serving lists the engine registry's resolutions (one registry): a newly registered one is a
    served name, and one that resolves to an engine serving has no kind for is refused naming both."""
    from serve import engines
    from sqlrl.policy import backends

    for registry in (backends.RESOLUTIONS, backends.ENGINES):
        monkeypatch.setitem(registry, "pick", None)  # the key is removed again after the test
    backends.register_resolution("pick", backends.Resolution(("hf-batched",), lambda policy: "hf-batched",
                                                             "hf-batched, always"))
    assert engines.RESOLUTIONS is backends.RESOLUTIONS and "pick" in engines.served_names()
    spec = load_serve_config({"models": {"m": {"policy": {"model": "tiny", "backend": "pick"}}}}).models["m"]
    with pytest.raises(ValueError, match="backend 'pick' resolved to 'hf-batched', which cannot serve; serving runs: hf,"):
        engines.build_served(spec)


def test_a_light_policy_of_another_model_or_precision_is_refused():
    from sqlrl.policy.spec import PolicySpec

    light = PolicySpec(model="tiny").load(weights=False)
    with pytest.raises(ValueError, match="light policy 'tiny' \\(float32\\) is not this spec's 'tiny' \\(bfloat16\\)"):
        PolicySpec(model="tiny", dtype="bf16").load(light=light)
    assert PolicySpec(model="tiny").load(weights=False, light=light).model is None  # weights=False: a fresh light load

