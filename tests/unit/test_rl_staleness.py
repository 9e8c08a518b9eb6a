"""Weight updates in GRPO: ``rl.weight_update`` chooses the ``UpdatePolicy`` the learner's weights go
into the running engines with; per-token policy versions reach the trajectories (mapped to the
learner's numbering) and the learner masks tokens an older version generated (``continue``),
counting them; under ``drain`` nothing changes. Held by the scripted engine's gates, never by time."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace as NS

import pytest
import torch

from sqlrl.agent import AgentLoop, LoopConfig
from sqlrl.agent.trajectory import Trajectory
from sqlrl.policy.engine import UpdatePolicy
from sqlrl.policy.scripted import ScriptedEngine
from sqlrl.policy.types import SamplingParams
from sqlrl.rl.staleness import mask_stale
from tests.unit.test_agent_loop import fmt, sessions, task, tc, tok  # noqa: F401 (fixtures)

CFG = LoopConfig(max_turns=3, max_total_tokens=20000, sampling=SamplingParams(max_new_tokens=400))
WEIGHTS = {"scripted.weight": torch.zeros(1)}


def traj(mask, versions=(), policy_version=0, lps=None):
    lps = lps or [0.5 if m else 0.0 for m in mask]
    return Trajectory(task_id="t", mode="single", messages=(), token_ids=tuple(range(len(mask))),
                      loss_mask=tuple(mask), old_logprobs=tuple(-x for x in lps), prompt_length=1, turns=(),
                      n_tool_calls=0, n_tool_errors=0, n_malformed=0, submitted_sql=None,
                      stop_reason="single_turn", policy_version=policy_version, token_versions=tuple(versions))


def run_with_update(tok, fmt, sessions, policy):
    """One rollout whose first turn is held after 3 tokens while the engine takes new weights under
    ``policy``; the engine's versions 0 and 1 are the learner's 10 and 11."""
    engine = ScriptedEngine(tok, script=[{"match": "Q-a", "turns": [tc("SELECT 1"), tc("SELECT 1", "submit_solution")]}])
    gate = engine.hold("Q-a", turn=0, after_tokens=3)
    versions = {0: 10}
    loop = AgentLoop([task("Q-a")], sessions(1), engine, fmt, CFG, policy_version=10, versions=versions)

    async def main():
        run = asyncio.ensure_future(loop.arun())
        await gate.reached.wait()
        update = asyncio.ensure_future(engine.update_weights(WEIGHTS, policy=policy))
        if policy is UpdatePolicy.CONTINUE:
            versions[await update] = 11  # the worker records the learner's version for the new weights
        gate.open()
        if policy is not UpdatePolicy.CONTINUE:
            versions[await update] = 11
        return await run

    (t,) = asyncio.run(main())
    return t


def test_under_continue_tokens_carry_their_version_and_the_old_ones_are_masked(tok, fmt, sessions):
    t = run_with_update(tok, fmt, sessions, UpdatePolicy.CONTINUE)
    generated = [v for m, v in zip(t.loss_mask, t.token_versions) if m]
    assert generated[:3] == [10, 10, 10] and set(generated[3:]) == {11}  # mixed: old, then new weights
    assert all(v == -1 for m, v in zip(t.loss_mask, t.token_versions) if not m)
    kept = mask_stale([t], current=11)
    assert kept.stale == 3 and kept.generated == len(generated) and kept.stale_trajectories == 1
    (k,) = kept.trajectories
    assert sum(k.loss_mask) == len(generated) - 3 and all(
        lp == 0.0 for m, lp in zip(k.loss_mask, k.old_logprobs) if not m)  # the trajectory invariant holds
    assert kept.metrics()["stale_token_frac"] == pytest.approx(3 / len(generated))
    assert Trajectory.from_dict(t.to_dict()) == t  # versions survive trajectories.jsonl


def test_under_drain_the_in_flight_turn_finishes_on_the_old_weights_and_nothing_is_masked(tok, fmt, sessions):
    t = run_with_update(tok, fmt, sessions, UpdatePolicy.DRAIN)
    first_turn = [v for m, v in zip(t.loss_mask, t.token_versions) if m][: t.turns[0].gen_tokens]
    assert set(first_turn) == {10}  # drained: the whole in-flight turn is of the old weights
    assert set(v for m, v in zip(t.loss_mask, t.token_versions) if m) == {10, 11}  # its next turn: new
    same = mask_stale([traj([0, 1, 1], [-1, 4, 4])], current=4)
    assert same.stale == 0 and same.trajectories[0].loss_mask == (0, 1, 1)  # on-policy batch unchanged


def test_trajectories_without_versions_are_of_their_policy_version():
    old, cur = traj([0, 1, 1], policy_version=2), traj([0, 1, 1], policy_version=3)
    out = mask_stale([old, cur], current=3)
    assert out.trajectories[0].loss_mask == (0, 0, 0) and out.trajectories[1] is cur
    assert (out.stale, out.generated, out.stale_trajectories) == (2, 4, 1)
    with pytest.raises(ValueError, match="token_versions"):
        traj([0, 1, 1], versions=[0, 0])


def test_the_stage_config_chooses_the_policy_and_rejects_an_unknown_one():
    from curriculum.config import RLSettings, load_stage_config

    assert RLSettings().weight_update == "drain"
    assert load_stage_config("jobs/configs/stage4.yaml", ["rl.weight_update=continue"]).rl.weight_update == "continue"
    with pytest.raises(ValueError, match="rl.weight_update must be one of drain, abort, continue"):
        RLSettings(weight_update="later")


@pytest.mark.parametrize("choice", ["drain", "continue"])
def test_the_grpo_recipe_syncs_with_the_configured_policy_and_logs_stale_tokens(monkeypatch, tmp_path, choice):
    import sqlrl.learn.batch as batch_mod
    import sqlrl.policy.load as load_mod
    from curriculum.config import CheckpointSettings, RLSettings, RolloutSettings
    from jobs.train import train_grpo

    syncs, batches = [], []

    class Learner:
        version = 1

        def step(self, batch, kind, loss):
            return {"loss": 0.5, "step": 1}

        def sync_to(self, rollout, policy="drain"):
            syncs.append(policy)
            return 2, 0.0

    def rollout(tasks):  # the first sample's first token came from the previous weights (version 0)
        return [traj([0, 1, 1], [-1, 0 if i == 0 else 1, 1], policy_version=1) for i, _ in enumerate(tasks)]

    cfg = NS(rl=RLSettings(steps=1, tasks_per_step=1, group_size=2, weight_update=choice),
             rollout=RolloutSettings(batch=8), stage="stage3", mode="single", reward_name="hybrid_single",
             data=NS(seed=0), resume=False, checkpoint=CheckpointSettings(), stage_dir=tmp_path)
    rt = NS(cfg=cfg, learner=lambda model, optim, reference=False: Learner(), release=lambda x: None,
            score=lambda trajs, tasks, reward: [NS(excluded=False, score=float(i), parts={"result": float(i)})
                                               for i in range(len(tasks))],
            rollout_group=lambda *a, **k: NS(rollout=rollout))
    monkeypatch.setattr(load_mod, "load_tokenizer", lambda model: (None, 0))
    monkeypatch.setattr(batch_mod, "rl_batch", lambda trajs, *a, **k: batches.append(trajs) or "B")
    _, history = train_grpo(rt, "m", [NS(task_id="t")], NS(log=lambda step, m: None))
    assert syncs == [choice]
    assert history[0]["stale_tokens"] == 1 and history[0]["stale_token_frac"] == 0.25
    assert batches[0][0].loss_mask == (0, 0, 1) and batches[0][1].loss_mask == (0, 1, 1)


def test_a_rollout_group_loads_weights_into_its_running_engine_under_the_policy():
    from actors.rollout import PolicySpec, RolloutConfig, RolloutGroup, RolloutWorker

    seen = []

    class Recording(ScriptedEngine):
        async def update_weights(self, weights, *, policy=UpdatePolicy.DRAIN):
            seen.append(policy)
            return await super().update_weights(weights, policy=policy)

    group = RolloutGroup(RolloutConfig(PolicySpec("tiny", backend="scripted"), in_process=True))
    try:
        (worker,) = group.workers.values()
        assert isinstance(worker, RolloutWorker)
        worker.backend = Recording(worker.policy.tokenizer)  # an AsyncEngine replaces the worker's engine
        group.update_weights(WEIGHTS, version=5, policy="continue")
        group.update_weights(WEIGHTS, version=7)
        assert seen == [UpdatePolicy.CONTINUE, UpdatePolicy.DRAIN]
        assert worker.version == 7 and worker.agent.version_map == {0: 0, 1: 5, 2: 7}
        with pytest.raises(ValueError, match="later"):
            group.update_weights(WEIGHTS, version=8, policy="later")
        with pytest.raises(ValueError, match="do not fit"):  # refused before the engine loads anything
            group.update_weights({"not.a.weight": torch.zeros(1)}, version=9)
        assert worker.version == 7
    finally:
        group.shutdown()
