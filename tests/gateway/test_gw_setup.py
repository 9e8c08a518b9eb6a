"""A task whose setup SQL fails (a critic task's ``preprocess_sql``, the kind's ``scene_sql``) through
the gateway: the claim does not answer 503 (which a client retried forever) but drops the task --
the rollout being claimed and every waiting rollout of that task end ``failed`` with
``FailReason.SETUP`` and the failing statement, counted in ``failed`` / ``setup_failed``,
journalled -- and hands the client the next task (or 204 / 410). A session that breaks during the
setup is still a 503 with the task waiting. Training leaves such rollouts out of their groups and the
job does not redraw them. Real HTTP on loopback with the official client; events, not time."""

from __future__ import annotations

import json

import pytest

from sqlrl.db.source import LocalSessions
from sqlrl.db.types import ErrorKind, QueryResult
from sqlrl.gateway.rollouts import GatewayConfig, NoWorkNow, Rollouts, Unavailable, WorkFinished
from sqlrl.gateway.trace import FailReason, RolloutTrace
from sqlrl.policy.scripted import ScriptedEngine
from sqlrl.tasks.types import CriticTask
from sqlrl.tools import tool_schemas

from .conftest import GOLD, KEY, OTHER, SCRIPT, gateway, shop_task
from .test_gw_critic import FIX, ISSUE, PROBLEM, critic_task
from .test_gw_rollouts import FixedScorer

BROKEN_SCENE = ("CREATE TABLE vip (customer_id INTEGER PRIMARY KEY)", "INSERT INTO vipp VALUES (1)")  # a typo


def broken_task(task_id: str = "c-broken") -> CriticTask:
    return CriticTask(task_id, "shop", PROBLEM, issue_sql=(ISSUE,), sol_sql=(FIX,), preprocess_sql=BROKEN_SCENE,
                      clean_up_sql=("DROP TABLE vip",), conditions={"order": False})


class Counting:
    """A ``SessionSource`` that counts the sessions opened through it (the attempts to set a task up)."""

    def __init__(self, inner) -> None:
        self.inner, self.opened = inner, []

    def open_many(self, requests):
        self.opened += [r.db for r in requests]
        return self.inner.open_many(requests)

    def close_many(self, sessions):
        self.inner.close_many(sessions)


@pytest.fixture
def gw(tiny, shop_catalog):
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    with gateway(tiny, engine, shop_catalog, window=4096) as g:
        g.extra["sessions"] = g.rollouts.sessions = Counting(g.rollouts.sessions)
        yield g


def test_a_task_whose_setup_sql_fails_is_dropped_and_the_client_gets_the_next_one(gw):
    gw.rollouts.offer("g1", broken_task(), 3)
    gw.rollouts.offer("g2", broken_task(), 1)  # the same task in another group: dropped with it
    gw.rollouts.offer("g3", shop_task(), 1)
    r = gw.post("/v1/rollouts")
    assert r.status_code == 200, r.text  # not 503: the client gets the next task
    claim = r.json()
    assert claim["task"]["task_id"] == "t1" and claim["task"]["kind"] == "text2sql"
    assert gw.extra["sessions"].opened == ["shop", "shop"]  # one attempt at the broken task, not one per rollout
    s = gw.rollouts.stats()
    assert (s.failed, s.setup_failed, s.claimed, s.waiting, s.active) == (4, 4, 1, 0, 1)
    assert gw.pool.stats().in_use == 1  # the broken task's session was closed

    # the client's rollout works as any other: a chat call with the official client, then complete
    reply = gw.client(claim["base_url"]).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "How many customers are there?"}],
        tools=tool_schemas(["execute_sql"]))
    assert reply.choices[0].message.tool_calls
    done = gw.post(claim["complete_url"][len(gw.url):], {"sql": GOLD})
    assert done.status_code == 200 and done.json()["reward"] > 0

    traces = gw.rollouts.drain()
    failed = [t for t in traces if t.status == "failed"]
    assert sorted(t.group_id for t in failed) == ["g1", "g1", "g1", "g2"]
    for t in failed:
        assert t.failure is FailReason.SETUP and t.setup_failed and t.task_id == "c-broken"
        assert t.calls == () and t.reward is None and t.n_incomplete == 0
        assert "statement 2 of 2" in t.error and "runtime error" in t.error and "vipp" in t.error
    # nobody owns a dropped rollout: its id is unknown to every key
    for key in (KEY, OTHER):
        lost = gw.post(f"/v1/rollouts/{failed[0].rollout_id}/sql", {"sql": "SELECT 1"}, key=key)
        assert lost.status_code == 404 and lost.json()["error"]["code"] == "rollout_not_found"
    # nothing waits: 204, then 410 once the job is done -- never a 503 to retry
    r = gw.post("/v1/rollouts")
    assert r.status_code == 204 and r.headers["retry-after"]
    gw.rollouts.finish()
    assert gw.post("/v1/rollouts").status_code == 410
    assert gw.pool.stats().in_use == 0 and gw.rollouts.idle()


