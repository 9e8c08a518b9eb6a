"""Chaos: a few hundred simulated trajectories on SQLite, PostgreSQL and MariaDB through the sharded
pool while shard actors are killed (and restarted by Ray) and rollout workers die holding leases.

Checks, after the storm: every trajectory of a surviving worker ended with results or a typed error
(nothing hung, nothing raised untyped); live leases and sessions return to 0; after shutdown no
scratch database is left on either server (the clones of killed shard processes are swept as
orphans); the base databases are unchanged.
``SQLRL_CHAOS_ROUNDS=N`` repeats the storm N times (default 1).
"""

from __future__ import annotations

import hashlib
import os
import random
import time
import uuid

import pytest

from actors.db_pool import DBPoolConfig, DBPoolGroup
from sqlrl.db import ErrorKind, open_session
from sqlrl.db.provisioning import provision
from sqlrl.db.leases.protocol import Catalog, LeaseErrorKind
from sqlrl.db.provisioning.loader import load_sqlite
from sqlrl.db.sessions.pool import PoolConfig
from sqlrl.db.leases.shard import ShardConfig
from sqlrl.db.types import Limits, SessionRequest

pytestmark = [pytest.mark.postgres, pytest.mark.mysql]

TTL_S = 2.0
CHECKSUM_SQL = ("SELECT (SELECT COUNT(*) FROM customers), (SELECT COUNT(*) FROM products), "
                "(SELECT SUM(price) FROM products), (SELECT COUNT(*) FROM orders), "
                "(SELECT COUNT(*) FROM order_items)")
STATEMENTS = [
    "SELECT COUNT(*) FROM orders",
    "SELECT name, price FROM products ORDER BY price DESC LIMIT 3",
    "SELECT c.name, COUNT(*) FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.name",
    "UPDATE products SET price = price * 2",
    "DELETE FROM order_items",
    "INSERT INTO customers (id, name, city) VALUES (9999, 'chaos', 'x')",
    "CREATE TABLE scratch_t (x INT)",
    "DROP TABLE orders",
    "SELEC broken syntax",
    "SELECT no_such_column FROM products",
    "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT COUNT(*) FROM c",
]


@pytest.fixture(scope="module")
def databases(ray_session, demo_db_path, pg_admin_url, mysql_admin_url):
    name = f"sqlrl_chaos_{uuid.uuid4().hex[:8]}"
    reports = [load_sqlite(demo_db_path, url, name, replace=True)
               for url in (pg_admin_url, mysql_admin_url)]
    catalog = Catalog({"shop": {"sqlite": f"sqlite:///{demo_db_path}",
                                **{r.dialect: r.session_url for r in reports}}})
    yield catalog, name
    for url in (pg_admin_url, mysql_admin_url):
        provision.drop_database(url, name)


@pytest.fixture(scope="module")
def worker_cls(ray_session):
    @ray_session.remote(num_cpus=0.25, max_concurrency=16)
    class SimulatedRolloutWorker:
        """Runs trajectories on its own pool client, 8 at a time, like a rollout worker."""

        def __init__(self, client, statements: list[str]) -> None:
            self.client = client
            self.statements = statements

        def ready(self) -> bool:
            return True

        def run(self, n: int, seed: int) -> list[tuple[str, list[str]]]:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(8) as pool:
                return list(pool.map(self.trajectory, [(seed, i) for i in range(n)]))

        def trajectory(self, key: tuple[int, int]) -> tuple[str, list[str]]:
            """-> (how the lease went, the error kind or "ok" of every call)."""
            import random
            import time
            from sqlrl.db.leases.protocol import LeaseError
            from sqlrl.db.types import QueryResult

            rng = random.Random(hash(key))
            dialect = rng.choice(["sqlite", "sqlite", "postgresql", "mysql"])
            try:
                lease = self.client.lease(SessionRequest(
                    "shop", dialect, key=f"traj-{key}",
                    preprocess_sql=("CREATE TEMPORARY TABLE notes (x INT)",)))
            except LeaseError as exc:
                return f"lease-error:{exc.kind.value}", []
            calls = []
            for _ in range(rng.randint(3, 6)):
                time.sleep(rng.uniform(0.03, 0.12))  # the policy "thinking"
                sql = rng.choice(self.statements)
                result = self.client.execute(lease, sql)
                if not isinstance(result, QueryResult):
                    calls.append(f"untyped:{type(result).__name__}")
                else:
                    calls.append("ok" if result.ok else result.error.kind.value)

            if rng.random() < 0.9:  # one in ten trajectories "forgets" to release: the TTL reclaims it
                self.client.release(lease)
            return "leased", calls

    return SimulatedRolloutWorker


