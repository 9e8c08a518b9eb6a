"""``ActorGateway`` across restarts of its actor (``actors/gateway_driver.py``), on a fake actor and a
fake ``ray`` module (no Ray instance): which calls are repeated and how, the weights restored at
their version, a restart noticed between calls, the bounds. The real actor, SIGKILLed mid-step with
Ray DB-pool leases: ``test_gw_restart.py``."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from ray.exceptions import GetTimeoutError, RayActorError

from actors.gateway import Incarnation
from actors.gateway_driver import ActorGateway, GatewayLost


class Method:
    def __init__(self, actor: "FakeActor", name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any) -> Any:
        return lambda: self.actor.call(self.name, *args)  # the "object ref": ray.get calls it


class FakeActor:
    """A gateway actor whose process ``die_on`` calls kill (the call fails, Ray restarts it: a new
    incarnation, awaiting its weights once a version was pushed); ``restarts_left`` bounds Ray."""

    def __init__(self, restarts_left: int = 1) -> None:
        self.n, self.version, self.restarts_left = 1, 0, restarts_left
        self.awaiting, self.dead = False, False
        self.die_on: list[str] = []
        self.calls: list[tuple] = []
        self.timeout = False
        self.comes_back = True  # False: the restarted process never answers

    def __getattr__(self, name: str) -> Method:
        return Method(self, name)

    def call(self, name: str, *args: Any) -> Any:
        if self.dead:
            raise RayActorError()
        if name == "incarnation" and self.timeout:
            raise GetTimeoutError("no answer")
        self.calls.append((name, *args))  # every attempt, the failed ones too
        if name in self.die_on:
            self.die_on.remove(name)
            self.timeout = not self.comes_back
            if self.restarts_left == 0:
                self.dead = True
            else:
                self.restarts_left -= 1
                self.n += 1
                self.awaiting = self.version > 0
            raise RayActorError()
        if name == "incarnation":
            return Incarnation(f"tok{self.n}", 100 + self.n, 1 if self.n > 1 else 0, 1 if self.n > 1 else 0,
                               self.awaiting)
        if name == "update_weights":
            weights, policy, version = args
            self.version, self.awaiting = version, False
            return version
        if name == "wait_step":
            return not self.awaiting
        if name == "drain":
            return [f"trace-{args[0]}"]
        return None


@pytest.fixture
def fake_ray(monkeypatch):
    ray = types.SimpleNamespace(get=lambda ref, timeout=None: ref(), put=lambda value: (lambda: value),
                                kill=lambda handle: None)
    monkeypatch.setitem(sys.modules, "ray", ray)
    return ray


def driver(actor: FakeActor, **kw: Any) -> tuple[ActorGateway, list[str]]:
    lines: list[str] = []
    gw = ActorGateway(actor, log=lines.append, **kw)
    gw._dead_for_good = lambda: actor.dead  # Ray's state API, answered by the fake
    return gw, lines


def test_an_update_in_flight_at_a_restart_restores_the_last_weights_then_repeats(fake_ray):
    actor = FakeActor()
    gw, lines = driver(actor, max_restarts=1)
    assert gw.update_weights({"w": 1}, "drain") == 1
    actor.die_on = ["update_weights"]
    assert gw.update_weights({"w": 2}, "drain") == 2
    pushes = [(c[1](), c[3]) if callable(c[1]) else (c[1], c[3]) for c in actor.calls if c[0] == "update_weights"]
    # the push that died, the last weights restored at their version, the push repeated as the same version
    assert pushes == [({"w": 1}, 1), ({"w": 2}, 2), ({"w": 1}, 1), ({"w": 2}, 2)]
    assert gw.restarts == 1 and gw.lost == 1 and gw.version == 2
    assert len(lines) == 1 and "during update_weights" in lines[0] and "policy version 1 restored" in lines[0]


def test_a_resumed_jobs_restore_push_sets_the_version_the_next_pushes_count_on_from(fake_ray):
    """A resumed job (``sqlrl.gateway.job``) gives a new gateway its restored weights as their
    version; a restart after that gets them back at that version, and the next push is version + 1."""
    actor = FakeActor()
    gw, lines = driver(actor, max_restarts=1)
    assert gw.update_weights({"w": 5}, "drain", 5) == 5 and gw.version == 5
    actor.die_on = ["update_weights"]
    assert gw.update_weights({"w": 6}, "drain") == 6
    pushes = [(c[1](), c[3]) for c in actor.calls if c[0] == "update_weights"]
    assert pushes == [({"w": 5}, 5), ({"w": 6}, 6), ({"w": 5}, 5), ({"w": 6}, 6)]
    assert "policy version 5 restored" in lines[0]


def test_drain_and_offer_are_repeated_with_their_tokens(fake_ray):
    actor = FakeActor()
    gw, _ = driver(actor, max_restarts=1)
    actor.die_on = ["drain"]
    (trace,) = gw.drain()
    drains = [c for c in actor.calls if c[0] == "drain"]
    assert len(drains) == 2 and drains[0] == drains[1] and trace == f"trace-{drains[0][1]}"  # the same token
    actor.die_on = ["offer"]
    with pytest.raises(GatewayLost, match="died during offer and is not restarted again"):
        gw.offer("g", "task", 2)  # a second death: max_restarts=1 is spent
    gw2, _ = driver(FakeActor(restarts_left=2), max_restarts=2)
    gw2.handle.die_on = ["offer"]
    gw2.offer("g", "task", 2)
    first, again = [c for c in gw2.handle.calls if c[0] == "offer"]
    assert first == again and first[1:4] == ("g", "task", 2) and first[4]  # repeated with its token


def test_a_restart_between_calls_is_noticed_by_the_step_wait(fake_ray):
    actor = FakeActor()
    gw, lines = driver(actor, max_restarts=2)
    gw.update_weights({"w": 1}, "drain")
    actor.n, actor.awaiting = 2, True  # the process died between two calls; Ray restarted it
    assert gw.wait_step(None) is True  # returned at once (weights awaited), restored, waited again
    assert [c[0] for c in actor.calls[-4:]] == ["incarnation", "ready", "update_weights", "wait_step"]
    assert gw.restarts == 1 and "during wait_step" in lines[0]


def test_a_step_wait_that_times_out_on_the_same_process_is_false(fake_ray):
    actor = FakeActor()
    gw, _ = driver(actor, max_restarts=1)
    actor.call = lambda name, *a: Incarnation("tok1", 1, 0, 0, False) if name == "incarnation" else False
    assert gw.wait_step(1.0) is False and gw.restarts == 0


def test_without_restarts_a_dead_actor_is_a_clear_error(fake_ray):
    actor = FakeActor(restarts_left=0)
    gw, _ = driver(actor)
    actor.die_on = ["wait_step"]
    with pytest.raises(GatewayLost, match=r"died during wait_step and is not restarted again \(0 of max_restarts=0"):
        gw.wait_step(None)


def test_a_restart_that_does_not_come_back_in_time_is_a_clear_error(fake_ray):
    actor = FakeActor()
    gw, _ = driver(actor, max_restarts=1, restart_timeout_s=5)
    actor.die_on, actor.comes_back = ["stats"], False
    with pytest.raises(GatewayLost, match="did not come back within restart_timeout_s=5 after stats"):
        gw.stats()


def test_an_actor_dead_for_good_is_a_clear_error(fake_ray):
    actor = FakeActor(restarts_left=0)
    gw, _ = driver(actor, max_restarts=1)  # the driver allows one; Ray had none left
    actor.die_on = ["finish"]
    with pytest.raises(GatewayLost, match="died during finish and did not come back"):
        gw.finish()


def test_bad_settings_are_refused(fake_ray):
    with pytest.raises(ValueError, match="max_restarts"):
        ActorGateway(FakeActor(), max_restarts=-1)
    with pytest.raises(ValueError, match="restart_timeout_s"):
        ActorGateway(FakeActor(), restart_timeout_s=0)