def test_a_broken_task_alone_ends_the_wait_and_is_tried_once_per_offer(gw):
    gw.rollouts.offer("s0/g0", broken_task(), 2)
    r = gw.post("/v1/rollouts")
    assert r.status_code == 204  # dropped; nothing else waits
    assert gw.rollouts.wait_idle(timeout=60)  # the job's step wait ends: every offered rollout has ended
    assert [t.failure for t in gw.rollouts.drain()] == [FailReason.SETUP] * 2
    gw.rollouts.offer("s1/g0", broken_task(), 2)  # offered again (a later step): tried again, once
    assert gw.post("/v1/rollouts").status_code == 204
    assert gw.extra["sessions"].opened == ["shop", "shop"]
    assert gw.rollouts.stats().setup_failed == 4 and gw.rollouts.stats().claimed == 0


def test_a_good_critic_task_after_a_broken_one_is_handed_out(gw):
    gw.rollouts.offer("g1", broken_task(), 1)
    gw.rollouts.offer("g2", critic_task(), 1)
    claim = gw.claim()
    assert claim["task"]["task_id"] == "c1"
    obs = gw.post(claim["session_url"][len(gw.url):], {"sql": FIX}).json()
    assert obs == {"observation": "count(*)\n3\n(1 row)", "is_error": False}  # its own scene ran


class FakeSession:
    def __init__(self, kind: ErrorKind | None) -> None:
        self.kind, self.ran = kind, []

    def execute(self, sql):
        self.ran.append(sql)
        if self.kind is None or len(self.ran) < 2:
            return QueryResult(columns=("n",), rows=((1,),), row_count=1)
        return QueryResult.failure(self.kind, "it went wrong")


class FakeSessions:
    """Sessions whose second scene statement fails with ``kind`` (None: every statement succeeds)."""

    def __init__(self, kind: ErrorKind | None) -> None:
        self.kind, self.sessions, self.closed = kind, [], []

    def open_many(self, requests):
        assert not requests[0].preprocess_sql  # the scene runs statement by statement on the session
        self.sessions.append(FakeSession(self.kind))
        return self.sessions[-1:]

    def close_many(self, sessions):
        self.closed += sessions


@pytest.mark.parametrize("kind,dropped", [(ErrorKind.SYNTAX, True), (ErrorKind.RUNTIME, True),
                                          (ErrorKind.PERMISSION, True), (ErrorKind.TIMEOUT, True),
                                          (ErrorKind.SESSION_LOST, False), (ErrorKind.LEASE_EXPIRED, False)])
def test_an_sql_error_in_the_setup_drops_the_task_and_a_broken_session_leaves_it_waiting(kind, dropped):
    sessions = FakeSessions(kind)
    r = Rollouts(GatewayConfig(), sessions, FixedScorer())
    r.offer("g", broken_task(), 2)
    if dropped:
        with pytest.raises(NoWorkNow):
            r.claim(KEY)
        assert (r.stats().waiting, r.stats().setup_failed, r.stats().failed) == (0, 2, 2)
        (first, _) = r.drain()
        assert f"{kind.value} error: it went wrong" in first.error and "statement 2 of 2" in first.error
    else:  # the infrastructure's fault: 503 + Retry-After, the task waits for the next claim
        with pytest.raises(Unavailable) as exc:
            r.claim(KEY)
        assert exc.value.retry_after_s and "lost while the task's setup SQL ran" in str(exc.value)
        assert (r.stats().waiting, r.stats().setup_failed) == (2, 0) and r.drain() == []
    assert sessions.sessions[0].ran == list(BROKEN_SCENE) and sessions.closed == sessions.sessions


def test_a_task_without_setup_runs_nothing_and_a_good_scene_runs_in_order():
    sessions = FakeSessions(None)
    r = Rollouts(GatewayConfig(), sessions, FixedScorer())
    r.offer("g1", shop_task(), 1)
    r.offer("g2", broken_task(), 1)
    r.finish()
    assert r.claim(KEY).task.task_id == "t1" and sessions.sessions[0].ran == []
    assert r.claim(KEY).task.task_id == "c-broken" and sessions.sessions[1].ran == list(BROKEN_SCENE)
    with pytest.raises(WorkFinished):
        r.claim(KEY)
    assert sessions.closed == []
    r.close()


