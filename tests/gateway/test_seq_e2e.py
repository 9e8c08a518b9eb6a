"""End to end through the real gateway: the example agents, unchanged, as K client processes against
the gateway app on the tiny model's HF engine (real sampling); the traces it records -> training
rows (``sqlrl.gateway.train.build_step``) -> one GRPO learner step. Checked: every call captured
and tagged, the merged ids exactly the engine's, the learner's re-scored log-probs equal the
sampled ones on the trained tokens, observations masked, the weights changed, sessions released."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

pytest.importorskip("langgraph", reason="the agents extra (langgraph, langchain-openai) is not installed")
pytest.importorskip("serve.gateway", reason="the gateway app (issue 44) is not in this checkout")


from examples.run_clients import run_clients  # noqa: E402
from sqlrl.gateway.sequences import SequenceConfig  # noqa: E402
from sqlrl.gateway.train import TraceTrainConfig, build_step  # noqa: E402
from sqlrl.learn.config import GRPOConfig  # noqa: E402

from .conftest import KEY, gateway, shop_task  # noqa: E402
from .test_seq_learner import rescore_and_step  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.mark.parametrize("agent,tags", [("langgraph", {"write", "check", "rewrite"}), ("openai", {"agent"})])
def test_example_clients_train_through_the_gateway(tiny, shop_catalog, agent, tags):
    from sqlrl.agent.chat_format import HFChatFormat
    from sqlrl.policy.backends import make_engine

    engine = make_engine("hf", tiny, max_batch=4)
    try:
        with gateway(tiny, engine, shop_catalog) as gw:
            for g in range(2):  # two GRPO groups of two rollouts
                gw.rollouts.offer(f"g{g}", shop_task(f"t{g}"), 2)
            gw.rollouts.finish()  # 410 once they are claimed
            codes = run_clients(gw.url, KEY, agent, 2, {"max_turns": 2, "max_tokens": 12, "temperature": 1.0})
            traces = gw.rollouts.drain()
            sampled = [(p, g.token_ids, g.logprobs) for p, g in gw.recorder.finished]
            open_sessions = gw.rollouts.stats()
    finally:
        asyncio.run(engine.close())
    assert codes == [0, 0]
    assert len(traces) == 4 and all(t.status == "completed" for t in traces), [t.status for t in traces]
    calls = [c for t in traces for c in t.calls]
    assert len(calls) == len(gw.recorder.finished)  # every call the engine answered was captured
    assert {c.tag for c in calls} <= tags and all(c.tag for c in calls)
    # the traces hold exactly what the engine sampled (prompts repeat within a group: compare as multisets)
    assert sorted(sampled) == sorted((c.prompt_ids, c.response_ids, c.logprobs) for c in calls)
    assert all(t.reward == 0.0 for t in traces)  # random-init weights solve nothing: the Judge's zeros
    fmt = HFChatFormat(tiny.tokenizer)
    cfg = TraceTrainConfig(SequenceConfig(turn_end_ids=fmt.turn_end_ids))
    assert build_step(traces, cfg, GRPOConfig(), pad_id=tiny.pad_token_id).batch is None  # no signal: no update
    # for a gradient, the first rollout of each group is given reward 1 (the Judge's rewards are tested in
    # the gateway's own tests; here the rows built from the real traces are what is under test)
    firsts = {t.group_id: t.rollout_id for t in reversed(traces)}
    traces = [dataclasses.replace(t, reward=1.0, reward_parts={"result": 1.0})
              if firsts[t.group_id] == t.rollout_id else t for t in traces]
    build = build_step(traces, cfg, GRPOConfig(), pad_id=tiny.pad_token_id)
    m = build.metrics
    assert m["rollouts"] == 4 and m["calls"] == len(calls) and m["trained_on"] == len(build.kept) > 0
    assert m["merged_share"] * sum(len(t.calls) - 1 for t in traces) + m["mismatches"] == \
        pytest.approx(sum(len(t.calls) - 1 for t in traces))
    batch = build.batch
    for row, i in enumerate(build.kept):  # token-exact: the last call's prompt + response
        seq = build.rows.sequences[i]
        last = next(c for t in traces for c in t.calls if c.rollout_id == seq.rollout_id
                    and c.index == seq.call_indices[-1])
        assert seq.token_ids == last.prompt_ids + last.response_ids
    rescore_and_step(tiny, batch)
    assert open_sessions.active == 0 and open_sessions.in_flight == 0  # every session released
