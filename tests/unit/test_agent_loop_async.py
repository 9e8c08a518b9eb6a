"""The agent loop as one coroutine per rollout on an ``AsyncEngine``: rollouts do not wait for each
other, an engine error ends only the rollout it was generating, a deadline aborts in the engine,
the concurrency bound holds, tool calls ready together share one ``execute_many``, and every turn
samples with its own seed. Held by the scripted engine's gates (events), never by time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sqlrl.agent import AgentLoop, HFChatFormat, LoopConfig, State
from sqlrl.agent.loop import turn_seed
from sqlrl.policy.engine import check_engine_class
from sqlrl.policy.scripted import Latch, ScriptedEngine
from sqlrl.policy.types import SamplingParams, row_seed
from tests.unit.test_agent_loop import fmt, sessions, task, tc, tok  # noqa: F401 (fixtures)

CFG = LoopConfig(max_turns=6, max_total_tokens=20000, sampling=SamplingParams(max_new_tokens=400))
SUBMIT = tc("SELECT 1", "submit_solution")


def engine_for(tok: Any, scripts: dict[str, list[Any]]) -> ScriptedEngine:
    return ScriptedEngine(tok, script=[{"match": k, "turns": v} for k, v in scripts.items()])


def finished(index: int) -> tuple[Latch, Any]:
    done = Latch()
    return done, lambda s: done.set() if s.index == index else None


def test_a_rollout_does_not_wait_for_another(tok, fmt, sessions):
    """A's first turn is held open while B generates three turns and runs two SQL calls."""
    engine = engine_for(tok, {"Q-a": [tc("SELECT 1"), SUBMIT],
                              "Q-b": [tc("SELECT count(*) FROM customers"), tc("SELECT 2"), SUBMIT]})
    gate = engine.hold("Q-a", turn=0, after_tokens=3)
    b_done, on_finish = finished(1)
    loop = AgentLoop([task("Q-a"), task("Q-b")], sessions(2), engine, fmt, CFG, on_finish=on_finish)

    async def main():
        run = asyncio.ensure_future(loop.arun())
        await gate.reached.wait()
        await b_done.wait()
        a_state, a_turns = loop.states[0].state, len(loop.states[0].turns)
        gate.open()
        return a_state, a_turns, await run

    a_state, a_turns, (a, b) = asyncio.run(main())
    assert (a_state, a_turns) == (State.GENERATING, 0)
    assert b.stop_reason == "submitted" and len(b.turns) == 3 and b.n_tool_calls == 3
    assert a.stop_reason == "submitted" and len(a.turns) == 2
    starts = [rid for event, rid in engine.log if event == "start"]
    a_first = starts[0]
    assert a_first.endswith("/0/0") and engine.log.index(("finish", a_first)) > max(
        engine.log.index(("finish", rid)) for rid in starts if "/1/" in rid)


def test_an_engine_error_mid_generation_ends_only_that_rollout(tok, fmt, sessions):
    engine = engine_for(tok, {"Q-crash": [tc("SELECT 1"), {"error": "CUDA out of memory", "after_tokens": 4}],
                              "Q-fine": [tc("SELECT 1"), SUBMIT]})
    gate = engine.hold("Q-fine", turn=1, after_tokens=2)  # B is generating when A fails
    a_done, on_finish = finished(0)
    loop = AgentLoop([task("Q-crash"), task("Q-fine")], sessions(2), engine, fmt, CFG, on_finish=on_finish)

    async def main():
        run = asyncio.ensure_future(loop.arun())
        await a_done.wait()
        await gate.reached.wait()
        b_state = loop.states[1].state
        gate.open()
        return b_state, await run

    b_state, (crash, fine) = asyncio.run(main())
    assert b_state is State.GENERATING
    assert crash.stop_reason == "error" and crash.error == "generation failed: CUDA out of memory"
    assert len(crash.turns) == 1 and crash.loss_mask[-1] == 0  # the failed turn's tokens are not kept
    assert fine.stop_reason == "submitted" and fine.error is None
    assert ("error", next(rid for e, rid in engine.log if e == "start" and rid.endswith("/0/1"))) in engine.log


def test_the_deadline_aborts_the_generation_in_the_engine(tok, fmt, sessions):
    engine = engine_for(tok, {"Q-stuck": [tc("SELECT 1")]})
    engine.hold("Q-stuck", after_tokens=2)  # never opened: only the deadline ends it
    cfg = LoopConfig(**{**CFG.__dict__, "deadline_s": 0.05})
    (t,) = AgentLoop([task("Q-stuck")], sessions(1), engine, fmt, cfg).run()
    assert t.stop_reason == "timeout" and "deadline of 0.05 s" in t.error
    assert t.turns == () and len(t.token_ids) == t.prompt_length  # the partial turn is dropped
    (rid,) = [rid for e, rid in engine.log if e == "start"]
    assert engine.log == [("start", rid), ("abort", rid)] and engine.in_flight == 0


def test_at_most_max_concurrent_trajectories_run_at_once(tok, fmt, sessions):
    engine = engine_for(tok, {"Q-first": [SUBMIT], "Q-second": [SUBMIT]})
    gate = engine.hold("Q-first", after_tokens=1)
    cfg = LoopConfig(**{**CFG.__dict__, "max_concurrent_trajectories": 1})
    loop = AgentLoop([task("Q-first"), task("Q-second")], sessions(2), engine, fmt, cfg)

    async def main():
        run = asyncio.ensure_future(loop.arun())
        await gate.reached.wait()
        before = list(engine.log)
        gate.open()
        return before, await run

    before, trajs = asyncio.run(main())
    assert len(before) == 1 and loop.states[1].history[0] is State.PROMPTING
    assert [e for e, _ in engine.log] == ["start", "finish", "start", "finish"]
    assert all(t.stop_reason == "submitted" for t in trajs)


