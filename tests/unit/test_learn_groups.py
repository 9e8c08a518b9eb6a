"""GRPO group filtering (sqlrl.learn.groups): which scored rollouts enter an update."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from sqlrl.learn.groups import informative_rows, trainable_rows


def _row(stop="submitted", generated=5, excluded=False):
    return NS(stop_reason=stop, n_generated=generated), NS(excluded=excluded)


def _split(rows):
    return [t for t, _ in rows], [b for _, b in rows]


def test_rows_that_carry_no_signal_are_dropped_and_lone_survivors_with_them():
    rows = [_row(), _row(),                      # group a: both kept
            _row(), _row(stop="error"),          # group b: one left after the error -> none kept
            _row(excluded=True), _row(), _row(),  # group c: the excluded row goes, two remain
            _row(generated=0), _row(generated=0)]  # group d: nothing generated
    groups = ["a", "a", "b", "b", "c", "c", "c", "d", "d"]
    assert trainable_rows(*_split(rows), groups) == [0, 1, 5, 6]


def test_groups_are_told_apart_by_id_not_by_position():
    rows = [_row() for _ in range(4)]
    assert trainable_rows(*_split(rows), ["x", "y", "x", "z"]) == [0, 2]
    assert trainable_rows([], [], []) == []


def test_lengths_must_agree():
    trajs, breakdowns = _split([_row(), _row()])
    with pytest.raises(ValueError, match="same length"):
        trainable_rows(trajs, breakdowns, ["a"])


def test_informative_rows_keep_only_groups_whose_rewards_differ():
    groups = ["a", "a", "b", "b", "c", "c", "c"]
    scores = [1.0, 0.0, 0.5, 0.5, 0.0, 0.0, 1e-9]
    assert informative_rows(range(7), scores, groups) == [0, 1]  # b equal; c within tol
    assert informative_rows([0, 1, 4, 5, 6], [1, 0, 0, 0, 0, 0, 0.3], groups) == [0, 1, 4, 5, 6]
    assert informative_rows([0, 2, 3], scores, groups) == []  # a reduced to one row: no spread
    assert informative_rows([], scores, groups) == []


def test_sampling_rounds_must_be_a_positive_integer():
    from curriculum.config import RLSettings

    assert RLSettings(sampling_rounds=3).sampling_rounds == 3
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="sampling_rounds"):
            RLSettings(sampling_rounds=bad)


def test_the_loss_temperature_follows_the_sampling_temperature():
    """The learner's log-probs (logits / rl.loss.temperature) are compared with the rollout's, which
    were sampled at rl.temperature: one number, set once. Before, the long preset sampled at 0.7
    and scored at 1.0, so the PPO ratio started away from 1 and clipped the wrong tokens."""
    from curriculum.config import RLSettings, load_stage_config
    from curriculum.stages import STAGES
    from sqlrl.learn.config import GRPOConfig

    assert RLSettings(temperature=0.7).loss.temperature == 0.7
    assert RLSettings().loss.temperature == 1.0
    assert RLSettings(temperature=0.6, loss=GRPOConfig(temperature=0.6)).loss.temperature == 0.6
    with pytest.raises(ValueError, match=r"rl.loss.temperature \(0.5\) must equal rl.temperature \(0.7\)"):
        RLSettings(temperature=0.7, loss=GRPOConfig(temperature=0.5))
    cfg = load_stage_config(STAGES["stage4"].config_path(), ["stage=stage4", "rl.temperature=0.8"])
    assert cfg.rl.loss.temperature == 0.8
    with pytest.raises(ValueError, match="set rl.temperature only"):
        load_stage_config(STAGES["stage4"].config_path(), ["stage=stage4", "rl.loss.temperature=0.9"])


def test_probe_samples_is_off_or_at_least_two():
    from curriculum.config import RLSettings

    assert RLSettings().probe_samples == 0 and RLSettings(probe_samples=4).probe_samples == 4
    for bad in (1, -1, True, 2.0):
        with pytest.raises(ValueError, match="probe_samples"):
            RLSettings(probe_samples=bad)


def test_rl_seed_is_the_sampling_seed_and_defaults_to_data_seed():
    from curriculum.config import RLSettings, load_stage_config
    from curriculum.stages import STAGES
    from jobs.train import rl_seed

    base = load_stage_config(STAGES["stage3"].config_path(), ["stage=stage3", "data.seed=5"])
    assert base.rl.seed is None and rl_seed(base) == 5
    seeded = load_stage_config(STAGES["stage3"].config_path(), ["stage=stage3", "data.seed=5", "rl.seed=11"])
    assert rl_seed(seeded) == 11 and seeded.data == base.data  # the same tasks, other samples
    assert RLSettings(seed=0).seed == 0
    for bad in (1.5, "3", True):
        with pytest.raises(ValueError, match="rl.seed must be an integer"):
            RLSettings(seed=bad)


def _probe(results, tasks_per_step=2, samples=2):
    """sqlrl.rl.grpo.probe with a rollout that records its calls and a scorer that passes the
    rows ``results`` marks (per task id: one result per sample; None = excluded row)."""
    from sqlrl.rl.grpo import GRPOFns, GRPOPlan, probe

    seen = {k: iter(v) for k, v in results.items()}
    calls = []

    def score(trajs, tasks):  # a result r scores r; a pair (r, s) scores s (a shaped reward)
        out = []
        for t in tasks:
            r = next(seen[t.task_id])
            result, value = r if isinstance(r, tuple) else (r, r)
            out.append(NS(excluded=r is None, parts={"result": float(result or 0)}, score=float(value or 0)))
        return out

    plan = GRPOPlan(steps=1, tasks_per_step=tasks_per_step, group_size=2, probe_samples=samples)
    fns = GRPOFns(rollout=lambda batch: calls.append([t.task_id for t in batch]) or [NS()] * len(batch),
                  score=score, update=None, sync=None)
    tasks = [NS(task_id=k) for k in results]
    chosen = probe(plan, tasks, fns)
    return [t.task_id for t in chosen.tasks], chosen.metrics(), calls


def test_the_probe_keeps_the_tasks_the_model_sometimes_solves_in_order():
    chosen, info, calls = _probe({"never": [0, 0], "half": [1, 0], "always": [1, 1], "other": [0, 1],
                                  "broken": [None, None], "one-scored": [None, 1]})
    assert chosen == ["half", "other"]  # "one-scored" passed its one scored sample: not "sometimes"
    assert sum(calls, []) == [k for k in ("never", "half", "always", "other", "broken", "one-scored")
                              for _ in range(2)]  # every task probe_samples times
    assert len(calls) == 1  # every probe sample in one rollout call (the rollout side bounds concurrency)
    assert info["probe_informative"] == 2 and info["probe_all_fail"] == 1 and info["probe_all_pass"] == 2
    assert info["probe_used"] == 1 and info["probe_tasks"] == 6 and info["probe_pass_rate"] == 5 / 9


def test_the_probe_keeps_tasks_whose_rewards_differ_even_when_none_is_solved():
    # a shaped reward: "ran but wrong" (0.1) against "ran out of turns" (0) is a gradient too;
    # partial credit (a debugging task passing some test cases) likewise
    chosen, info, _ = _probe({"flat-fail": [(0, 0.1), (0, 0.1)], "shaped": [(0, 0.1), (0, 0.0)],
                              "partial": [(0, 0.5), (0, 0.0)], "half": [(1, 1.0), (0, 0.1)]})
    assert chosen == ["shaped", "partial", "half"]
    assert info["probe_informative"] == 3 and info["probe_all_fail"] == 3 and info["probe_pass_rate"] == 1 / 8


def test_too_few_informative_tasks_train_on_all():
    chosen, info, _ = _probe({"a": [0, 0], "b": [1, 0], "c": [1, 1]}, tasks_per_step=2)
    assert chosen == ["a", "b", "c"] and info["probe_used"] == 0 and info["probe_informative"] == 1



def test_the_grpo_loop_counts_the_groups_whose_rewards_differ(monkeypatch, tmp_path):
    """jobs.train.train_grpo with everything around the loop faked. One draw a step
    (rl.sampling_rounds=1): every group enters the update, and ``groups_signal`` counts the ones
    whose rewards differ (a flat step's update has zero advantages). Dynamic sampling
    (rl.sampling_rounds=2): only groups with unequal rewards enter, and a step with none makes no
    update."""
    import sqlrl.learn.batch as batch_mod
    import sqlrl.policy.load as load_mod
    from curriculum.config import CheckpointSettings, RLSettings, RolloutSettings
    from jobs.train import TRAINERS, train_grpo

    def run(sampling_rounds, scores):
        scores, steps, batches = iter(scores), [], []

        class Learner:
            version = 0

            def step(self, batch, kind, loss):
                steps.append(batch)
                return {"loss": 0.5, "step": len(steps)}

            def sync_to(self, rollout, policy="drain"):
                return len(steps), 0.0

        def traj(task):
            return NS(task_id=task.task_id, stop_reason="submitted", n_generated=3, turns=(NS(tool_ms=0.0),),
                      n_tool_calls=1, n_tool_errors=0, n_malformed=0, loss_mask=(1, 1, 1), versions=lambda: (0, 0, 0))

        def score(trajs, tasks, reward):
            return [NS(excluded=False, score=float(s), parts={"result": float(s)}) for s in (next(scores) for _ in tasks)]

        cfg = NS(rl=RLSettings(steps=2, tasks_per_step=2, group_size=2, sampling_rounds=sampling_rounds),
                 rollout=RolloutSettings(batch=8), stage="stage3", mode="single", reward_name="hybrid_single",
                 data=NS(seed=0), resume=False, checkpoint=CheckpointSettings(), stage_dir=tmp_path)
        rt = NS(cfg=cfg, learner=lambda model, optim, reference=False: Learner(), score=score,
                rollout_group=lambda *a, **k: NS(rollout=lambda tasks: [traj(t) for t in tasks]),
                release=lambda x: None)
        monkeypatch.setattr(load_mod, "load_tokenizer", lambda model: (None, 0))
        monkeypatch.setattr(batch_mod, "rl_batch",
                            lambda trajs, rewards, gids, *a, **k: batches.append([t.task_id for t in trajs]) or "B")
        _, history = train_grpo(rt, "m", [NS(task_id="a"), NS(task_id="b")], NS(log=lambda step, m: None))
        return history, batches

    # step 1: both groups flat (all 0); step 2: task "b" mixed, task "a" flat
    history, batches = run(1, [0, 0, 0, 0] + [0, 0, 1, 0])
    assert [h["groups_trained"] for h in history] == [2, 2] and [h["groups_signal"] for h in history] == [0, 1]
    assert batches == [["a", "a", "b", "b"]] * 2  # one draw: flat groups are in the update too
    assert TRAINERS["grpo"].signal(history)["text"] == \
        "samples' pass 0.00 -> 0.25, 1 of 4 groups with unequal rewards over 2 steps"
    # dynamic sampling: step 1 draws twice and finds nothing (no update); step 2's first draw has one
    # mixed group, its second draw another
    history, batches = run(2, [0] * 8 + [0, 0, 1, 0] + [1, 0, 1, 1])
    assert [h["groups_signal"] for h in history] == [h["groups_trained"] for h in history] == [0, 2]
    assert [h["sampling_draws"] for h in history] == [2, 2] and "learner_step" not in history[0]
    assert batches == [["b", "b", "a", "a"]]  # the mixed groups only: "b" of draw 1, "a" of draw 2
