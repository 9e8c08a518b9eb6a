"""The gateway on the tiny HF engine (a real model, real sampling): the ids and log-probs a rollout's
trace holds are exactly what the engine sampled, streamed or not, and a weight update pushed through
the engine shows in the next call's per-token versions."""

from __future__ import annotations

import asyncio

import pytest

from sqlrl.tools import tool_schemas

from .conftest import GOLD, QUESTION, gateway, shop_task

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]


def test_traces_on_the_tiny_hf_engine_are_token_exact(tiny, shop_catalog):
    from sqlrl.policy.backends import make_engine

    engine = make_engine("hf", tiny, max_batch=4)
    try:
        with gateway(tiny, engine, shop_catalog) as gw:
            gw.rollouts.offer("g", shop_task(), 1)
            claim = gw.claim()
            client = gw.client(claim["base_url"])
            messages = [{"role": "user", "content": QUESTION}]
            tools = tool_schemas(["execute_sql"])
            whole = client.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=12,
                                                   temperature=1.0, seed=7, logprobs=True)
            streamed = list(client.chat.completions.create(model="m", messages=messages, max_tokens=12,
                                                           temperature=1.0, seed=8, stream=True, logprobs=True))
            weights = {k: v.clone() for k, v in tiny.model.state_dict().items()}
            assert asyncio.run(engine.update_weights(weights)) == 1
            client.chat.completions.create(model="m", messages=messages, max_tokens=4, temperature=0.0)
            assert gw.post(f"/v1/rollouts/{claim['rollout_id']}/complete", {"sql": GOLD}).json()["reward"] == 1.0
            (trace,) = gw.rollouts.drain()
    finally:
        asyncio.run(engine.close())
    assert len(trace.calls) == 3 == len(gw.recorder.finished)
    for call, (prompt, g) in zip(trace.calls, gw.recorder.finished):
        assert call.prompt_ids == prompt and call.response_ids == g.token_ids and call.logprobs == g.logprobs
        assert all(lp <= 0.0 for lp in call.logprobs) and len(call.response_ids) >= 1
    # what the client saw is what was traced: one log-prob entry per sampled token, equal values
    assert [e.logprob for e in whole.choices[0].logprobs.content] == pytest.approx(list(trace.calls[0].logprobs))
    streamed_lps = [e.logprob for p in streamed for c in p.choices if c.logprobs for e in c.logprobs.content]
    assert streamed_lps == pytest.approx(list(trace.calls[1].logprobs))
    assert set(trace.calls[0].versions) == {0} and set(trace.calls[2].versions) == {1}
