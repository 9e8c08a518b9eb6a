"""One session-opening protocol (``sqlrl.db.source``): LocalSessions and PoolSessions, and the
judge, the BIRD-CRITIC runner and the agent all opening their sessions through it."""

from __future__ import annotations

import pytest

from sqlrl.db import Limits, SessionPool
from sqlrl.db.source import LocalSessions, PoolSessions, SessionRequest, open_one
from sqlrl.eval.critic import run_critic
from sqlrl.rewards import Judge
from sqlrl.tasks.types import CriticTask, Text2SQLTask


class Recording(LocalSessions):
    """LocalSessions that records every request and every close."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[SessionRequest] = []
        self.closed = 0

    def open_many(self, requests):
        self.requests += list(requests)
        return super().open_many(requests)

    def close_many(self, sessions):
        self.closed += len(sessions)
        super().close_many(sessions)


@pytest.fixture
def url(demo_db_path):
    return f"sqlite:///{demo_db_path}"


def test_local_sessions_resolve_ids_and_urls_and_apply_preprocess(url):
    source = LocalSessions({"shop": {"sqlite": url}}, limits=Limits(max_rows=3))
    a, b = source.open_many([SessionRequest("shop", "sqlite", ("CREATE TABLE t(x)", "INSERT INTO t VALUES (7)")),
                             SessionRequest(url)])
    try:
        assert a.execute("SELECT x FROM t").rows == ((7,),)
        assert b.execute("SELECT x FROM t").error is not None  # its own fresh session
        assert b.execute("SELECT * FROM customers").truncated  # the source's default limits
    finally:
        source.close_many([a, b])
    assert source.url("shop") == url  # one dialect: no need to name it
    with pytest.raises(LookupError, match="unknown database 'nope'"):
        source.url("nope", "sqlite")
    with pytest.raises(LookupError, match="no postgresql copy"):
        source.url("shop", "postgresql")


def test_local_open_many_is_all_or_nothing(url):
    source = Recording({"shop": {"sqlite": url}})
    with pytest.raises(LookupError):
        source.open_many([SessionRequest("shop", "sqlite"), SessionRequest("missing", "sqlite")])
    assert source.closed == 1  # the one it had opened


def test_local_sessions_on_a_session_pool(url):
    with SessionPool() as pool:
        source = LocalSessions(pool=pool)
        with open_one(source, SessionRequest(url, limits=Limits(timeout_s=5))) as s:
            assert s.execute("SELECT 1").rows == ((1,),)
        assert pool.stats().leases == 1 and pool.stats().in_use == 0  # back in the pool


def test_open_one_closes_on_error(url):
    source = Recording()
    with pytest.raises(RuntimeError):
        with open_one(source, SessionRequest(url)):
            raise RuntimeError("boom")
    assert source.closed == 1


class FakeClient:
    """A DB-pool client's surface: leases are strings, results echo the SQL."""

    def __init__(self, refuse: str | None = None) -> None:
        self.calls: list[tuple] = []
        self.released: list[str] = []
        self.refuse = refuse

    def lease_many(self, requests):
        self.calls.append(("lease_many", tuple(requests)))
        if any(r.db == self.refuse for r in requests):
            raise RuntimeError("refused")
        return [f"lease:{r.db}:{r.key}" for r in requests]

    def execute(self, lease, sql):
        return f"{lease}/{sql}"

    def execute_many(self, calls):
        self.calls.append(("execute_many", tuple(calls)))
        return [f"{lease}/{sql}" for lease, sql in calls]

    def release_many(self, leases):
        self.released += list(leases)
        return [True] * len(leases)


def test_pool_sessions_pass_the_requests_on_unchanged_in_one_batch():
    client = FakeClient()
    slow = Limits(timeout_s=30)
    source = PoolSessions(client)
    requests = [SessionRequest("x", "sqlite", ("P",), key="k1"),
                SessionRequest("y", "sqlite", limits=slow, key="k2"),
                SessionRequest("z", "sqlite", key="k3")]
    a, b, c = source.open_many(requests)
    assert client.calls == [("lease_many", tuple(requests))]  # the same objects, mixed limits
    assert all(sent is made for sent, made in zip(client.calls[0][1], requests))
    assert a.execute("SELECT 1") == "lease:x:k1/SELECT 1"
    assert source.execute_many([(c, "q1"), (a, "q2")]) == ["lease:z:k3/q1", "lease:x:k1/q2"]
    source.close_many([a, b, c])
    assert client.released == ["lease:x:k1", "lease:y:k2", "lease:z:k3"]


