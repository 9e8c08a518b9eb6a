"""Structured output on the HF engine (``sqlrl.policy.constraints`` + ``HFEngine``) and forced tool
calls in serving (``serve.openai_chat.call_constraint`` through ``ModelEngine`` on ``HFEngine``), on
the tiny random-weight model: without the grammar it writes noise, so every parse below is the
grammar's doing."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("xgrammar")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")

from serve.config import load_serve_config  # noqa: E402
from serve.engine import ModelEngine  # noqa: E402
from serve.openai_chat import APIError, ChatRequest  # noqa: E402
from sqlrl.policy.constraints import GrammarMasks, StructuredOutput, json_grammar, literal_grammar  # noqa: E402
from sqlrl.policy.hf_backend import processed_logprobs  # noqa: E402
from sqlrl.policy.hf_engine import HFEngine  # noqa: E402
from sqlrl.policy.load import load_policy  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARGS = {"type": "object", "properties": {"sql": {"type": "string", "maxLength": 12},
                                         "limit": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["sql", "limit"]}
TOOLS = [{"type": "function", "function": {"name": "execute_sql", "parameters": ARGS}},
         {"type": "function", "function": {"name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny")


@pytest.fixture(scope="module")
def prompt(policy):
    return policy.tokenizer.apply_chat_template([{"role": "user", "content": "How many orders?"}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False)


def run_engine(policy, coro_of):
    async def main():
        engine = HFEngine(policy, prefix_cache=False, max_batch=8)
        try:
            return await coro_of(engine)
        finally:
            await engine.close()
    return asyncio.run(main())


def test_constrained_samples_follow_the_schema_and_end_with_eos(policy, prompt):
    grammar = json_grammar(ARGS, suffix="\nDONE")
    params = [SamplingParams(temperature=1.0, max_new_tokens=80, seed=s, structured=grammar) for s in range(6)]
    free = SamplingParams(temperature=1.0, max_new_tokens=30, seed=0)

    gens = run_engine(policy, lambda e: asyncio.gather(*[e.generate(prompt, p) for p in params + [free]]))
    for g in gens[:-1]:
        assert g.finish_reason == "eos", g.text
        body, _, tail = g.text.rpartition("\n")
        assert tail == "DONE"
        jsonschema.validate(json.loads(body), ARGS)
    assert len({g.text for g in gens[:-1]}) > 1  # different seeds: different samples
    with pytest.raises(ValueError):  # the free one beside them is the tiny model's noise
        json.loads(gens[-1].text)


def test_logprobs_are_those_of_the_masked_distribution(policy, prompt):
    """Teacher-forced recomputation: each token's reported log-prob equals the log-softmax of the
    MASKED logits (after temperature/top-p), and differs from the unmasked one."""
    grammar = json_grammar(ARGS)
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=60, seed=5, structured=grammar)
    gen = run_engine(policy, lambda e: e.generate(prompt, params))
    masks = GrammarMasks(policy.tokenizer, policy.model.get_input_embeddings().weight.shape[0], policy.eos_token_ids)
    matcher = masks.matcher(masks.compile(grammar))
    ids = torch.tensor([list(prompt) + list(gen.token_ids)])
    with torch.inference_mode():
        logits = policy.model(ids).logits[0, len(prompt) - 1:-1].float()
    masked_lp, free_lp = [], []
    for i, tok in enumerate(gen.token_ids):
        row = logits[i].clone()
        free_lp.append(processed_logprobs(row, 0.8, 0.95)[tok].item())
        matcher.mask(row)
        masked_lp.append(processed_logprobs(row, 0.8, 0.95)[tok].item())
        assert matcher.accept(tok)
    assert gen.logprobs == pytest.approx(masked_lp, abs=1e-4)
    assert max(m - f for m, f in zip(masked_lp, free_lp)) > 0.5  # the mask changed the distribution
    assert matcher.terminated  # the EOS ended the grammar


def test_greedy_constrained_equals_between_stream_and_generate(policy, prompt):
    params = SamplingParams(temperature=0, max_new_tokens=40, structured=literal_grammar("SELECT 1;"))

    async def both(engine):
        whole = await engine.generate(prompt, params)
        streamed = [d async for d in engine.stream(prompt, params)]
        return whole, streamed
    whole, streamed = run_engine(policy, both)
    assert whole.text == "SELECT 1;" and whole.finish_reason == "eos"
    assert streamed[-1].final.token_ids == whole.token_ids
    assert [d.token_id for d in streamed[:-1]] == list(whole.token_ids)


def test_bad_grammars_and_schemas_are_value_errors(policy, prompt):
    with pytest.raises(ValueError):
        StructuredOutput("not a grammar")
    with pytest.raises(ValueError):
        json_grammar({"type": "object", "properties": {"x": {"type": "no-such-type"}}})
    with pytest.raises(ValueError):
        SamplingParams(structured="root ::= \"a\"")  # type: ignore[arg-type]
    bad = SamplingParams(max_new_tokens=4, structured=StructuredOutput('root ::= "a" undefined_rule'))

    async def go(engine):
        with pytest.raises(ValueError, match="does not compile"):
            await engine.generate(prompt, bad)
        return await engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=3))
    assert len(run_engine(policy, go).token_ids) == 3  # the engine goes on


# -- serving: forced tool calls -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(policy):
    config = load_serve_config({"models": {"m": {"policy": {"model": "tiny"}}}, "limits": {"max_n": 4}})
    return config


def serve_chat(policy, config, constrains=True, **body):
    req = ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "orders?"}],
                                      "tools": TOOLS, "max_tokens": 120, **body})

    async def main():
        engine = HFEngine(policy, prefix_cache=False, max_batch=8)
        try:
            model = ModelEngine("m", policy, engine, config, constrains=constrains)
            return await model.chat(model.chat_plan(req))
        finally:
            await engine.close()
    return asyncio.run(main())


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "execute_sql"}}])
def test_a_forced_call_always_yields_tool_calls_valid_under_the_schema(policy, served, choice):
    out = serve_chat(policy, served, tool_choice=choice, n=4, seed=3, temperature=1.0)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in out["choices"]:
        assert c["finish_reason"] == "tool_calls", c
        (call,) = c["message"]["tool_calls"]
        name = call["function"]["name"]
        if isinstance(choice, dict):
            assert name == "execute_sql"
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[name])


def test_auto_stays_free_and_an_unenforceable_schema_is_a_400(policy, served):
    out = serve_chat(policy, served, tool_choice="auto", seed=3, max_tokens=12)
    assert out["choices"][0]["finish_reason"] == "length"  # the tiny model's noise, unconstrained
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "no-such-type"}}}}}]
    with pytest.raises(APIError) as err:
        serve_chat(policy, served, tools=bad, tool_choice="required")
    assert err.value.status == 400 and err.value.param == "tools"


def test_engines_that_cannot_constrain_refuse_a_grammar(policy, prompt):
    from sqlrl.policy.backends import make_engine

    params = SamplingParams(max_new_tokens=4, structured=literal_grammar("x"))

    async def refused(engine):
        try:
            with pytest.raises(ValueError, match="cannot constrain"):
                await engine.generate(prompt, params)
            free = await engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=2))
            return free.token_ids
        finally:
            await engine.close()
    assert len(asyncio.run(refused(make_engine("hf-batched", policy)))) == 2
    asyncio.run(refused(make_engine("scripted", policy)))
