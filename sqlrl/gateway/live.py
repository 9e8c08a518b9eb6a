"""One live rollout of the gateway and its calls in flight (Ray-free; ``Rollouts`` owns them, under its lock).

- ``LiveRollout``: a claimed rollout's state -- its task, deadline, session, status, the calls
  captured whole and those still open (each with its cancel) -- and ``trace(status, **fields)``:
  its ``RolloutTrace`` with the captured calls in the order received, and how many of them do not
  extend the previous call's prompt + response (prefix mismatches). ``settle(seq, call)`` settles
  one open call once (recorded whole, or counted incomplete when None); ``cut_calls()`` counts
  every open call incomplete at the rollout's end and returns their cancels.
- ``CallTicket``: one call in flight, settled once through the owner's ``settle``: ``commit``
  records it whole, its versions read as the job's (``PolicyWeights.job_generation``);
  ``abandon`` counts it incomplete.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from sqlrl.policy.types import Generation

from .capture import CapturedCall, extends
from .contract import RolloutClosed
from .trace import RolloutTrace
from .weights import PolicyWeights


@dataclass(eq=False)
class LiveRollout:
    id: str
    key: str
    group_id: str
    task: Any  # a task of a registered kind (sqlrl.tasks.kinds)
    deadline: float
    session: Any
    status: str = "active"  # active | closing | completed | expired | failed
    seq: int = 0
    captured: list[CapturedCall] = field(default_factory=list)
    open_calls: dict[int, Callable[[], None] | None] = field(default_factory=dict)  # seq -> cancel
    n_incomplete: int = 0
    sql_lock: threading.Lock = field(default_factory=threading.Lock)

    def open_call(self, cancel: Callable[[], None] | None) -> int:
        """A new call's ``seq`` (0, 1, ...), open until settled; ``cancel`` stops it at the end."""
        seq, self.seq = self.seq, self.seq + 1
        self.open_calls[seq] = cancel
        return seq

    def settle(self, seq: int, call: CapturedCall | None) -> bool:
        """Settle open call ``seq``: False when it was settled already (``abandon`` is idempotent);
        ``RolloutClosed`` for a commit after the rollout ended (it was counted incomplete then)."""
        if seq not in self.open_calls:
            if self.status != "active" and call is not None:
                raise RolloutClosed(f"rollout {self.id} ended while this call ran")
            return False
        del self.open_calls[seq]
        if call is None:
            self.n_incomplete += 1
        else:
            self.captured.append(call)
        return True

    def cut_calls(self) -> tuple[int, list[Callable[[], None]]]:
        """Every open call counted incomplete (the rollout ends): ``(how many, their cancels)``."""
        n, cancels = len(self.open_calls), [c for c in self.open_calls.values() if c is not None]
        self.n_incomplete += n
        self.open_calls.clear()
        return n, cancels

    def trace(self, status: str, **fields: Any) -> tuple[RolloutTrace, int]:
        """``(trace, prefix mismatches)`` of this rollout ending with ``status``."""
        captured = sorted(self.captured, key=lambda c: c.seq)
        calls = tuple(c.traced(self.id, i) for i, c in enumerate(captured))
        mismatches = sum(not extends(a, b.prompt_ids) for a, b in zip(captured, captured[1:]))
        return RolloutTrace(rollout_id=self.id, task_id=self.task.task_id, group_id=self.group_id, calls=calls,
                            status=status, n_incomplete=self.n_incomplete, **fields), mismatches


Settle = Callable[[LiveRollout, int, "CapturedCall | None"], None]


class CallTicket:
    """One call in flight (module docstring): settle it with ``commit`` or ``abandon``."""

    def __init__(self, settle: Settle, weights: PolicyWeights, rollout: LiveRollout, seq: int) -> None:
        self._settle, self._weights, self._rollout, self.seq = settle, weights, rollout, seq

    @property
    def rollout_id(self) -> str:
        return self._rollout.id

    def commit(self, prompt_ids: Sequence[int], generation: Generation, tag: str | None) -> None:
        generation = self._weights.job_generation(generation)  # the engine's versions, read as the job's
        self._settle(self._rollout, self.seq, CapturedCall(self.seq, tag, tuple(map(int, prompt_ids)), generation))

    def abandon(self) -> None:
        self._settle(self._rollout, self.seq, None)
