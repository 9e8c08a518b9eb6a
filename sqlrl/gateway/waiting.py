"""The gateway's claim queue: the rollouts waiting to be claimed, by task kind (Ray-free; ``Rollouts``
owns one, under its lock).

``Waiting`` holds each offered rollout as ``(group_id, task)`` until a claim takes it, whether the
job has finished offering (``finished``) and the offers' idempotency tokens. Guarantees:

- **Offer order.** ``take(accept)`` gives the earliest-offered waiting rollout whose task is of a
  kind in ``accept`` (None: any kind), in the order ``add`` put them in, across kinds; a rollout put
  back (``put_back``: its session could not be opened) is the first taken again.
- **By kind.** One FIFO per kind (``sqlrl.tasks.kinds``: ``kind_of(task).name``): a take looks at
  one head per kind -- O(kinds), however many rollouts wait -- and a claim that accepts some kinds
  never walks past the others' rollouts.
- ``drop(task)`` takes every waiting rollout of that task (an equal task, any group) off and
  returns their group ids in offer order: a task whose setup SQL failed is not handed out again
  until it is offered again.
- ``next(accept, retry_after_s)`` is ``take`` for a claim: nothing of those kinds waiting raises
  ``NoWorkNow`` (HTTP 204 + ``Retry-After``), or ``WorkFinished`` (410) once ``finished``: the job
  offers no more work, so none of those kinds can come.
- ``admit(token)``: whether an offer is new -- False for a token already admitted (the driver
  repeats a call whose answer it lost: a no-op), ``RuntimeError`` for a new offer after
  ``finished``.
- ``len()`` counts every waiting rollout.

Not thread-safe by itself.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Collection

from sqlrl.tasks.kinds import kind_of

from .contract import NoWorkNow, WorkFinished

__all__ = ["Waiting"]


class Waiting:
    def __init__(self) -> None:
        self._by_kind: dict[str, deque[tuple[int, str, Any]]] = {}  # kind -> (order, group_id, task)
        self._order = itertools.count()  # offers: 0, 1, 2, ...
        self._front = -1  # put-backs: -1, -2, ... (before every offer)
        self._n = 0
        self.finished = False  # no more offers will come
        self.tokens: set[str] = set()  # idempotency keys of the offers admitted

    def __len__(self) -> int:
        return self._n

    def add(self, group_id: str, task: Any, n: int = 1) -> None:
        """``n`` rollouts of ``task`` wait, after every one waiting now."""
        queue = self._by_kind.setdefault(kind_of(task).name, deque())
        for _ in range(n):
            queue.append((next(self._order), group_id, task))
        self._n += n

    def put_back(self, group_id: str, task: Any) -> None:
        """A taken rollout waits again, before every other."""
        self._by_kind.setdefault(kind_of(task).name, deque()).appendleft((self._front, group_id, task))
        self._front -= 1
        self._n += 1

    def take(self, accept: Collection[str] | None = None) -> tuple[str, Any] | None:
        """The earliest waiting ``(group_id, task)`` of a kind in ``accept`` (None: any), or None."""
        heads = [(q[0][0], q) for name, q in self._by_kind.items() if q and (accept is None or name in accept)]
        if not heads:
            return None
        _, queue = min(heads, key=lambda h: h[0])
        _, group_id, task = queue.popleft()
        self._n -= 1
        return group_id, task

    def next(self, accept: Collection[str] | None, retry_after_s: int) -> tuple[str, Any]:
        """``take(accept)``, or why there is none (module docstring)."""
        got = self.take(accept)
        if got is None:
            if self.finished:
                raise WorkFinished("the job has finished handing out rollouts"
                                   + (" of these kinds" if accept is not None else ""))
            raise NoWorkNow("no task is waiting now", retry_after_s)
        return got

    def admit(self, token: str | None) -> bool:
        """Whether an offer with ``token`` (None: no token) is new (module docstring)."""
        if token is not None and token in self.tokens:
            return False
        if self.finished:
            raise RuntimeError("offer after finish(): the job has finished handing out work")
        if token is not None:
            self.tokens.add(token)
        return True

    def drop(self, task: Any) -> list[str]:
        """Every waiting rollout of ``task`` off the queue; their group ids, in offer order."""
        queue = self._by_kind.get(kind_of(task).name)
        if not queue:
            return []
        kept = deque(item for item in queue if not (item[2] is task or item[2] == task))
        dropped = [g for _, g, t in queue if t is task or t == task]
        self._by_kind[kind_of(task).name] = kept
        self._n -= len(dropped)
        return dropped