def test_pool_sessions_over_a_real_client_are_all_or_nothing_with_mixed_limits(demo_db_path):
    from sqlrl.db.leases.client import LocalTransport, PoolClient
    from sqlrl.db.leases.partition import PartitionPlan
    from sqlrl.db.leases.protocol import Catalog, LeaseError, LeaseErrorKind
    from sqlrl.db.leases.shard import ShardConfig, ShardCore

    plan = PartitionPlan.build(1, {"sqlite": 2}, {"sqlite": 1})
    config = ShardConfig(catalog=Catalog({"shop": {"sqlite": f"sqlite:///{demo_db_path}"}}))
    cores = {s.id: ShardCore(s.id, config) for s in plan.shards()}
    client = PoolClient(plan, [s.id for s in plan.shards_for("rollout", 0)], "rollout", 0,
                        LocalTransport(cores))
    source = PoolSessions(client)
    try:
        fast = Limits(timeout_s=1)
        a, b = source.open_many([SessionRequest("shop", key="a"), SessionRequest("shop", limits=fast)])
        held = [h for core in cores.values() for h in core._held.values()]
        timeouts = sorted(h.session.limits.timeout_s for h in held)
        assert timeouts[0] == 1 < timeouts[1]  # each request's own limits (None: the default)
        assert {h.lease.worker_id for h in held} == {"rollout-0"}  # the client named the holder
        assert a.execute("SELECT 1").rows == ((1,),)
        source.close_many([a, b])
        with pytest.raises(LeaseError) as e:
            source.open_many([SessionRequest("shop", key="c"), SessionRequest("nope", key="d")])
        assert e.value.kind is LeaseErrorKind.UNKNOWN_DATABASE
        assert all(core.stats().active_leases == 0 for core in cores.values())
    finally:
        for core in cores.values():
            core.close()


def test_the_judge_runs_every_query_through_its_source(url):
    source = Recording()
    judge = Judge({"shop": {"sqlite": url}}, sessions=source)
    task = Text2SQLTask(task_id="t", db_id="shop", question="q", gold_sql="SELECT COUNT(*) FROM customers")
    assert judge.text2sql(task, "SELECT COUNT(*) FROM customers").bird_match
    assert [r.db for r in source.requests] == [url, url] and source.closed == 2  # gold, prediction
    assert all(r.limits == judge.limits for r in source.requests)


def test_the_critic_runner_and_the_judge_share_the_source(url):
    source = Recording()
    task = CriticTask(instance_id="c", db_id="shop", query="q", issue_sql=["SELECT 1"],
                      sol_sql=["SELECT COUNT(*) FROM customers"], preprocess_sql=["CREATE TABLE t(x)"])
    assert run_critic(task, ["SELECT COUNT(*) FROM customers"], url, sessions=source).solved
    assert len(source.requests) == 2 and source.closed == 2  # sol and prediction, each fresh
    assert all(r.preprocess_sql == ("CREATE TABLE t(x)",) for r in source.requests)
    judged = Recording()
    assert Judge({"shop": {"sqlite": url}}, sessions=judged).critic(task, "SELECT COUNT(*) FROM customers").solved
    assert len(judged.requests) == 2


def test_the_pools_reward_partition_serves_the_judge_and_the_agent_protocol(url):
    """``PoolSessions`` on the reward partition (what the stage jobs give the judge and the stage-2
    builder) over a real (in-process) DB pool: the same verdicts as local sessions, and the agent's
    batch calls."""
    from actors.db_pool import DBPoolConfig, DBPoolGroup
    from sqlrl.db.leases.protocol import Catalog
    from sqlrl.db.leases.shard import ShardConfig

    catalog = {"shop": {"sqlite": url}}
    group = DBPoolGroup(DBPoolConfig(rollout_workers=1, per_worker={"sqlite": 1}, in_process=True,
                                     shard=ShardConfig(catalog=Catalog(catalog))))
    try:
        source = PoolSessions(group.client(role="reward"))
        task = Text2SQLTask(task_id="t", db_id="shop", question="q", gold_sql="SELECT COUNT(*) FROM customers")
        for sql in ("SELECT COUNT(*) FROM customers", "SELECT 2"):
            assert Judge(catalog, sessions=source).text2sql(task, sql) == Judge(catalog).text2sql(task, sql)
        critic = CriticTask(instance_id="c", db_id="shop", query="q", issue_sql=["SELECT 1"],
                            sol_sql=["SELECT COUNT(*) FROM customers"])
        assert Judge(catalog, sessions=source).critic(critic, "SELECT COUNT(*) FROM customers").solved
        a, b = source.open_many([SessionRequest("shop", "sqlite", ("CREATE TABLE t(x)",), key="t1"),
                                 SessionRequest("shop", "sqlite", key="t2")])
        try:
            first, second = source.execute_many([(a, "SELECT COUNT(*) FROM t"), (b, "SELECT COUNT(*) FROM t")])
            assert first.rows == ((0,),) and second.error is not None  # preprocess ran on a only
        finally:
            source.close_many([a, b])
        stats = [s for s in group.stats().values() if s is not None]
        assert sum(s.granted for s in stats) >= 7 and all(s.active_leases == 0 for s in stats)  # released
    finally:
        group.shutdown()
