"""Reward actors: parallel scoring with gold affinity, the pool's reward partition, and timeouts
or dead actors that never hang the group."""

from __future__ import annotations

import time

import pytest

from actors.db_pool import DBPoolConfig, DBPoolGroup
from actors.reward import RewardGroup, RewardGroupConfig, RewardRequest
from sqlrl.db import Limits
from sqlrl.db.leases.protocol import Catalog
from sqlrl.db.leases.shard import ShardConfig
from sqlrl.tasks.types import CriticTask, Text2SQLTask
from sqlrl.tools import ToolCall

LOOP = "def test_case(pred_sqls, sol_sqls, db_path, conn, conditions):\n    while True:\n        pass\n"


def batch() -> list[RewardRequest]:
    tasks = [Text2SQLTask(task_id=f"t{i}", db_id="shop", question="q?",
                          gold_sql=f"SELECT COUNT(*) FROM {table}")
             for i, table in enumerate(["customers", "orders", "products"])]
    out = []
    for task in tasks:
        for k in range(6):  # a GRPO group: 6 rollouts per task, half right
            sql = task.gold_sql if k % 2 == 0 else "SELECT COUNT(*) FROM order_items"
            out.append(RewardRequest("bird_ex_agentic", task, [ToolCall("submit_solution", {"sql": sql})]))
    return out


@pytest.fixture()
def catalog(demo_db_path):
    return {"shop": {"sqlite": f"sqlite:///{demo_db_path}"}}


def test_actors_score_like_in_process_and_run_each_gold_once(ray_session, catalog) -> None:
    requests = batch()
    local = RewardGroup(catalog, RewardGroupConfig(in_process=True)).score(requests)
    group = RewardGroup(catalog, RewardGroupConfig(n_actors=2))
    try:
        remote = group.score(requests)
        assert [b.score for b in remote] == [b.score for b in local] == [1.0, 0.0] * 9
        assert group.score(requests) == remote  # a second batch: all gold from the cache
        stats = group.stats(timeout_s=120)  # a bound on answering, only to stop a hang
        assert sum(s["gold_executions"] for s in stats) == 3  # once per task, not per rollout
        assert sum(s["gold_hits"] for s in stats) == 2 * len(requests) - 3
    finally:
        group.shutdown()


def test_sessions_come_from_the_pools_reward_partition(ray_session, catalog) -> None:
    pool = DBPoolGroup(DBPoolConfig(rollout_workers=1, per_worker={"sqlite": 1},
                                    shard=ShardConfig(catalog=Catalog(catalog))))
    group = RewardGroup(catalog, RewardGroupConfig(n_actors=2), pool_client=pool.client(role="reward"))
    try:
        scores = [b.score for b in group.score(batch())]
        assert scores == [1.0, 0.0] * 9
        stats = pool.stats()
        reward = stats["reward/sqlite/0"]
        assert reward.granted == 18 + 3 and reward.active_leases == 0  # 18 predictions + 3 golds
        assert stats["rollout/w0/sqlite/0"].granted == 0
        # a debugging task: its test case's sessions (sol once, then the prediction) are leased too
        fix = CriticTask(instance_id="fix", db_id="shop", query="q", issue_sql=["SELECT 1"],
                         sol_sql=["SELECT COUNT(*) FROM products"])
        out = group.score([RewardRequest("critic_agentic", fix, [
            ToolCall("submit_solution", {"sql": "SELECT COUNT(*) FROM products"})])])
        assert out[0].score == 1.0
        after = pool.stats()["reward/sqlite/0"]
        assert after.granted == reward.granted + 2 and after.active_leases == 0
    finally:
        group.shutdown()
        pool.shutdown()


