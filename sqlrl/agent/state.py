"""The state of one rollout in the agent loop: ``State``, its legal transitions, ``RolloutState``.

``RolloutState`` is mutable while the loop drives it and becomes a frozen ``Trajectory`` at the end;
``to`` refuses an illegal transition with ``LoopStateError`` (a bug in the loop, never caused by
model output). ``add`` keeps ids, loss mask and log-probs aligned: model-generated ids carry their
log-probs and mask 1, everything else mask 0 and log-prob 0.0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Sequence

from sqlrl.tasks.types import Task
from sqlrl.tools import ToolCall

from .trajectory import Trajectory, Turn

class State(str, enum.Enum):
    PROMPTING = "prompting"
    GENERATING = "generating"
    PARSED = "parsed"
    EXECUTING = "executing"
    OBSERVED = "observed"
    DONE = "done"


_NEXT: dict[State, frozenset[State]] = {
    State.PROMPTING: frozenset({State.GENERATING, State.DONE}),
    State.GENERATING: frozenset({State.PARSED, State.DONE}),
    State.PARSED: frozenset({State.EXECUTING, State.OBSERVED, State.DONE}),
    State.EXECUTING: frozenset({State.OBSERVED, State.DONE}),
    State.OBSERVED: frozenset({State.GENERATING, State.DONE}),
    State.DONE: frozenset(),
}
_WAITING = (State.PROMPTING, State.OBSERVED)  # ready for the next generation


class LoopStateError(RuntimeError):
    """An illegal state transition: a bug in the loop, never caused by model output."""


@dataclass(eq=False)
class RolloutState:
    """One rollout in progress (mutable; becomes a frozen ``Trajectory`` at the end)."""

    index: int
    task: Task
    session: Any
    messages: list[dict[str, Any]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per id: the policy version that generated it, -1 if none
    prompt_length: int = 0
    turns: list[Turn] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    n_tool_calls: int = 0
    n_tool_errors: int = 0
    n_malformed: int = 0
    submitted_sql: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    state: State = State.PROMPTING
    history: list[State] = field(default_factory=lambda: [State.PROMPTING])

    def to(self, state: State) -> None:
        if state not in _NEXT[self.state]:
            raise LoopStateError(f"rollout {self.index}: {self.state.value} -> {state.value} "
                                 "is not a legal transition")
        self.state = state
        self.history.append(state)

    def finish(self, reason: str, error: str | None = None) -> None:
        self.stop_reason, self.error = reason, error
        self.to(State.DONE)

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None,
            versions: Sequence[int] | None = None) -> None:
        """Append ids: model-generated (with their logprobs, mask 1, and the policy version of each)
        or not (``None``, mask 0, version -1)."""
        self.ids.extend(int(i) for i in ids)
        self.mask.extend([0 if logprobs is None else 1] * len(ids))
        self.logprobs.extend([0.0] * len(ids) if logprobs is None else (float(x) for x in logprobs))
        self.versions.extend([-1] * len(ids) if versions is None else (int(v) for v in versions))

    def _token_versions(self, policy_version: int) -> tuple[int, ...]:
        """Per-token versions when some generated token is not of ``policy_version`` (a weight update
        landed mid-rollout); () otherwise (``Trajectory.versions()`` then says ``policy_version``)."""
        if all(v == policy_version for m, v in zip(self.mask, self.versions) if m):
            return ()
        return tuple(self.versions)

    def to_trajectory(self, mode: str, policy_version: int) -> Trajectory:
        return Trajectory(
            task_id=self.task.task_id, mode=mode, messages=tuple(self.messages),
            token_ids=tuple(self.ids), loss_mask=tuple(self.mask), old_logprobs=tuple(self.logprobs),
            prompt_length=self.prompt_length, turns=tuple(self.turns),
            n_tool_calls=self.n_tool_calls, n_tool_errors=self.n_tool_errors,
            n_malformed=self.n_malformed, submitted_sql=self.submitted_sql,
            stop_reason=self.stop_reason or "error", policy_version=policy_version,
            token_versions=self._token_versions(policy_version),
            error=self.error if self.stop_reason else "the rollout never finished")
