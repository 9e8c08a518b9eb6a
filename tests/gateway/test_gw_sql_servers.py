"""The rollout SQL endpoint on a sealed PostgreSQL base: each rollout's session is its own clone as
its own role (a DROP TABLE in one is invisible to another), server-side file access is refused,
the Judge grades on fresh clones, and every clone is dropped when its rollout ends."""

from __future__ import annotations

import uuid

import pytest

from sqlrl.db.scratch import SCRATCH
from sqlrl.policy.scripted import ScriptedEngine
from tests.conftest import scratch_names

from .conftest import GOLD, SCRIPT, gateway, shop_task

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def pg_shop(pg_admin_url, demo_db_path):
    from sqlrl.db import provision
    from sqlrl.db.loader import load_sqlite

    name = f"t_gw_{uuid.uuid4().hex[:8]}"
    report = load_sqlite(demo_db_path, pg_admin_url, name, replace=True)
    yield {"shop": {"postgresql": report.session_url}}
    provision.drop_database(pg_admin_url, name)


def test_rollout_sessions_on_postgresql_are_sealed_clones(tiny, pg_shop, pg_admin_url):
    before = scratch_names(pg_admin_url)
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    with gateway(tiny, engine, pg_shop) as gw:
        gw.rollouts.offer("g", shop_task(dialect="postgresql"), 2)
        a, b = gw.claim(), gw.claim()
        assert a["task"]["dialect"] == "postgresql"
        sql_a, sql_b = (f"/v1/rollouts/{c['rollout_id']}/sql" for c in (a, b))
        assert gw.post(sql_a, {"sql": GOLD}).json() == {"observation": "count\n60\n(1 row)", "is_error": False}
        dropped = gw.post(sql_a, {"sql": "DROP TABLE customers CASCADE"}).json()
        assert dropped == {"observation": "OK", "is_error": False}, dropped
        gone = gw.post(sql_a, {"sql": GOLD}).json()
        assert gone["is_error"] and "customers" in gone["observation"]
        assert gw.post(sql_b, {"sql": GOLD}).json()["observation"] == "count\n60\n(1 row)"
        denied = gw.post(sql_b, {"sql": "SELECT pg_read_file('/etc/passwd')"}).json()
        assert denied["is_error"] and denied["observation"].startswith("Error (")
        assert len(scratch_names(pg_admin_url) - before) >= 2  # the two rollouts' clones (and roles)
        for c in (a, b):
            assert gw.post(f"/v1/rollouts/{c['rollout_id']}/complete", {"sql": GOLD}).json()["reward"] == 1.0
        assert [t.status for t in gw.rollouts.drain()] == ["completed", "completed"]
        # every clone dropped at the end (after the background drops; ready clones prepared ahead
        # for the next sessions are this process's own, not leftovers)
        assert gw.pool.stats().in_use == 0 and gw.pool.stats().discards == 2  # server sessions are never reused
        assert SCRATCH.settle()
        assert scratch_names(pg_admin_url) - before - SCRATCH.held_names() == set()