def test_tool_calls_ready_in_the_same_step_share_one_execute_many(tok, fmt, sessions):
    calls: list[list[str]] = []

    def execute_many(pairs):
        calls.append([sql for _, sql in pairs])
        return [s.execute(sql) for s, sql in pairs]

    same = tc("SELECT 1")  # equal lengths: both turns end in the same engine step
    engine = engine_for(tok, {"Q-x": [same, SUBMIT], "Q-y": [same, SUBMIT], "Q-z": ["no call", SUBMIT]})
    loop = AgentLoop([task("Q-x"), task("Q-y"), task("Q-z")], sessions(3), engine, fmt, CFG,
                     execute_many=execute_many)
    x, y, z = loop.run()
    assert calls == [["SELECT 1", "SELECT 1"]] and loop.tool_batches == [2]
    assert x.turns[0].tool_ms == y.turns[0].tool_ms
    assert (x.stop_reason, y.stop_reason, z.stop_reason) == ("submitted",) * 3 and z.n_malformed == 1


class SeedRecorder(ScriptedEngine):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seeds: dict[str, int | None] = {}

    async def generate(self, prompt_ids, sampling, *, request_id=None):
        self.seeds[request_id.split("/", 1)[1]] = sampling.seed
        return await super().generate(prompt_ids, sampling, request_id=request_id)


check_engine_class(SeedRecorder)


@pytest.mark.parametrize("seed", [7, None])
def test_every_turn_samples_with_its_own_seed(tok, fmt, sessions, seed):
    engine = SeedRecorder(tok, script=[{"match": "Q-", "turns": [tc("SELECT 1"), SUBMIT]}])
    cfg = LoopConfig(**{**CFG.__dict__, "sampling": SamplingParams(max_new_tokens=400, seed=seed)})
    AgentLoop([task("Q-a"), task("Q-b")], sessions(2), engine, fmt, cfg).run()
    assert engine.seeds == {f"{i}/{k}": turn_seed(seed, i, k) for i in range(2) for k in range(2)}
    if seed is not None:
        assert turn_seed(seed, 1, 0) == row_seed(seed, 1, 0) and len(set(engine.seeds.values())) == 4


def test_a_rollouts_samples_do_not_depend_on_its_batch(tmp_path_factory):
    """On the tiny HF model (an HFBackend handed to the loop runs on its native HFEngine): rollout 0
    alone and beside another draws the same."""
    pytest.importorskip("transformers")
    from sqlrl.policy.backends import make_backend
    from sqlrl.policy.load import load_policy

    policy = load_policy("tiny", cache_dir=tmp_path_factory.getbasetemp() / "policy-cache")
    backend = make_backend("hf", policy)
    fmt = HFChatFormat(policy.tokenizer)
    cfg = LoopConfig(mode="single", max_total_tokens=4000,
                     sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=3))
    (alone,) = AgentLoop([task("Q-one")], None, backend, fmt, cfg).run()
    together = AgentLoop([task("Q-one"), task("Q-two")], None, backend, fmt, cfg).run()
    assert alone.token_ids == together[0].token_ids and alone.token_ids != together[1].token_ids


def test_a_batch_backend_with_a_native_engine_runs_on_it(tmp_path_factory):
    """``as_engine``: an HFBackend gives its HFEngine (sharing the backend), a backend without one the
    lock-step adapter; an engine is used as it is."""
    pytest.importorskip("transformers")
    from sqlrl.policy.backends import make_backend
    from sqlrl.policy.batched import BatchedEngine, as_engine
    from sqlrl.policy.hf_engine import HFEngine
    from sqlrl.policy.load import load_policy
    from sqlrl.policy.scripted import ScriptedBackend

    policy = load_policy("tiny", cache_dir=tmp_path_factory.getbasetemp() / "policy-cache")
    backend = make_backend("hf", policy)
    engine, owned = as_engine(backend)
    try:
        assert isinstance(engine, HFEngine) and engine.backend is backend and owned
    finally:
        asyncio.run(engine.close())
    adapter, owned = as_engine(ScriptedBackend(policy.tokenizer, policy.eos_token_ids))
    assert isinstance(adapter, BatchedEngine) and owned
    asyncio.run(adapter.close())
    assert as_engine(engine) == (engine, False)


def test_run_inside_a_running_loop_says_to_await(tok, fmt):
    loop = AgentLoop([task("Q-a")], None, engine_for(tok, {"Q-a": ["x"]}), fmt,
                     LoopConfig(mode="single", max_total_tokens=20000, sampling=SamplingParams(max_new_tokens=400)))

    async def main():
        with pytest.raises(RuntimeError, match="await the coroutine instead"):
            loop.run()
        return await loop.arun()

    (t,) = asyncio.run(main())
    assert t.stop_reason == "single_turn"


@pytest.mark.parametrize("kwargs, message", [
    (dict(tool_window_s=-1), "tool_window_s must be >= 0"),
    (dict(max_concurrent_trajectories=0), "max_concurrent_trajectories must be >= 1"),
])
def test_loop_config_validation_of_the_new_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LoopConfig(**kwargs)
