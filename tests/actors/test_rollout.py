"""Rollout workers: the tiny model through the agent loop on leased sessions, in-process and as Ray
actors; sessions always released; weight updates and versions; failures give typed trajectories."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the policy stack (transformers) is not installed")

from actors.db_pool import DBPoolConfig, DBPoolGroup  # noqa: E402
from actors.rollout import PolicySpec, RolloutConfig, RolloutGroup, RolloutWorker  # noqa: E402
from sqlrl.agent.loop import LoopConfig  # noqa: E402
from sqlrl.db.leases.protocol import Catalog  # noqa: E402
from sqlrl.db.leases.shard import ShardConfig  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402
from sqlrl.tasks.schema import DatabaseSchema  # noqa: E402
from sqlrl.tasks.types import CriticTask, Text2SQLTask  # noqa: E402

LOOP = LoopConfig(max_turns=2, max_total_tokens=4096,
                  sampling=SamplingParams(max_new_tokens=24, temperature=1.0, seed=0))


def tasks(n: int = 3):
    out = [Text2SQLTask(task_id=f"t{i}", db_id="shop", question=f"How many customers? ({i})",
                        gold_sql="SELECT COUNT(*) FROM customers") for i in range(n)]
    out.append(CriticTask(instance_id="c0", db_id="shop", query="my query fails",
                          issue_sql=["SELECT COUNT(*) FROM customer"], sol_sql=["SELECT COUNT(*) FROM customers"],
                          preprocess_sql=["CREATE TEMP TABLE scratch(x)"]))
    return out


@pytest.fixture()
def pool(demo_db_path, request):
    in_process = request.param if hasattr(request, "param") else True
    catalog = Catalog({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}})
    g = DBPoolGroup(DBPoolConfig(rollout_workers=2, per_worker={"sqlite": 1}, reward={},
                                 in_process=in_process, shard=ShardConfig(catalog=catalog)))
    yield g
    g.shutdown()


@pytest.fixture(scope="module")
def schemas(demo_db_path):
    return {"shop": DatabaseSchema.from_sqlite(demo_db_path)}


def check(trajectories, expected_ids) -> None:
    assert [t.task_id for t in trajectories] == expected_ids
    for t in trajectories:
        assert t.stop_reason in ("submitted", "max_turns", "token_budget"), (t.stop_reason, t.error)
        assert t.n_generated > 0 and len(t.token_ids) == len(t.loss_mask) == len(t.old_logprobs)


def test_in_process_rollout_releases_every_session(pool, schemas) -> None:
    group = RolloutGroup(RolloutConfig(PolicySpec("tiny"), loop=LOOP, in_process=True), pool, schemas)
    batch = tasks()
    out = group.rollout(batch)
    check(out, [t.task_id for t in batch])
    stats = pool.stats()["rollout/w0/sqlite/0"]
    assert stats.granted == len(batch) and stats.active_leases == 0


def test_weights_update_changes_the_version_and_the_policy(pool, schemas) -> None:
    worker = RolloutWorker(0, RolloutConfig(PolicySpec("tiny"), loop=LOOP), pool.client(0), schemas)
    before = worker.rollout(tasks(1))[0]
    state = {k: v * 0 for k, v in worker.policy.model.state_dict().items()}
    assert worker.update_weights(state, version=3) == 3
    after = worker.rollout(tasks(1))[0]
    assert (before.policy_version, after.policy_version) == (0, 3)
    assert after.token_ids != before.token_ids  # zeroed weights: uniform logits, other samples
    with pytest.raises(ValueError, match="do not fit"):
        worker.update_weights({"not.a.weight": state[next(iter(state))]}, version=4)


def test_a_refused_lease_gives_error_trajectories_not_an_exception(pool, schemas) -> None:
    worker = RolloutWorker(0, RolloutConfig(PolicySpec("tiny"), loop=LOOP), pool.client(0), schemas)
    elsewhere = Text2SQLTask(task_id="x", db_id="not_in_catalog", question="q", gold_sql="SELECT 1")
    out = worker.rollout([elsewhere, *tasks(1)])
    assert out[0].stop_reason == "error"  # a lease per trajectory: only the refused one fails
    assert "could not open sessions" in out[0].error and "not_in_catalog" in out[0].error
    assert all(t.stop_reason != "error" for t in out[1:])
    assert pool.stats()["rollout/w0/sqlite/0"].active_leases == 0


def test_single_turn_mode_needs_no_sessions(schemas) -> None:
    single = LoopConfig(mode="single", max_total_tokens=4096, sampling=SamplingParams(max_new_tokens=16, seed=1))
    group = RolloutGroup(RolloutConfig(PolicySpec("tiny"), loop=single, in_process=True), None, schemas)
    out = group.rollout(tasks(2))
    assert [t.stop_reason for t in out] == ["single_turn"] * 3


@pytest.mark.parametrize("pool", [False], indirect=True)
def test_ray_workers_roll_out_on_their_own_partitions(ray_session, pool, schemas) -> None:
    group = RolloutGroup(RolloutConfig(PolicySpec("tiny"), loop=LOOP, n_workers=2, num_cpus=0.5), pool, schemas)
    try:
        batch = tasks(3)
        out = group.rollout(batch)
        check(out, [t.task_id for t in batch])
        stats = pool.stats()
        assert stats["rollout/w0/sqlite/0"].granted == 2 and stats["rollout/w1/sqlite/0"].granted == 2
        assert all(s.active_leases == 0 for s in stats.values())
        from sqlrl.policy.load import load_policy

        group.update_weights(load_policy("tiny").model.state_dict(), version=7)  # via the object store
        assert {t.policy_version for t in group.rollout(batch[:2])} == {7}
        slow = RolloutGroup(RolloutConfig(PolicySpec("tiny"), loop=LOOP, n_workers=1, num_cpus=0.5,
                                          timeout_s=0.01), pool, schemas)
        try:
            late = slow.rollout(batch[:1])
            assert late[0].stop_reason == "error" and "did not answer" in late[0].error
        finally:
            slow.shutdown()
    finally:
        group.shutdown()
