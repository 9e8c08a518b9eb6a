"""The claimed rollouts' deadlines (Ray-free; ``Rollouts`` owns one, under its lock).

A rollout must complete within ``GatewayConfig.deadline_s`` of its claim, fixed at the claim (not
extended by activity) and measured on the clock ``Rollouts`` was given (tests advance a fake one).
``Deadlines`` keeps ``(deadline, rollout id)`` in a heap. Guarantees:

- ``due(now, active)``: whether some rollout still active (``active(rollout_id)``) is past its
  deadline. It looks at the earliest entries only: those of rollouts no longer active (completed,
  failed, closing) are dropped as they surface, so the app may ask on every request -- O(1)
  amortised, however many rollouts are live -- and no I/O is done.
- ``pop_due(now, active)``: the ids of every active rollout past its deadline, earliest first,
  each returned once (their entries leave the heap); the caller ends them.
- An entry is never returned for a rollout ``active`` says has ended.

Not thread-safe by itself.
"""

from __future__ import annotations

import heapq
from typing import Callable

__all__ = ["Deadlines"]


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, deadline: float, rollout_id: str) -> None:
        heapq.heappush(self._heap, (deadline, rollout_id))

    def due(self, now: float, active: Callable[[str], bool]) -> bool:
        heap = self._heap
        while heap:
            deadline, rollout_id = heap[0]
            if active(rollout_id):
                return deadline <= now
            heapq.heappop(heap)  # ended or closing: it never needs expiring again
        return False

    def pop_due(self, now: float, active: Callable[[str], bool]) -> list[str]:
        heap, out = self._heap, []
        while heap and heap[0][0] <= now:
            _, rollout_id = heapq.heappop(heap)
            if active(rollout_id):
                out.append(rollout_id)
        return out
