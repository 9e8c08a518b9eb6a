"""sqlrl.rl: the Ray-free GRPO loop driven with fake rollout / score / update / sync functions (no
model, no subprocess): dynamic sampling redraws until enough groups have unequal rewards or the
rounds are spent, group filtering drops excluded rows and lone samples, the probe's selection
feeds the steps, results are frozen values whose ``row()`` is the metrics line, a loop resumed
from a ``LoopState`` makes the calls the uninterrupted one made; and the one definition of
success."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace as NS

import pytest

from sqlrl.rl.grpo import GRPOFns, GRPOPlan, LoopState, StepResult, grpo_steps, probe
from sqlrl.rl.outcome import grpo_signal, outcome, score_rollouts, solved


class Fake:
    """Records every call. ``rewards[task_id]`` is an iterator of rewards (one per sample, in call
    order); a reward of None is an excluded row; ``errors`` names tasks whose rollouts fail."""

    def __init__(self, rewards: dict, errors: frozenset = frozenset()) -> None:
        self.rewards = {k: iter(v) for k, v in rewards.items()}
        self.errors = errors
        self.rollouts: list[list[str]] = []
        self.updates: list[tuple[list[str], list[float], list[str]]] = []
        self.syncs = 0
        self.notes: list[tuple[int, str]] = []

    def rollout(self, tasks):
        self.rollouts.append([t.task_id for t in tasks])
        return [NS(task_id=t.task_id, stop_reason="error" if t.task_id in self.errors else "submitted",
                   n_generated=0 if t.task_id in self.errors else 3, turns=(NS(tool_ms=500.0),), n_tool_calls=1,
                   n_tool_errors=0, n_malformed=0) for t in tasks]

    def score(self, trajs, tasks):
        out = []
        for t in tasks:
            r = next(self.rewards[t.task_id])
            out.append(NS(excluded=r is None, score=float(r or 0.0), parts={"result": float(r or 0.0)}))
        return out

    def update(self, trajs, scores, gids):
        self.updates.append(([t.task_id for t in trajs], list(scores), list(gids)))
        return {"loss": 0.25, "step": len(self.updates)}

    def sync(self):
        self.syncs += 1
        return len(self.updates), 0.0

    def fns(self) -> GRPOFns:
        return GRPOFns(self.rollout, self.score, self.update, self.sync,
                       progress=lambda step, note: self.notes.append((step, note)))


TASKS = [NS(task_id=k) for k in "abcd"]


def _run(fake: Fake, **plan) -> list[StepResult]:
    return list(grpo_steps(GRPOPlan(**{"steps": 1, "tasks_per_step": 2, "group_size": 2, **plan}), TASKS, fake.fns()))


def test_one_draw_trains_every_trainable_group_and_counts_the_ones_with_a_signal():
    fake = Fake({"a": [0, 0], "b": [1, 0]})
    [r] = _run(fake)
    assert fake.rollouts == [["a", "a", "b", "b"]]
    assert fake.updates == [(["a", "a", "b", "b"], [0.0, 0.0, 1.0, 0.0], ["0/0/a", "0/0/a", "0/0/b", "0/0/b"])]
    assert (r.sampling_draws, r.groups_drawn, r.groups_trained, r.groups_signal) == (1, 2, 2, 1)
    assert r.update == {"loss": 0.25, "learner_step": 1} and r.policy_version == 1 and fake.syncs == 1


def test_dynamic_sampling_redraws_flat_groups_up_to_sampling_rounds():
    # draw 1 (a, b): both flat; draw 2 (c, d): c mixed; draw 3 (a, b): b mixed -> 2 groups, stop
    fake = Fake({"a": [0, 0, 1, 1], "b": [1, 1, 0, 1], "c": [1, 0], "d": [0, 0]})
    [r] = _run(fake, sampling_rounds=5)
    assert fake.rollouts == [["a", "a", "b", "b"], ["c", "c", "d", "d"], ["a", "a", "b", "b"]]
    assert r.sampling_draws == 3 and r.groups_drawn == 6 and r.groups_trained == r.groups_signal == 2
    [(rows, scores, gids)] = fake.updates
    assert gids == ["0/1/c", "0/1/c", "0/2/b", "0/2/b"] and scores == [1.0, 0.0, 0.0, 1.0]
    assert r.cursor == 6 and r.next_state == LoopState(1, 6)


def test_dynamic_sampling_stops_at_sampling_rounds_and_makes_no_update_without_a_signal():
    fake = Fake({k: [1] * 4 for k in "abcd"})
    [r] = _run(fake, sampling_rounds=2)
    assert len(fake.rollouts) == 2 and r.sampling_draws == 2 and r.groups_trained == 0
    assert fake.updates == [] and r.update == {} and fake.syncs == 1  # the weights are synced anyway
    assert "learner_step" not in r.row() and r.row()["trained_on"] == 0


def test_group_filtering_drops_excluded_rows_failed_rollouts_and_lone_samples():
    # a: one row excluded -> a lone sample, dropped whole; b: rollouts failed; c: both kept
    fake = Fake({"a": [None, 1], "b": [1, 0], "c": [1, 0]}, errors=frozenset({"b"}))
    plan = GRPOPlan(steps=1, tasks_per_step=3, group_size=2)
    [r] = list(grpo_steps(plan, TASKS[:3], fake.fns()))
    assert fake.updates[0][0] == ["c", "c"] and r.groups_trained == 1 and r.groups_drawn == 3
    assert r.rollout["excluded"] == 1 and r.rollout["trajectories"] == 6


def test_a_draw_is_one_rollout_call_and_reports_progress():
    fake = Fake({"a": [0, 1, 0], "b": [1, 0, 1]})
    [r] = _run(fake, group_size=3)
    assert fake.rollouts == [["a", "a", "a", "b", "b", "b"]]  # the rollout side bounds what runs at once
    assert (0, "step 1: rollout (draw 1), 6 trajectories") in fake.notes
    assert [n for _, n in fake.notes][-2:] == ["step 1: update", "step 1: weight sync"]
    assert r.time_tool_s == pytest.approx(6 * 0.5)


def test_results_are_frozen_and_the_row_is_the_metrics_line():
    fake = Fake({"a": [0, 1], "b": [1, 1]})
    [r] = _run(fake)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.step = 3  # type: ignore[misc]
    row = r.row()
    assert list(row)[:2] == ["reward_mean", "pass_rate"] and row["pass_rate"] == 0.75
    assert list(row)[-6:] == ["policy_version", "time_rollout_s", "time_reward_s", "time_update_s", "time_sync_s",
                              "time_tool_s"]
    assert row["groups_signal"] == 1 and row["learner_step"] == 1 and row["loss"] == 0.25
    assert grpo_signal([row]).text == "samples' pass 0.75, 1 of 2 groups with unequal rewards over 1 step"


def test_the_probe_selects_the_tasks_and_step_one_carries_its_counts():
    fake = Fake({"a": [0, 0, 1, 0, 0, 1], "b": [1, 0, 0, 1, 1, 0], "c": [0, 1, 1, 1, 0, 1], "d": [1, 1]})
    plan = GRPOPlan(steps=2, tasks_per_step=2, group_size=2, probe_samples=2)
    chosen = probe(plan, TASKS, fake.fns())
    assert [t.task_id for t in chosen.tasks] == ["b", "c"] and chosen.used and chosen.all_fail == 1
    results = list(grpo_steps(plan, chosen.tasks, fake.fns(), probe=chosen))
    assert fake.rollouts[1:] == [["b", "b", "c", "c"]] * 2  # only the chosen tasks are drawn
    assert results[0].row()["probe_informative"] == 2 and "probe_informative" not in results[1].row()
    with pytest.raises(ValueError, match="probe_samples"):
        probe(GRPOPlan(steps=1, tasks_per_step=1, group_size=2), TASKS, fake.fns())


def test_a_resumed_loop_makes_the_calls_the_uninterrupted_one_made():
    rewards = {"a": [0, 1] * 4, "b": [1, 1, 0, 1] * 2, "c": [1, 1] * 4, "d": [0, 0, 1, 0] * 2}
    plan = GRPOPlan(steps=4, tasks_per_step=2, group_size=2, sampling_rounds=2)
    whole = Fake(rewards)
    full = list(grpo_steps(plan, TASKS, whole.fns()))
    first = Fake(rewards)
    head = []
    for r in grpo_steps(plan, TASKS, first.fns()):
        head.append(r)
        if r.step == 1:
            break  # killed after step 2's result was saved
    consumed = {k: sum(ids.count(k) for ids in first.rollouts) for k in rewards}
    rest = Fake({k: list(v)[consumed[k]:] for k, v in rewards.items()})
    tail = list(grpo_steps(plan, TASKS, rest.fns(), start=head[-1].next_state))
    assert [r.step for r in tail] == [2, 3]
    assert first.rollouts + rest.rollouts == whole.rollouts
    assert [u[2] for u in first.updates + rest.updates] == [u[2] for u in whole.updates]
    strip = lambda r: {k: v for k, v in r.row().items() if not k.startswith("time_") and k not in ("policy_version",
                                                                                                   "learner_step")}
    assert [strip(r) for r in head + tail] == [strip(r) for r in full]


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="group_size"):
        GRPOPlan(steps=1, tasks_per_step=1, group_size=1)
    with pytest.raises(ValueError, match="sampling_rounds"):
        GRPOPlan(steps=1, tasks_per_step=1, group_size=2, sampling_rounds=0)
    with pytest.raises(ValueError, match="at least one task"):
        list(grpo_steps(GRPOPlan(steps=1, tasks_per_step=1, group_size=2), [], Fake({}).fns()))


def test_success_is_defined_once():
    assert solved(NS(parts={"result": 1.0})) and not solved(NS(parts={"result": 0.99})) and not solved(NS(parts={}))
    assert outcome(NS(parts={"result": 1.0}, excluded=False)) == 1
    assert outcome(NS(parts={"result": 1.0}, excluded=True)) is None


def test_a_failed_rollout_is_excluded_not_scored_and_the_rest_are_scored_in_one_call():
    calls = []

    def score(asked):
        calls.append(asked)
        return [NS(excluded=False, score=1.0, parts={"result": 1.0}) for _ in asked]

    trajs = [NS(stop_reason="submitted", response=lambda: "r0"), NS(stop_reason="error", error="shard lost"),
             NS(stop_reason="max_turns", response=lambda: "r2")]
    tasks = [NS(task_id=k) for k in "abc"]
    out = score_rollouts(trajs, tasks, "hybrid_agentic", score)
    assert calls == [[(tasks[0], "r0"), (tasks[2], "r2")]]  # one call, the failed rollout left out
    assert [outcome(b) for b in out] == [1, None, 1]
    assert out[1].reason == "rollout-error: shard lost" and out[1].score == 0.0
    assert set(out[1].parts) >= {"format", "result", "is_critic"}  # the reward's own parts, all 0
    assert score_rollouts([trajs[1]], tasks[:1], "hybrid_single", score) and len(calls) == 1  # nothing to score
    with pytest.raises(ValueError, match="2 breakdowns for 1 rollouts"):
        score_rollouts(trajs[:1], tasks[:1], "hybrid_single", lambda asked: [None, None])