def test_a_hung_actor_never_hangs_the_group(ray_session, catalog) -> None:
    hang = CriticTask(instance_id="loop", db_id="shop", query="q", issue_sql=["SELECT 1"],
                      sol_sql=["SELECT 1"], test_cases=[LOOP])
    group = RewardGroup(catalog, RewardGroupConfig(n_actors=1, critic_test_timeout_s=120))
    try:
        [hung] = group.wait_ready()  # start-up is never part of a batch's timeout
        assert hung is not None
        t0 = time.monotonic()
        out = group.score([RewardRequest("critic_agentic", hang,
                                         [ToolCall("submit_solution", {"sql": "SELECT 1"})])],
                          timeout_s=3)
        assert time.monotonic() - t0 < 60  # only a guard against hanging forever
        assert out[0].excluded and out[0].reason.startswith("reward-timeout") and out[0].score == 0.0
        assert group.incarnations() == [None]  # killed; its replacement has not answered yet
        # the next batch waits for the restarted incarnation (an event, not a clock): it is never
        # sent to the hung process, even though ray.kill has not necessarily landed yet
        again = group.score(batch()[:2])
        assert [b.score for b in again] == [1.0, 0.0], [b.reason for b in again]
        assert group.incarnations()[0] not in (None, hung)
    finally:
        group.shutdown()


def test_a_killed_incarnation_that_still_answers_is_never_used(ray_session, catalog) -> None:
    """The race behind the hung-actor guarantee, forced: ray.kill is asynchronous, so the killed
    process can still answer. Here it is marked killed but left running (the kill "never
    lands"): the group must not send it a batch, and reports the actor as not back instead."""
    group = RewardGroup(catalog, RewardGroupConfig(n_actors=1))
    try:
        [old] = group.wait_ready()
        assert old is not None
        group.actors.start_timeout_s = 2  # a short test
        group.actors._killed[0].add(old)  # what ActorGroup.restart records just before ray.kill
        group.actors._incarnation[0] = None
        assert group.wait_ready() == [None]  # it keeps answering, with the killed id
        out = group.score(batch()[:2])
        assert all(b.excluded and b.reason.startswith("reward-unavailable") for b in out)
        # the old process scored nothing
        assert group.stats(timeout_s=120)[0]["gold_executions"] == 0
    finally:
        group.shutdown()


def test_an_actor_that_cannot_start_is_reported_not_waited_for(ray_session, catalog) -> None:
    # RewardScorer.__init__ raises (the judge's cache size must be >= 1): Ray does not restart it
    group = RewardGroup(catalog, RewardGroupConfig(n_actors=1, gold_cache_size=0))
    try:
        out = group.score(batch()[:2])
        # excluded with the cause, not after waiting start_timeout_s for a restart that never comes
        why = "reward-unavailable: the reward actor cannot start"
        assert all(b.excluded and b.reason.startswith(why) for b in out), [b.reason for b in out]
        assert out[0].reason.endswith("ValueError: SolCache maxsize must be >= 1, got 0")
    finally:
        group.shutdown()


def test_a_dead_actor_is_restarted_and_scoring_goes_on(ray_session, catalog) -> None:
    group = RewardGroup(catalog, RewardGroupConfig(n_actors=2))
    try:
        ray_session.kill(group.actors[0], no_restart=False)
        out = group.score(batch())  # the share of the dead actor is resubmitted once it is back
        assert [b.score for b in out] == [1.0, 0.0] * 9 and not any(b.excluded for b in out)
    finally:
        group.shutdown()


def test_configuration_errors_raise_instead_of_scoring(ray_session, catalog) -> None:
    group = RewardGroup(catalog, RewardGroupConfig(n_actors=1))
    try:
        with pytest.raises(KeyError, match="unknown reward"):
            group.score([RewardRequest("no_such_reward", batch()[0].task, "x")])
        elsewhere = Text2SQLTask(task_id="x", db_id="not_in_catalog", question="q", gold_sql="SELECT 1")
        with pytest.raises(ValueError, match="not in the judge's catalog"):
            group.score([RewardRequest("bird_ex_single", elsewhere,
                                       "<thought>a</thought><solution>SELECT 1</solution>")])
    finally:
        group.shutdown()
