"""ActorGroup in-process (actors/group.py): the same fan-out contract as with Ray — values in the
order asked, a typed ``Failed`` placeholder for a member that raised — with Ray never imported."""

from __future__ import annotations

import sys

import pytest

from actors.group import RAISED, ActorGroup, Failed


class Member:
    def __init__(self, index: int) -> None:
        self.index = index
        self.calls = 0

    def work(self, x: int) -> int:
        self.calls += 1
        if x < 0:
            raise ValueError(f"member {self.index} refuses {x}")
        return self.index * 100 + x


@pytest.fixture()
def no_ray(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # any `import ray` now raises ImportError


def test_fan_out_in_process_keeps_order_and_types_failures(no_ray) -> None:
    group = ActorGroup(Member, in_process=True, incarnations=True)
    group.add({k: (k,) for k in (2, 0, 1)})
    out = group.fan_out(Member.work, {1: (5,), 0: (-1,), 2: (7,)}, timeout_s=1, restart_late=True,
                        live_only=True)
    assert list(out) == [1, 0, 2] and out[1] == 105 and out[2] == 207
    failed = out[0]
    assert isinstance(failed, Failed) and failed.kind == RAISED and failed.member == 0
    assert isinstance(failed.error, ValueError) and "refuses -1" in failed.message
    assert group.call_all(Member.work, 1, timeout_s=1) == {2: 201, 0: 1, 1: 101}
    assert group.call_all(Member.work, 3, timeout_s=1, keys=[1]) == {1: 103}
    assert [m.calls for m in group.values()] == [2, 2, 3]


def test_members_are_added_removed_and_stopped(no_ray) -> None:
    group = ActorGroup(Member, in_process=True)
    group.add({"a": (1,), "b": (2,)})
    assert "a" in group and len(group) == 2 and sorted(group) == ["a", "b"]
    assert group.pop("a").index == 1 and "a" not in group
    group.stop()
    assert len(group) == 0 and group.fan_out(Member.work, {}, timeout_s=1) == {}


class Closable(Member):
    closed: list[int] = []

    def close(self) -> None:
        Closable.closed.append(self.index)


def test_stop_closes_in_process_members_that_can_close(no_ray) -> None:
    Closable.closed = []
    group = ActorGroup(Closable, in_process=True)
    group.add({k: (k,) for k in (0, 1, 2)})
    group.stop([1])
    assert Closable.closed == [1] and sorted(group.members) == [0, 2]
    group.stop()
    assert sorted(Closable.closed) == [0, 1, 2] and not group.members
    plain = ActorGroup(Member, in_process=True)  # no close(): stopping is just forgetting
    plain.add({0: (0,)})
    plain.stop()
    assert not plain.members
