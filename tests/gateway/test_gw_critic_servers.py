"""Debugging (critic) tasks on sealed PostgreSQL and MariaDB clones: the rollout's clone has the
task's ``preprocess_sql`` scene, and the server's Judge scores the fix > 0 and the issue SQL 0 on
fresh clones of its own (with the scene and the clean-up run as BIRD-CRITIC runs them)."""

from __future__ import annotations

import pytest

from sqlrl.db.provisioning.scratch import SCRATCH
from sqlrl.policy.scripted import ScriptedEngine
from tests.conftest import scratch_names

from .conftest import gateway
from .test_gw_critic import FIX, ISSUE, critic_task
from .test_gw_sql_servers import server_shop  # noqa: F401  (the module-scoped fixture: shop on each server)


@pytest.mark.slow
def test_a_critic_rollout_on_a_server_clone_has_its_scene_and_is_judged(tiny, server_shop):  # noqa: F811
    import dataclasses

    dialect, admin, catalog = server_shop
    before = scratch_names(admin)
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=[])
    with gateway(tiny, engine, catalog) as gw:
        gw.rollouts.offer("g", dataclasses.replace(critic_task(), dialect=dialect), 2)
        fix, wrong = gw.claim(), gw.claim()
        assert (fix["task"]["kind"], fix["task"]["dialect"], fix["task"]["issue_sql"]) == ("critic", dialect, [ISSUE])
        seen = gw.post(f"/v1/rollouts/{fix['rollout_id']}/sql", {"sql": FIX}).json()
        assert seen["observation"].endswith("\n3\n(1 row)") and not seen["is_error"], seen  # preprocess_sql ran
        rewards = [gw.post(f"/v1/rollouts/{c['rollout_id']}/complete", {"sql": sql}).json()["reward"]
                   for c, sql in ((fix, FIX), (wrong, ISSUE))]
        assert rewards[0] > 0 and rewards[1] == 0.0
        assert gw.pool.stats().in_use == 0
    assert SCRATCH.settle()
    assert scratch_names(admin) - before - SCRATCH.held_names() == set()
