"""``sqlrl.agent.rollouts``: the one rollout function -- every task at once on one engine, at most
``max_concurrent_trajectories`` in flight and as many sessions open, a session leased per trajectory
(a refused lease ends only that one), seeds by each task's index in the whole call, and sticky
routing of a GRPO group to one worker. Held by the scripted engine's gates, never by time."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from sqlrl.agent import LoopConfig
from sqlrl.agent.loop import turn_seed
from sqlrl.agent.rollouts import aroll_out, roll_out, sticky_routes
from sqlrl.db.source import LocalSessions
from sqlrl.policy.scripted import ScriptedEngine
from sqlrl.policy.types import SamplingParams
from sqlrl.tasks.types import Text2SQLTask
from tests.unit.test_agent_loop import fmt, task, tc, tok  # noqa: F401 (fixtures)
from tests.unit.test_agent_loop_async import SeedRecorder

CFG = LoopConfig(max_turns=4, max_total_tokens=20000, sampling=SamplingParams(max_new_tokens=400, seed=5))
SUBMIT = tc("SELECT 1", "submit_solution")


class CountingSessions(LocalSessions):
    """A local source that counts open sessions (and the most open at once) and can refuse a db."""

    def __init__(self, url: str, refuse: str | None = None) -> None:
        super().__init__({"shop": {"sqlite": url}})
        self.refuse, self.open, self.most, self.opened, self.calls = refuse, 0, 0, 0, []
        self._lock = threading.Lock()

    def open_many(self, requests):
        self.calls.append(len(requests))
        if any(r.db == self.refuse for r in requests):
            raise LookupError(f"no database {self.refuse!r} in this catalog")
        out = super().open_many(requests)
        with self._lock:
            self.open += len(out)
            self.opened += len(out)
            self.most = max(self.most, self.open)
        return out

    def close_many(self, sessions):
        with self._lock:
            self.open -= len(sessions)
        super().close_many(sessions)


def engine_for(tok: Any, scripts: dict[str, list[Any]]) -> ScriptedEngine:
    return ScriptedEngine(tok, script=[{"match": k, "turns": v} for k, v in scripts.items()])


def test_every_task_runs_with_at_most_the_bound_in_flight_and_as_many_sessions(tok, fmt, demo_db_path):
    engine = engine_for(tok, {"Q-": [tc("SELECT 1"), SUBMIT]})
    source = CountingSessions(f"sqlite:///{demo_db_path}")
    cfg = LoopConfig(**{**CFG.__dict__, "max_concurrent_trajectories": 2})
    tasks = [task(f"Q-{i}") for i in range(5)]
    out = roll_out(engine, fmt, tasks, cfg, sessions=source)
    assert [t.task_id for t in out] == [t.task_id for t in tasks]
    assert all(t.stop_reason == "submitted" and t.n_tool_calls == 2 for t in out)
    assert source.opened == 5 and source.open == 0 and source.most == 2
    assert source.calls[0] == 2  # the two that started together shared one open_many


def test_trajectories_that_start_together_lease_in_one_call_and_reach_the_engine_together(tok, fmt, demo_db_path):
    engine = engine_for(tok, {"Q-": [SUBMIT]})
    source = CountingSessions(f"sqlite:///{demo_db_path}")
    out = roll_out(engine, fmt, [task(f"Q-{i}") for i in range(4)], CFG, sessions=source)
    assert source.calls == [4] and all(t.stop_reason == "submitted" for t in out)
    starts = [i for i, (e, _) in enumerate(engine.log) if e == "start"]
    assert starts == [0, 1, 2, 3]  # all four requests were in the engine before any finished


def test_a_finished_trajectory_frees_its_slot_for_the_next_one_at_once(tok, fmt, demo_db_path):
    """With a bound of 2, the third task starts while the first is still held: no batch barrier."""
    engine = engine_for(tok, {"Q-slow": [SUBMIT], "Q-": [SUBMIT]})
    slow, third = engine.hold("Q-slow", after_tokens=1), engine.hold("Q-b", after_tokens=1)
    cfg = LoopConfig(**{**CFG.__dict__, "max_concurrent_trajectories": 2})
    tasks = [task("Q-slow"), task("Q-a"), task("Q-b")]

    async def main():
        run = asyncio.ensure_future(aroll_out(engine, fmt, tasks, cfg, sessions=CountingSessions(
            f"sqlite:///{demo_db_path}")))
        await slow.reached.wait()
        await third.reached.wait()  # b generates while slow is still held: a's slot went to b
        held = [rid for e, rid in engine.log if e == "start" and ("finish", rid) not in engine.log]
        slow.open()
        third.open()
        return held, await run

    held, out = asyncio.run(main())
    assert len(held) == 2 and [t.stop_reason for t in out] == ["submitted"] * 3


def test_a_refused_lease_ends_only_that_trajectory(tok, fmt, demo_db_path):
    engine = engine_for(tok, {"Q-": [SUBMIT]})
    source = CountingSessions(f"sqlite:///{demo_db_path}", refuse="elsewhere")
    lost = Text2SQLTask(task_id="lost", db_id="elsewhere", question="Q-lost", gold_sql="SELECT 1")
    out = roll_out(engine, fmt, [lost, task("Q-ok")], CFG, sessions=source)
    assert out[0].stop_reason == "error" and "could not open sessions" in out[0].error and "elsewhere" in out[0].error
    assert out[1].stop_reason == "submitted" and source.open == 0
    assert source.calls == [2, 1, 1]  # the shared open was refused: each retried alone


def test_agentic_rollouts_without_a_session_source_are_typed_errors(tok, fmt):
    out = roll_out(engine_for(tok, {"Q-": [SUBMIT]}), fmt, [task("Q-1")], CFG)
    assert out[0].stop_reason == "error" and "session source" in out[0].error
    assert roll_out(engine_for(tok, {}), fmt, [], CFG) == []


def test_seed_indexes_give_each_task_the_seeds_of_its_place_in_the_whole_call(tok, fmt, demo_db_path):
    engine = SeedRecorder(tok, script=[{"match": "Q-", "turns": [SUBMIT]}])
    source = CountingSessions(f"sqlite:///{demo_db_path}")
    roll_out(engine, fmt, [task("Q-a"), task("Q-b")], CFG, sessions=source, seed_indexes=[7, 3])
    assert engine.seeds == {"0/0": turn_seed(5, 7, 0), "1/0": turn_seed(5, 3, 0)}
    with pytest.raises(ValueError, match="seed indexes"):  # a programming error, raised before anything runs
        from sqlrl.agent import AgentLoop
        AgentLoop([task("Q-a")], None, engine, fmt, LoopConfig(mode="single"), seed_indexes=[1, 2])


def test_sticky_routes_keep_a_group_on_one_worker_and_balance_groups():
    tasks = [task(q) for q in ("a", "a", "a", "a", "b", "b", "b", "b", "c", "c", "c", "c", "d", "d", "d", "d")]
    routes = sticky_routes(tasks, 2)
    by_group = {}
    for t, w in zip(tasks, routes):
        by_group.setdefault(t.task_id, set()).add(w)
    assert all(len(ws) == 1 for ws in by_group.values())  # a group never splits
    assert routes.count(0) == routes.count(1) == 8  # whole groups, balanced
    assert sticky_routes(tasks, 2) == routes  # deterministic
    assert sticky_routes([task("x"), task("y"), task("x")], 3) == [0, 1, 0]
    assert sticky_routes(tasks, 1) == [0] * 16
    with pytest.raises(ValueError, match="n >= 1"):
        sticky_routes(tasks, 0)
