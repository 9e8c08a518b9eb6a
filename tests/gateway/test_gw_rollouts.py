"""``sqlrl.gateway`` without HTTP: tags, prefix checks, the rollout lifecycle's edges (a session that
cannot open, a scorer that fails, tickets settled twice or after the end, the gateway stopping)."""

from __future__ import annotations

import pytest

from sqlrl.db import SessionPool
from sqlrl.db.source import LocalSessions
from sqlrl.gateway.capture import CapturedCall, call_tag, extends
from sqlrl.gateway.rollouts import (GatewayConfig, NoWorkNow, RolloutClosed, RolloutNotFound, Rollouts,
                                    Unavailable)
from sqlrl.policy.types import Generation
from sqlrl.rewards.registry import RewardBreakdown

from .conftest import GOLD, FakeClock, shop_task


class FixedScorer:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.seen = fail, []

    def score(self, task, sql):
        self.seen.append(sql)
        if self.fail:
            raise RuntimeError("judge down")
        return RewardBreakdown(1.0, {"result": 1.0})


def gen(ids):
    return Generation(tuple(ids), (-0.5,) * len(ids), "x", "eos", versions=(3,) * len(ids))


@pytest.fixture
def parts(shop_catalog):
    pool = SessionPool()
    clock = FakeClock()
    scorer = FixedScorer()
    r = Rollouts(GatewayConfig(deadline_s=10), LocalSessions(shop_catalog, pool=pool), scorer, clock=clock)
    yield r, pool, clock, scorer
    r.close()
    pool.close()


def test_tag_precedence_and_validation():
    assert call_tag({"metadata": {"tag": "write"}, "user": "u"}, "check") == "write"
    assert call_tag({"metadata": {"other": "x"}, "user": "u"}, "check") == "check"
    assert call_tag({"user": "rewrite"}, None) == "rewrite"
    assert call_tag({}, None) is None
    for body, header in (({"metadata": {"tag": 3}}, None), ({"metadata": ["tag"]}, None),
                         ({}, "x" * 65), ({"user": "a b"}, None), ({"metadata": {"tag": ""}}, None)):
        with pytest.raises(ValueError):
            call_tag(body, header)


def test_extends_is_an_exact_prefix_check_on_ids():
    prev = CapturedCall(0, None, (1, 2), gen([3, 4]))
    assert extends(None, (9,)) and extends(prev, (1, 2, 3, 4)) and extends(prev, (1, 2, 3, 4, 5))
    assert not extends(prev, (1, 2, 3)) and not extends(prev, (1, 2, 4, 4, 5))


def test_calls_are_recorded_whole_in_the_order_received(parts):
    r, pool, clock, scorer = parts
    r.offer("g", shop_task(), 1)
    c = r.claim("k")
    first, second, third = (r.begin_call("k", c.rollout_id) for _ in range(3))
    second.commit([1, 2], gen([5]), "check")  # finishes before the first
    first.commit([1], gen([2]), "write")
    third.abandon()
    third.abandon()  # settled once: no double count
    with pytest.raises(RolloutNotFound):
        r.begin_call("other-key", c.rollout_id)
    trace = r.complete("k", c.rollout_id, sql=GOLD)
    assert [(x.index, x.tag, x.prompt_ids, x.response_ids) for x in trace.calls] == [
        (0, "write", (1,), (2,)), (1, "check", (1, 2), (5,))]
    assert trace.calls[0].versions == (3,) and trace.calls[0].logprobs == (-0.5,)
    assert trace.n_incomplete == 1 and trace.reward == 1.0 and scorer.seen == [GOLD]
    assert r.stats().prefix_mismatches == 0 and pool.stats().in_use == 0


def test_a_call_that_finishes_after_its_rollout_ended_is_refused(parts):
    r, pool, clock, _ = parts
    r.offer("g", shop_task(), 1)
    c = r.claim("k")
    ticket = r.begin_call("k", c.rollout_id)
    clock.advance(10)
    assert r.due() and r.expire_due() == 1 and not r.due()
    with pytest.raises(RolloutClosed):
        ticket.commit([1], gen([2]), None)
    (trace,) = r.drain()
    assert trace.status == "expired" and trace.n_incomplete == 1 and trace.calls == ()
    assert r.drain() == [] and pool.stats().in_use == 0


def test_due_looks_at_the_earliest_deadline_of_a_rollout_still_active(parts):
    """``due()`` keeps the claimed rollouts' deadlines in a heap: a rollout that completed is never
    due (its entry is dropped), a later rollout still live is found behind it, and every rollout
    past its deadline is expired by ``expire_due``."""
    r, pool, clock, _ = parts
    r.offer("g", shop_task(), 3)
    first = r.claim("k")
    clock.advance(4)
    second, third = r.claim("k"), r.claim("k")  # deadlines 10 s and 14 s after the start
    assert not r.due()
    r.complete("k", first.rollout_id, sql=GOLD)
    clock.advance(7)  # past the first's deadline, which completed: nothing is due
    assert not r.due() and r.expire_due() == 0
    clock.advance(3)  # past the second's and third's
    assert r.due() and r.expire_due() == 2 and not r.due()
    statuses = {t.rollout_id: t.status for t in r.drain()}
    assert statuses == {first.rollout_id: "completed", second.rollout_id: "expired", third.rollout_id: "expired"}
    assert pool.stats().in_use == 0


