"""PartitionPlan: deterministic shard ownership, disjoint rollout partitions, a separate reward
partition, stable rebalancing, and clear errors."""

from __future__ import annotations

import pytest

from sqlrl.db.leases.protocol import LeaseError, LeaseErrorKind
from sqlrl.db.leases.partition import PartitionPlan


def test_every_rollout_worker_owns_its_own_shards_and_reward_shards_are_separate() -> None:
    plan = PartitionPlan.build(3, {"sqlite": 2, "postgresql+mysql": 1}, {"sqlite": 1})
    owned = {w: {s.id for s in plan.shards_for("rollout", w)} for w in range(3)}
    assert owned[0] == {"rollout/w0/sqlite/0", "rollout/w0/sqlite/1",
                        "rollout/w0/postgresql+mysql/0"}
    assert all(owned[a].isdisjoint(owned[b]) for a in owned for b in owned if a != b)
    reward = {s.id for s in plan.shards_for("reward")}
    assert reward == {"reward/sqlite/0"}
    assert set(plan.shard_ids()) == set().union(*owned.values(), reward)
    assert len(plan.shard_ids()) == len(set(plan.shard_ids())) == 10


def test_default_reward_partition_is_one_shard_per_group() -> None:
    plan = PartitionPlan.build(2, {"sqlite": 3, "postgresql": 1})
    assert {s.id for s in plan.shards_for("reward")} == {"reward/sqlite/0", "reward/postgresql/0"}


def test_pick_is_deterministic_stays_in_the_callers_partition_and_spreads_keys() -> None:
    plan = PartitionPlan.build(2, {"sqlite": 4, "postgresql+mysql": 1})
    picks = [plan.pick("rollout", 1, "sqlite", f"traj-{i}") for i in range(200)]
    assert picks == [plan.pick("rollout", 1, "sqlite", f"traj-{i}") for i in range(200)]
    assert all(p.startswith("rollout/w1/sqlite/") for p in picks)
    assert len(set(picks)) == 4  # every shard of the worker gets keys
    assert plan.pick("rollout", 0, "mysql", "k") == "rollout/w0/postgresql+mysql/0"
    assert plan.pick("reward", None, "postgresql", "k") == "reward/postgresql+mysql/0"


def test_pick_for_a_dialect_nobody_serves_is_a_typed_error() -> None:
    plan = PartitionPlan.build(1, {"sqlite": 1})
    with pytest.raises(LeaseError) as e:
        plan.pick("rollout", 0, "postgresql", "k")
    assert e.value.kind is LeaseErrorKind.BAD_REQUEST and "serves: sqlite" in e.value.message


def test_unknown_worker_role_and_dialect_are_refused() -> None:
    plan = PartitionPlan.build(2, {"sqlite": 1})
    with pytest.raises(ValueError, match="worker 5 is not in this plan"):
        plan.shards_for("rollout", 5)
    with pytest.raises(ValueError, match="unknown role"):
        plan.shards_for("learner", 0)
    with pytest.raises(ValueError, match="unknown dialect 'sqlit'"):
        PartitionPlan.build(1, {"sqlit": 1})
    with pytest.raises(ValueError, match="in two groups"):
        PartitionPlan.build(1, {"mysql": 1, "postgresql+mysql": 1})
    with pytest.raises(ValueError, match=">= 0"):
        PartitionPlan.build(1, {"sqlite": -1})
    with pytest.raises(ValueError, match=">= 0"):
        PartitionPlan.build(-1, {"sqlite": 1})


def test_growing_keeps_every_existing_shard_and_adds_only_the_new_workers() -> None:
    plan = PartitionPlan.build(2, {"sqlite": 2})
    change = plan.rebalance(4)
    assert set(change.kept) == set(plan.shard_ids())
    assert {s.worker for s in change.added} == {2, 3} and len(change.added) == 4
    assert change.removed == ()
    for w in (0, 1):  # routing of surviving workers is unchanged
        for i in range(50):
            assert change.plan.pick("rollout", w, "sqlite", str(i)) == plan.pick("rollout", w, "sqlite", str(i))


def test_shrinking_to_a_sparse_worker_set_retires_only_the_departed_workers_shards() -> None:
    plan = PartitionPlan.build(4, {"sqlite": 1, "postgresql": 1})
    change = plan.rebalance([0, 2, 3])  # worker 1 left; nobody is renumbered
    assert {s.id for s in change.removed} == {"rollout/w1/sqlite/0", "rollout/w1/postgresql/0"}
    assert change.added == ()
    assert change.plan.workers == (0, 2, 3)
    assert "reward/sqlite/0" in change.kept
    assert change.plan.pick("rollout", 3, "sqlite", "k") == "rollout/w3/sqlite/0"