def test_setup_failures_are_journalled_and_a_restart_keeps_them_dropped(shop_catalog, tmp_path):
    from sqlrl.db import SessionPool
    from sqlrl.gateway.journal import Journal, JournalError, replay

    path = tmp_path / "journal.jsonl"
    pool = SessionPool()
    try:
        def rollouts():
            return Rollouts(GatewayConfig(), LocalSessions(shop_catalog, pool=pool), FixedScorer(),
                            journal=Journal(path))

        first = rollouts()
        first.offer("g1", broken_task(), 2, token="o1")
        first.offer("g2", shop_task(), 2, token="o2")
        live = first.claim(KEY)  # the broken task dropped on the way
        ends = [json.loads(line) for line in path.read_text().splitlines() if '"end"' in line]
        assert len(ends) == 2 and all(e["unclaimed"] and e["key"] is None for e in ends)
        assert {e["trace"]["failure"] for e in ends} == {"setup-failed"}
        state = replay(path)
        assert state.counts["setup_failed"] == 2 and state.counts["failed"] == 2 and state.counts["claimed"] == 1
        assert [(g, t["task_id"]) for g, t in state.waiting] == [("g2", "t1")]

        second = rollouts()  # a restart: the dropped rollouts do not wait again; their traces come back
        traces = {t.rollout_id: t for t in second.drain()}
        assert sorted(t.failure.value for t in traces.values() if t.failure) == ["setup-failed"] * 2
        assert traces[live.rollout_id].status == "expired"
        assert second.stats().setup_failed == 2 and second.stats().waiting == 1
        assert second.claim(KEY).task.task_id == "t1"
        second.close()
        first.close()
    finally:
        pool.close()
    # an unclaimed end matching no waiting rollout is corruption, named
    bad = tmp_path / "bad.jsonl"
    trace = RolloutTrace(rollout_id="x", task_id="nope", group_id="g", calls=(), status="failed",
                         failure=FailReason.SETUP)
    bad.write_text(json.dumps({"kind": "end", "trace": trace.to_dict(), "key": None, "unclaimed": True}) + "\n"
                   + json.dumps({"kind": "finish"}) + "\n")
    with pytest.raises(JournalError, match="x matches no offered rollout"):
        replay(bad)


def test_a_failure_reason_belongs_to_a_failed_trace_and_round_trips():
    t = RolloutTrace(rollout_id="r", task_id="t", group_id="g", calls=(), status="failed", failure="setup-failed")
    assert t.failure is FailReason.SETUP and RolloutTrace.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    old = {k: v for k, v in t.to_dict().items() if k != "failure"}  # a trace journalled before the field
    assert RolloutTrace.from_dict(old).failure is None
    with pytest.raises(ValueError, match="ends failed"):
        RolloutTrace(rollout_id="r", task_id="t", group_id="g", calls=(), status="expired", failure=FailReason.SETUP)
    with pytest.raises(ValueError, match="not a valid FailReason"):
        RolloutTrace(rollout_id="r", task_id="t", group_id="g", calls=(), status="failed", failure="nope")


def test_training_leaves_setup_failures_out_of_their_group_and_the_job_does_not_redraw_them():
    from sqlrl.gateway.job import AgentJobConfig, run_steps
    from sqlrl.gateway.sequences import SequenceConfig
    from sqlrl.gateway.train import TraceTrainConfig, build_step
    from sqlrl.learn.config import GRPOConfig

    from .test_job_loop import FakeLearner, ScriptedGateway
    from .test_seq_train import traced

    def setup_failed(rid, group):
        return RolloutTrace(rollout_id=rid, task_id=f"task-{group}", group_id=group, calls=(), status="failed",
                            error="the task's setup SQL failed", failure=FailReason.SETUP)

    traces = [traced("a1", "A", 1.0), traced("a2", "A", 0.0), setup_failed("a3", "A"),
              traced("b1", "B", 1.0, status="failed")]
    cfg = TraceTrainConfig(SequenceConfig(unfinished="zero"), min_group_size=2)
    build = build_step(traces, cfg, GRPOConfig(), pad_id=0)
    by_id = {r.rollout_id: r for r in build.rows.rollouts}
    assert by_id["a3"].reward is None and not by_id["a3"].in_group  # out, whatever `unfinished` says
    assert by_id["b1"].reward == 0.0  # a client's failure still counts as zero
    assert build.metrics["failed"] == 2 and build.metrics["setup_failed"] == 1

    class Gateway(ScriptedGateway):
        def offer(self, group_id, task, n):
            self.events.append(("offer", group_id, task, n))
            for _ in range(n):
                k = self.counts[group_id] = self.counts.get(group_id, -1) + 1
                self.pending.append(setup_failed(f"{group_id}-{k}", group_id) if task == "broken"
                                    else traced(f"{group_id}-{k}", group_id, float(k % 2)))

    gw = Gateway(lambda g, t, k: None)
    (row,) = run_steps(AgentJobConfig(steps=1, tasks_per_step=2, group_size=2, redraws=3),
                       ["broken", "t1"], gw, FakeLearner(), pad_id=0)
    assert [e[1:] for e in gw.events if e[0] == "offer"] == [("s0/g0", "broken", 2), ("s0/g1", "t1", 2)]
    assert row["redrawn"] == 0 and row["setup_failed"] == 2 and row["groups_trained"] == 1 and row["updated"]