def test_a_session_that_cannot_open_leaves_the_task_waiting(parts, shop_catalog):
    r, pool, _, _ = parts
    from sqlrl.tasks.types import Text2SQLTask

    r.offer("g", Text2SQLTask("t", "nowhere", "q?", "SELECT 1"), 1)
    with pytest.raises(Unavailable):
        r.claim("k")
    assert r.stats().waiting == 1 and r.stats().active == 0 and pool.stats().in_use == 0


def test_a_failing_scorer_fails_the_rollout_and_releases_its_session(shop_catalog):
    pool = SessionPool()
    r = Rollouts(GatewayConfig(), LocalSessions(shop_catalog, pool=pool), FixedScorer(fail=True))
    r.offer("g", shop_task(), 1)
    c = r.claim("k")
    with pytest.raises(RuntimeError, match="judge down"):
        r.complete("k", c.rollout_id, sql=GOLD)
    (trace,) = r.drain()
    assert trace.status == "failed" and "judge down" in trace.error and trace.reward is None
    assert pool.stats().in_use == 0
    with pytest.raises(NoWorkNow):
        r.claim("k")


def test_offers_are_checked_and_stopping_fails_live_rollouts(parts):
    r, pool, _, _ = parts
    with pytest.raises(TypeError):
        r.offer("g", {"question": "q"}, 1)
    with pytest.raises(ValueError):
        r.offer("g", shop_task(), 0)
    with pytest.raises(ValueError):
        GatewayConfig(reward="no-such-reward")
    r.offer("g", shop_task(), 2)
    r.claim("k"), r.claim("k")
    assert pool.stats().in_use == 2 and r.close() == 2 and pool.stats().in_use == 0
    assert {t.status for t in r.drain()} == {"failed"}
    r.finish()
    with pytest.raises(RuntimeError):
        r.offer("g", shop_task(), 1)


def test_wait_idle_returns_when_the_last_rollout_ends_and_close_releases_it(parts):
    import threading

    r, _, clock, _ = parts
    r.offer("g", shop_task(), 2)
    assert not r.wait_idle(timeout=0)  # two wait to be claimed
    a, b = r.claim("k").rollout_id, r.claim("k").rollout_id
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(r.wait_idle()))
    waiter.start()
    r.complete("k", a, sql=GOLD)
    assert r.rollout_status(b) == "active" and not got  # one still live: the waiter still waits
    clock.advance(11)
    r.expire_due()  # the other expires: every offered rollout has ended
    waiter.join(timeout=60)
    assert got == [True] and r.idle()

    r.offer("g2", shop_task(), 1)
    waiter = threading.Thread(target=lambda: got.append(r.wait_idle()))
    waiter.start()
    r.close()  # the gateway stops: the job's wait is released, not idle (one was never claimed)
    waiter.join(timeout=60)
    assert got == [True, False]


def slow_lease(leasing, go) -> type:
    """``LocalSessions`` whose ``open_many`` sets ``leasing`` and then waits for ``go``: a claim
    held between taking its task and its session being open."""

    class SlowLease(LocalSessions):
        def open_many(self, requests):
            leasing.set()
            assert go.wait(timeout=60)
            return super().open_many(requests)

    return SlowLease


def test_a_rollout_whose_session_is_being_leased_keeps_the_step_waiting(shop_catalog):
    """Between a claim taking a task off the waiting list and its rollout going live, the session
    is leased outside the lock: the gateway is not idle then. (It was: the job's step wait
    returned with that rollout unaccounted for, and its trace was drained with the next step --
    seen as step rows of 1 and 3 completed rollouts instead of 2 and 2.)"""
    import threading

    leasing, go = threading.Event(), threading.Event()
    SlowLease = slow_lease(leasing, go)

    pool = SessionPool()
    r = Rollouts(GatewayConfig(), SlowLease(shop_catalog, pool=pool), FixedScorer())
    try:
        r.offer("g", shop_task(), 1)
        claimed: list = []
        claimer = threading.Thread(target=lambda: claimed.append(r.claim("k")))
        claimer.start()
        assert leasing.wait(timeout=60)
        assert not r.idle() and not r.wait_idle(timeout=0)  # neither waiting nor live, but not ended
        go.set()
        claimer.join(timeout=60)
        assert not r.idle()
        r.complete("k", claimed[0].rollout_id, sql=GOLD)
        assert r.wait_idle(timeout=60) and len(r.drain()) == 1
    finally:
        go.set()
        r.close()
        pool.close()


def test_a_claim_in_progress_counts_toward_the_keys_live_cap(shop_catalog):
    """Racing claims by one key cannot pass ``max_live_per_key``: a claim whose session is still
    being leased (neither waiting nor live) already counts; another key is not held back."""
    import threading

    from sqlrl.gateway.rollouts import TooManyLive

    leasing, go = threading.Event(), threading.Event()
    SlowLease = slow_lease(leasing, go)

    pool = SessionPool()
    r = Rollouts(GatewayConfig(max_live_per_key=1), SlowLease(shop_catalog, pool=pool), FixedScorer())
    try:
        r.offer("g", shop_task(), 3)
        claimed: list = []
        claimer = threading.Thread(target=lambda: claimed.append(r.claim("k")))
        claimer.start()
        assert leasing.wait(timeout=60)  # k's first claim holds its place, its session not yet open
        with pytest.raises(TooManyLive):
            r.claim("k")
        assert r.stats().waiting == 2  # the refused claim took nothing
        go.set()
        claimer.join(timeout=60)
        assert len(claimed) == 1 and r.claim("other").rollout_id
        with pytest.raises(TooManyLive):
            r.claim("k")
    finally:
        go.set()
        r.close()
        pool.close()
