"""One training step from traces (sqlrl.gateway.train): group filtering, the batch, the metrics."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sqlrl.gateway.sequences import MISMATCH_CAUSES, SequenceConfig
from sqlrl.gateway.train import TraceTrainConfig, build_step
from sqlrl.gateway.trace import RolloutTrace
from sqlrl.learn.config import GRPOConfig

from .test_seq_sequences import SYS_B, call, multi_turn


def traced(rid, group, reward, *, status="completed", calls=None, parts=None):
    calls = multi_turn(rid) if calls is None else calls
    done = status == "completed"
    return RolloutTrace(rollout_id=rid, task_id=f"task-{group}", group_id=group, calls=tuple(calls), status=status,
                        reward=reward if done else None, reward_source="judge" if done else "none",
                        reward_parts=parts if parts is not None else ({"result": reward} if done else {}),
                        n_incomplete=0 if done else 1)


def step_traces():
    a0 = multi_turn("a1")[0]
    mismatch = call("a1", 1, SYS_B + [2, 99, 5], [70, 99])
    return [traced("a1", "A", 1.0, calls=[a0, mismatch]), traced("a2", "A", 0.0), traced("a3", "A", 0.0),
            traced("b1", "B", 1.0), traced("b2", "B", 1.0),  # equal rewards: no signal
            traced("c1", "C", 1.0), traced("c2", "C", 0.0, status="expired"),  # one left in the group
            traced("d1", "D", 0.0, status="failed")]


def test_a_step_keeps_the_groups_with_a_signal_and_reports_everything():
    build = build_step(step_traces(), TraceTrainConfig(SequenceConfig(turn_end_ids=(99,))), GRPOConfig(), pad_id=0)
    kept_rollouts = [build.rows.sequences[i].rollout_id for i in build.kept]
    assert kept_rollouts == ["a1", "a1", "a2", "a3"]  # B: equal rewards; C: one rollout left; D: dropped
    assert len(build.batch) == 4
    for row, i in enumerate(build.kept):  # each row carries its rollout's advantage on its trained tokens
        seq = build.rows.sequences[i]
        adv = build.rows.rollout_advantage[seq.rollout_id]
        assert torch.equal(build.batch.advantages[row, :len(seq.token_ids)],
                           torch.tensor(seq.loss_mask, dtype=torch.float32) * adv)
    m = build.metrics
    assert (m["rollouts"], m["completed"], m["expired"], m["failed"]) == (8, 6, 1, 1)
    assert m["reward_mean"] == pytest.approx(4 / 6) and m["pass_rate"] == pytest.approx(4 / 6)
    assert m["reward_result"] == pytest.approx(4 / 6)
    assert m["mismatches"] == 1 and m["mismatch_different_first_message"] == 1
    assert all(f"mismatch_{c}" in m for c in MISMATCH_CAUSES)
    assert m["calls"] == 2 + 3 * 7 and m["incomplete_calls"] == 2  # d1 has 3 calls too
    followers = 1 + 2 * 7  # every rollout is merged, the failed one too
    assert m["merged_share"] == pytest.approx((followers - 1) / followers)
    assert (m["groups_drawn"], m["groups_signal"], m["groups_trained"]) == (4, 1, 1)
    assert m["trained_on"] == 4 and m["trained_tokens"] == build.batch.n_tokens
    assert list(m)[:7] == ["rollouts", "completed", "expired", "failed", "setup_failed", "reward_mean", "pass_rate"]
    assert m["setup_failed"] == 0


def test_group_filters_follow_the_config_and_no_rows_gives_no_batch():
    traces = step_traces()
    keep_equal = build_step(traces, TraceTrainConfig(drop_equal_groups=False), GRPOConfig(), pad_id=0)
    assert {build_rollout.rollout_id for build_rollout in (keep_equal.rows.sequences[i] for i in keep_equal.kept)} \
        == {"a1", "a2", "a3", "b1", "b2"}
    singles = build_step(traces, TraceTrainConfig(min_group_size=1, drop_equal_groups=False), GRPOConfig(), pad_id=0)
    assert "c1" in {singles.rows.sequences[i].rollout_id for i in singles.kept}  # its raw reward (verl)
    zero = build_step(traces, TraceTrainConfig(SequenceConfig(unfinished="zero")), GRPOConfig(), pad_id=0)
    zero_kept = {zero.rows.sequences[i].rollout_id for i in zero.kept}
    assert {"c1", "c2"} <= zero_kept and "d1" not in zero_kept  # C has a signal now; D is a group of one
    none = build_step(traces[3:5], TraceTrainConfig(), GRPOConfig(), pad_id=0)
    assert none.batch is None and none.kept == () and none.metrics["groups_trained"] == 0
    assert none.metrics["sequences"] == 2 and none.metrics["trained_on"] == 0


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="min_group_size"):
        TraceTrainConfig(min_group_size=0)
    with pytest.raises(ValueError, match="sequences"):
        TraceTrainConfig(sequences={"train_tags": None})
    with pytest.raises(ValueError, match="drop_equal_groups"):
        dataclasses.replace(TraceTrainConfig(), drop_equal_groups="yes")
