"""The rollout SQL endpoint on sealed PostgreSQL and MariaDB bases: each rollout's session is its own
clone as its own role/user (a dropped view in one is still there in the other), server-side file
access is refused, the Judge grades on fresh clones, and every clone is dropped when its rollout
ends."""

from __future__ import annotations

import uuid

import pytest

from sqlrl.db.provisioning.scratch import SCRATCH
from sqlrl.policy.scripted import ScriptedEngine
from tests.conftest import scratch_names

from .conftest import GOLD, SCRIPT, gateway, shop_task

VIEW = "SELECT count(*) FROM delivered_orders"
FILE_READ = {"postgresql": "SELECT pg_read_file('/etc/passwd')", "mysql": "SELECT LOAD_FILE('/etc/passwd')"}


@pytest.fixture(scope="module", params=[pytest.param("postgresql", marks=pytest.mark.postgres),
                                        pytest.param("mysql", marks=pytest.mark.mysql)])
def server_shop(request, demo_db_path):
    """``(dialect, admin URL, catalog)`` of the shop database loaded on that server."""
    from sqlrl.db.provisioning import provision
    from sqlrl.db.provisioning.loader import load_sqlite

    admin = request.getfixturevalue("pg_admin_url" if request.param == "postgresql" else "mysql_admin_url")
    name = f"t_gw_{uuid.uuid4().hex[:8]}"
    report = load_sqlite(demo_db_path, admin, name, replace=True)
    yield request.param, admin, {"shop": {request.param: report.session_url}}
    provision.drop_database(admin, name)


@pytest.mark.slow
def test_rollout_sessions_on_servers_are_sealed_clones(tiny, server_shop):
    dialect, admin, catalog = server_shop
    before = scratch_names(admin)
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    with gateway(tiny, engine, catalog) as gw:
        gw.rollouts.offer("g", shop_task(dialect=dialect), 2)
        a, b = gw.claim(), gw.claim()
        assert a["task"]["dialect"] == dialect
        sql_a, sql_b = (f"/v1/rollouts/{c['rollout_id']}/sql" for c in (a, b))
        counted = gw.post(sql_a, {"sql": GOLD}).json()
        assert counted["observation"].endswith("\n60\n(1 row)") and not counted["is_error"]
        view = gw.post(sql_b, {"sql": VIEW}).json()["observation"]
        dropped = gw.post(sql_a, {"sql": "DROP VIEW delivered_orders"}).json()
        assert dropped["observation"].startswith("OK") and not dropped["is_error"], dropped
        gone = gw.post(sql_a, {"sql": VIEW}).json()
        assert gone["is_error"] and "delivered_orders" in gone["observation"]
        assert gw.post(sql_b, {"sql": VIEW}).json() == {"observation": view, "is_error": False}
        probe = gw.post(sql_b, {"sql": FILE_READ[dialect]}).json()
        assert "root:" not in probe["observation"]  # refused (PostgreSQL) or NULL (no FILE privilege)
        assert len(scratch_names(admin) - before) >= 2  # the two rollouts' clones
        for c in (a, b):
            assert gw.post(f"/v1/rollouts/{c['rollout_id']}/complete", {"sql": GOLD}).json()["reward"] == 1.0
        assert [t.status for t in gw.rollouts.drain()] == ["completed", "completed"]
        assert gw.pool.stats().in_use == 0 and gw.pool.stats().discards == 2  # server sessions are never reused
        # every clone dropped at the end (after the background drops; clones prepared ahead for the
        # next sessions are this process's own, not leftovers)
        assert SCRATCH.settle()
        assert scratch_names(admin) - before - SCRATCH.held_names() == set()