def checksums(catalog: Catalog) -> dict[str, object]:
    out = {}
    for dialect, url in catalog.urls["shop"].items():
        with open_session(url) as s:
            result = s.execute(CHECKSUM_SQL)
            assert result.ok, result.error
            out[dialect] = result.rows
    path = catalog.urls["shop"]["sqlite"].removeprefix("sqlite:///")
    out["sqlite-file"] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def server_leftovers(pg_admin_url: str, mysql_admin_url: str) -> tuple[int, int]:
    """(PostgreSQL, MariaDB) scratch databases not owned by this process, after a sweep: the
    clones of killed shard processes are orphans (their liveness locks died with them) and a sweep
    drops them; every other clone was dropped when its session closed."""
    import psycopg2
    import pymysql
    from sqlrl.db.provisioning.scratch import SCRATCH
    from sqlrl.db.url import parse_url

    SCRATCH.settle()
    counts = []
    for url in (pg_admin_url, mysql_admin_url):
        SCRATCH.sweep(url)
        u = parse_url(url)
        if u.get_backend_name() == "postgresql":
            conn = psycopg2.connect(host=u.host, port=u.port, user=u.username, dbname=u.database)
            sql = "SELECT datname FROM pg_database WHERE datname LIKE 'sqlrl\\_s\\_%'"
        else:
            conn = pymysql.connect(host=u.host, port=u.port, user=u.username, password=u.password,
                                   ssl_disabled=True)
            sql = "SHOW DATABASES LIKE 'sqlrl\\_s\\_%'"
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                counts.append(len({r[0] for r in cur.fetchall()} - SCRATCH.held_names()))
        finally:
            conn.close()
    return counts[0], counts[1]


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value is True or (not isinstance(value, bool) and value):
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {value})")


@pytest.mark.parametrize("round_", range(int(os.environ.get("SQLRL_CHAOS_ROUNDS", "1"))))
def test_pool_survives_shard_kills_and_worker_deaths(ray_session, databases, worker_cls,
                                                     pg_admin_url, mysql_admin_url, round_) -> None:
    catalog, name = databases
    before = checksums(catalog)
    group = DBPoolGroup(DBPoolConfig(
        rollout_workers=3, per_worker={"sqlite": 1, "postgresql+mysql": 1}, reward={},
        shard=ShardConfig(catalog=catalog, lease_ttl_s=TTL_S, max_leases=32,
                          pool=PoolConfig(max_size=16, limits=Limits(timeout_s=1.0))),
        reaper_interval_s=0.25, call_timeout_s=60))  # also bounds start-up (twice it)
    rng = random.Random(1000 + round_)
    per_worker = 80
    try:
        workers = {w: worker_cls.remote(group.client(w), STATEMENTS) for w in range(3)}
        ray_session.get([w.ready.remote() for w in workers.values()], timeout=180)  # an error, not a hang
        runs = {w: workers[w].run.remote(per_worker, seed=w) for w in workers}
        # The storm: shard kills (Ray restarts them) and one rollout worker dying mid-run,
        # replaced by a new one for the same index, as a rollout group would.
        kills = 0
        victim = rng.randrange(3)
        for step in range(6):
            time.sleep(rng.uniform(1.0, 2.0))  # spread over the first ~9 s of a ~20 s run
            if step == 2:
                ray_session.kill(workers[victim], no_restart=True)
                workers[victim] = worker_cls.remote(group.client(victim), STATEMENTS)
                runs[f"{victim}-replacement"] = workers[victim].run.remote(40, seed=100 + victim)
            else:
                shard = rng.choice(sorted(group.shards))
                ray_session.kill(group.shards[shard], no_restart=False)
                kills += 1

        busy = ray_session.wait(list(runs.values()), num_returns=len(runs), timeout=0)[1]
        assert len(busy) >= 3, "the storm must land while the workers are still running"
        outcomes, died = [], []
        for key, ref in runs.items():
            try:
                outcomes += ray_session.get(ref, timeout=180)
            except ray_session.exceptions.RayActorError:
                died.append(key)
        assert died == [victim], f"only the killed worker's run may be lost, lost: {died}"
        expected = per_worker * 2 + 40
        assert len(outcomes) == expected  # every trajectory of a live worker ended
        typed = {"ok", *(k.value for k in ErrorKind)}
        lease_kinds = {f"lease-error:{k.value}" for k in LeaseErrorKind}
        for how, calls in outcomes:
            assert how == "leased" or how in lease_kinds, how
            assert set(calls) <= typed, calls
        leased = [calls for how, calls in outcomes if how == "leased"]
        assert len(leased) > expected * 0.7  # the storm did not stop the pool from working
        # The kills really hit trajectories: calls in flight or on old leases came back typed.
        assert any("session-lost" in calls for calls in leased)
        assert kills == 5

        # Live leases and sessions go back to zero: released, reclaimed by the TTL (dead worker,
        # forgotten releases), or gone with a killed shard.
        def idle() -> bool:
            stats = group.stats().values()
            return all(s is not None and s.active_leases == 0 and s.pool.in_use == 0 for s in stats)
        wait_for(idle, TTL_S + 60, "every shard to hold no lease and no session in use")
        assert sum(s.reclaimed for s in group.stats().values()) > 0
    finally:
        group.shutdown()
    wait_for(lambda: server_leftovers(pg_admin_url, mysql_admin_url) == (0, 0), 60,
             "no scratch database left on PostgreSQL or MariaDB (orphans of killed shards swept)")
    assert checksums(catalog) == before
