"""The in-process pool (``DBPoolConfig(in_process=True)``, what jobs use without Ray) runs the same
TTL reaper as a shard actor: abandoned leases are reclaimed without any later call touching them,
and shutdown stops the reaper threads."""

from __future__ import annotations

import threading

from actors.db_pool import DBPoolConfig, DBPoolGroup
from sqlrl.db.leases.protocol import Catalog
from sqlrl.db.leases.shard import ShardConfig
from sqlrl.db.types import ErrorKind, SessionRequest

ABANDONED = 6
WAIT_S = 20.0  # bound on the wait; reclaiming takes ~ ttl + interval (0.5 s) when all is well


def test_abandoned_leases_are_reclaimed_and_shutdown_stops_the_reaper(demo_db_path) -> None:
    catalog = Catalog({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}})
    before = set(threading.enumerate())  # other tests' pools may run reapers of the same names
    group = DBPoolGroup(DBPoolConfig(
        rollout_workers=1, per_worker={"sqlite": 2}, in_process=True, reaper_interval_s=0.1,
        shard=ShardConfig(catalog=catalog, lease_ttl_s=0.4)))
    reclaimed = 0
    lock = threading.Lock()
    all_reclaimed = threading.Event()

    def on_metric(name: str, value: float) -> None:
        nonlocal reclaimed
        if name == "reclaimed":
            with lock:
                reclaimed += int(value)
                if reclaimed >= ABANDONED:
                    all_reclaimed.set()

    try:
        for shard in group.shards.values():
            shard.on_metric(on_metric)
        client = group.client(0)
        leases = [client.lease(SessionRequest("shop", key=f"traj-{i}")) for i in range(ABANDONED)]
        assert all(client.execute(lease, "SELECT COUNT(*) FROM products").ok for lease in leases)
        assert sum(s.active_leases for s in group.stats().values()) == ABANDONED
        # the callers "die": nothing touches these leases again until the reaper has run
        assert all_reclaimed.wait(WAIT_S), f"only {reclaimed} of {ABANDONED} leases reclaimed"
        stats = group.stats()
        assert sum(s.active_leases for s in stats.values()) == 0
        assert sum(s.reclaimed for s in stats.values()) == ABANDONED
        assert all(client.execute(lease, "SELECT 1").error.kind is ErrorKind.LEASE_EXPIRED
                   for lease in leases)
        reapers = {t for t in set(threading.enumerate()) - before if t.name.startswith("reaper-")}
        assert sorted(t.name for t in reapers) == sorted(f"reaper-{sid}" for sid in group.shards)
    finally:
        group.shutdown()
    assert not [t.name for t in reapers if t.is_alive()]
