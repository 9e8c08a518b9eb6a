"""What the gateway records for every call an external agent makes, and for every rollout it ends.

This module is the boundary between the gateway (which records, ``serve/gateway*``) and training from
traces (which reads, ``sqlrl.gateway.sequences`` and ``jobs/train_agent.py``). Plain frozen values:
picklable, JSON-ready through ``to_dict``/``from_dict``, safe across Ray boundaries.

Guarantees:
- ``TracedCall.prompt_ids`` are exactly the ids the engine generated from, ``response_ids`` exactly
  the ids it sampled, ``logprobs[i]`` the sampling log-probability of ``response_ids[i]`` and
  ``versions[i]`` the policy version that produced it -- all copied from the engine's ``Generation``,
  never re-tokenised. Construction checks the three per-token tuples have one length.
- A call is recorded whole or not at all: a call that failed, was cancelled or was aborted before the
  engine returned its ``Generation`` is not a ``TracedCall``; it is counted in
  ``RolloutTrace.n_incomplete`` instead.
- ``RolloutTrace.calls`` are in the order the gateway received the calls (``index`` 0, 1, ...).
- ``RolloutTrace.status`` is one of ``ROLLOUT_STATUSES``; ``reward`` is set exactly when the status is
  ``"completed"`` (computed by the server's Judge from the client's final SQL, or taken from the client
  only where the job allows client rewards -- ``reward_source`` says which).
- ``RolloutTrace.failure`` (a ``FailReason``) says why a ``"failed"`` rollout failed -- its task's setup
  SQL, the scorer, the gateway stopping -- and is set only on failed rollouts (None on traces
  journalled before it existed). ``lost`` says the same of a rollout a gateway restart ended.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

ROLLOUT_STATUSES = ("completed", "expired", "failed")
REWARD_SOURCES = ("judge", "client", "none")


class LostReason(str, enum.Enum):
    """Why a rollout was lost (``RolloutTrace.lost``): ended by the gateway itself, not by its
    client or its deadline. Values are stable strings (journal, logs)."""

    GATEWAY_RESTART = "gateway-restart"  # live when the gateway's process died; its calls in flight went with it


class FailReason(str, enum.Enum):
    """Why a rollout failed (``RolloutTrace.failure``). Values are stable strings (journal, logs)."""

    SETUP = "setup-failed"  # its task's setup SQL (the kind's scene_sql) failed: never handed to a client
    SCORING = "scoring-failed"  # the server's scorer raised on the final SQL
    STOPPED = "gateway-stopped"  # live when the gateway stopped


@dataclass(frozen=True)
class TracedCall:
    rollout_id: str
    index: int  # 0, 1, ... in the order the gateway received the rollout's calls
    tag: str | None  # the agent role that made the call (metadata / user / header); None when untagged
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    finish_reason: str  # the engine's: "stop" | "length" | "eos" | "abort"

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise ValueError(f"response_ids ({n}), logprobs ({len(self.logprobs)}) and versions "
                             f"({len(self.versions)}) must have the same length")
        if self.index < 0 or not self.prompt_ids:
            raise ValueError("a traced call has index >= 0 and a non-empty prompt")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TracedCall":
        return cls(rollout_id=str(d["rollout_id"]), index=int(d["index"]), tag=d.get("tag"),
                   prompt_ids=tuple(int(i) for i in d["prompt_ids"]),
                   response_ids=tuple(int(i) for i in d["response_ids"]),
                   logprobs=tuple(float(x) for x in d["logprobs"]),
                   versions=tuple(int(v) for v in d["versions"]), finish_reason=str(d["finish_reason"]))


@dataclass(frozen=True)
class RolloutTrace:
    rollout_id: str
    task_id: str
    group_id: str  # the GRPO group: the rollouts handed the same task in one step share it
    calls: tuple[TracedCall, ...]
    status: str  # "completed" | "expired" | "failed"
    reward: float | None = None
    reward_source: str = "none"  # "judge" | "client" | "none"
    reward_parts: Mapping[str, float] = field(default_factory=dict)
    final_sql: str | None = None
    n_incomplete: int = 0  # calls that never finished (client gone, cancelled, aborted): not in ``calls``
    error: str | None = None
    lost: LostReason | None = None  # set when the gateway lost the rollout (its status is then "expired")
    failure: FailReason | None = None  # why it failed (its status is then "failed")

    def __post_init__(self) -> None:
        if self.lost is not None:
            object.__setattr__(self, "lost", LostReason(self.lost))
            if self.status != "expired":
                raise ValueError("a lost rollout ends expired")
        if self.failure is not None:
            object.__setattr__(self, "failure", FailReason(self.failure))
            if self.status != "failed":
                raise ValueError("a rollout with a failure reason ends failed")
        if self.status not in ROLLOUT_STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {ROLLOUT_STATUSES}")
        if self.reward_source not in REWARD_SOURCES:
            raise ValueError(f"reward_source {self.reward_source!r} is not one of {REWARD_SOURCES}")
        if (self.reward is not None) != (self.status == "completed"):
            raise ValueError("a rollout has a reward exactly when it completed")
        if [c.index for c in self.calls] != list(range(len(self.calls))):
            raise ValueError("calls must be in order, indexed 0, 1, ...")
        if any(c.rollout_id != self.rollout_id for c in self.calls):
            raise ValueError("every call must belong to this rollout")

    @property
    def setup_failed(self) -> bool:
        """Its task's setup SQL failed: no client ever had it, so it is nobody's outcome (not the
        policy's, not a dead client's): training leaves it out of its group and the job does not
        redraw it."""
        return self.failure is FailReason.SETUP

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["calls"] = [c.to_dict() for c in self.calls]
        d["reward_parts"] = dict(self.reward_parts)
        d["lost"] = None if self.lost is None else self.lost.value
        d["failure"] = None if self.failure is None else self.failure.value
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RolloutTrace":
        d = dict(d)
        d["calls"] = tuple(TracedCall.from_dict(c) for c in d["calls"])
        d["reward_parts"] = dict(d.get("reward_parts") or {})
        return cls(**d)
