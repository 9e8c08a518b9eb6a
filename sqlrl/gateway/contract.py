"""The gateway core's values, errors and configuration (Ray-free): what ``Rollouts``
(``sqlrl.gateway.rollouts``) takes and gives.

- ``GatewayError`` and its kinds, each with the HTTP ``status`` (and OpenAI ``code``) the app answers
  with: ``BadInput`` 400, ``NotAllowed`` 403, ``RolloutNotFound`` 404, ``RolloutClosed`` 409,
  ``WorkFinished`` 410, ``NoWorkNow`` 204, ``Busy`` 429, ``Unavailable`` 503 (the last three with
  ``retry_after_s``).
- ``GatewayConfig``: deadlines, client rewards, the reward's name (checked against the registry at
  construction), ``Retry-After``, what calls do during a weight update, the sessions' SQL limits.
- ``Scorer`` (the Protocol ``Rollouts`` grades final SQL with) and ``JudgeScorer`` (the reward
  registry's ``compute`` with a ``Judge``); ``Claim`` (a claimed rollout); ``GatewayStats``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sqlrl.rewards.registry import RewardBreakdown, RewardConfig, compute, get_reward
from sqlrl.tasks.types import Text2SQLTask


class GatewayError(Exception):
    """A refusal the client can act on; ``status`` is the HTTP status the app answers with."""

    status = 500
    code: str | None = None

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BadInput(GatewayError):
    status, code = 400, "invalid_request"


class NotAllowed(GatewayError):
    status, code = 403, "client_rewards_not_allowed"


class RolloutNotFound(GatewayError):
    status, code = 404, "rollout_not_found"


class RolloutClosed(GatewayError):
    status, code = 409, "rollout_closed"


class WorkFinished(GatewayError):
    status, code = 410, "no_more_work"


class NoWorkNow(GatewayError):
    status = 204


class Busy(GatewayError):
    status, code = 429, "updating_weights"


class Unavailable(GatewayError):
    status, code = 503, "session_unavailable"


@dataclass(frozen=True)
class GatewayConfig:
    deadline_s: float = 600.0  # a rollout must complete within this long after its claim
    client_rewards: bool = False  # True: complete may carry {"reward": x} (non-SQL agents)
    reward: str = "hybrid_agentic"  # the reward registry's name the Judge scores final SQL with
    retry_after_s: int = 2  # Retry-After of 204 (no work now) and 429 (weights updating)
    during_update: str = "wait"  # "wait": calls wait for the engine; "reject": 429 + Retry-After
    sql_timeout_s: float = 5.0  # the rollout session's limits (sqlrl.db Limits)
    sql_max_rows: int = 1_000

    def __post_init__(self) -> None:
        if not self.deadline_s > 0 or self.retry_after_s < 1:
            raise ValueError("gateway: deadline_s must be > 0 and retry_after_s >= 1")
        if self.during_update not in ("wait", "reject"):
            raise ValueError(f"gateway.during_update must be 'wait' or 'reject', got {self.during_update!r}")
        try:
            get_reward(self.reward)  # an unknown reward is an error now, not at the first completion
        except KeyError as exc:
            raise ValueError(f"gateway.reward: {exc.args[0]}") from None


class Scorer(Protocol):
    """Scores a rollout's final SQL for its task (on sessions of its own)."""

    def score(self, task: Any, sql: str) -> RewardBreakdown: ...


class JudgeScorer:
    """The reward registry's ``compute`` with the job's ``Judge``: the final SQL is graded as the
    built-in agent's ``submit_solution`` would be."""

    def __init__(self, judge: Any, reward: str = "hybrid_agentic", config: RewardConfig = RewardConfig()) -> None:
        get_reward(reward)
        self.judge, self.reward, self.config = judge, reward, config

    def score(self, task: Any, sql: str) -> RewardBreakdown:
        return compute(self.reward, task, [{"name": "submit_solution", "arguments": {"sql": sql}}],
                       self.judge, self.config)


@dataclass(frozen=True)
class Claim:
    rollout_id: str
    group_id: str
    task: Text2SQLTask
    deadline_s: float
    schema: str | None  # the database's CREATE TABLE statements in the task's dialect, if known


@dataclass(frozen=True)
class GatewayStats:
    claimed: int = 0
    completed: int = 0
    expired: int = 0
    failed: int = 0
    active: int = 0
    waiting: int = 0  # rollouts offered and not yet claimed
    in_flight: int = 0  # calls begun and not yet settled
    calls: int = 0  # calls recorded whole
    incomplete: int = 0  # calls that never finished
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefix_mismatches: int = 0  # calls of ended rollouts whose prompt does not extend the previous call's
    lost: int = 0  # rollouts a gateway restart ended (live when its process died; counted in expired too)
