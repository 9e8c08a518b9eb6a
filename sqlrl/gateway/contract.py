"""The gateway core's values, errors and configuration (Ray-free): what ``Rollouts``
(``sqlrl.gateway.rollouts``) takes and gives.

- ``GatewayError`` and its kinds, each with the HTTP ``status`` (and OpenAI ``code``; ``param`` when
  one body field is to blame) the app answers with: ``BadInput`` 400, ``NotAllowed`` 403,
  ``RolloutNotFound`` 404, ``RolloutClosed`` 409, ``KindsNotOffered`` 409, ``WorkFinished`` 410,
  ``NoWorkNow`` 204, ``Busy`` 429, ``TooManyLive`` 429, ``Unavailable`` 503 (the last four with
  ``retry_after_s``).
- ``GatewayConfig``: deadlines, client rewards (and their bound, ``client_reward_limit``), the
  reward's name (checked against the registry at construction), ``Retry-After``, what calls do
  during a weight update, the sessions' SQL limits and the threads the app runs their SQL in
  (``sql_workers``), how many live rollouts one key may hold (``max_live_per_key``; a rollout runs
  one statement at a time, so this also bounds the SQL threads one key holds: ``check_claim``),
  the task kinds it hands out (``handed_out()``), and what a claim's declared
  ``kinds`` accept (``accepted``: 400 for a malformed or unknown kind, 409 when the job hands out none of them).
- ``Scorer`` (the Protocol ``Rollouts`` grades final SQL with) and ``JudgeScorer`` (the reward
  registry's ``compute`` with a ``Judge``: the reward routes by the task's kind); ``Claim`` (a
  claimed rollout); ``GatewayStats``.
- ``task_payload(task, schema)``: the claim's ``task`` object for a task of any registered kind --
  the fields every kind shares (``sqlrl.tasks.kinds.PAYLOAD_COMMON``) and the kind's own
  (``TaskKind.payload``, read from its unlabelled request: never the gold answer, tests or meta).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sqlrl.rewards.registry import RewardBreakdown, RewardConfig, compute, get_reward
from sqlrl.tasks.kinds import get_kind, kind_of, kinds


class GatewayError(Exception):
    """A refusal the client can act on; ``status`` is the HTTP status the app answers with."""

    status = 500
    code: str | None = None

    def __init__(self, message: str, retry_after_s: int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.retry_after_s, self.param = retry_after_s, param


class BadInput(GatewayError):
    status, code = 400, "invalid_request"


class NotAllowed(GatewayError):
    status, code = 403, "client_rewards_not_allowed"


class RolloutNotFound(GatewayError):
    status, code = 404, "rollout_not_found"


class RolloutClosed(GatewayError):
    status, code = 409, "rollout_closed"


class KindsNotOffered(GatewayError):
    """A claim declared only task kinds this job does not hand out: no claim of it can ever succeed."""

    status, code = 409, "kinds_not_offered"


class WorkFinished(GatewayError):
    status, code = 410, "no_more_work"


class NoWorkNow(GatewayError):
    status = 204


class Busy(GatewayError):
    status, code = 429, "updating_weights"


class TooManyLive(GatewayError):
    """A claim by a key that holds ``GatewayConfig.max_live_per_key`` live rollouts already."""

    status, code = 429, "too_many_live_rollouts"


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
    sql_workers: int = 32  # threads the app runs rollouts' SQL in (its own: not those claims, completions, expiry use)
    client_reward_limit: float = 1e6  # a client reward lies in [-limit, limit] (float32 advantages stay finite)
    task_kinds: tuple[str, ...] = ()  # the kinds ``offer`` takes (sqlrl.tasks.kinds names); (): any registered
    max_live_per_key: int = 0  # live rollouts (claimed, not yet ended) one API key may hold; 0: no cap

    def __post_init__(self) -> None:
        for name in self.task_kinds:
            try:
                get_kind(name)
            except KeyError as exc:
                raise ValueError(f"gateway.task_kinds: {exc.args[0]}") from None
        if not 0 < self.client_reward_limit <= 1e100:  # also refuses NaN: no reward could pass it
            raise ValueError(f"gateway.client_reward_limit must be in (0, 1e100], got {self.client_reward_limit!r}")
        if isinstance(self.sql_workers, bool) or not isinstance(self.sql_workers, int) or self.sql_workers < 1:
            raise ValueError(f"gateway.sql_workers must be an int >= 1, got {self.sql_workers!r}")
        if isinstance(self.max_live_per_key, bool) or not isinstance(self.max_live_per_key, int) \
                or self.max_live_per_key < 0:
            raise ValueError(f"gateway.max_live_per_key must be an int >= 0 (0: no cap), got {self.max_live_per_key!r}")
        if not self.deadline_s > 0 or self.retry_after_s < 1:
            raise ValueError("gateway: deadline_s must be > 0 and retry_after_s >= 1")
        if self.during_update not in ("wait", "reject"):
            raise ValueError(f"gateway.during_update must be 'wait' or 'reject', got {self.during_update!r}")
        try:
            get_reward(self.reward)  # an unknown reward is an error now, not at the first completion
        except KeyError as exc:
            raise ValueError(f"gateway.reward: {exc.args[0]}") from None
        for name in self.task_kinds:
            why = self.refusal(get_kind(name))
            if why:
                raise ValueError(f"gateway: {why}")

    def refusal(self, kind: Any) -> str | None:
        """Why ``offer`` refuses tasks of ``kind`` (a ``TaskKind``), or None: not one of
        ``task_kinds`` (when set), or ``reward`` cannot score it (a reward of one kind; a hybrid
        reward routes every kind to its own)."""
        if self.task_kinds and kind.name not in self.task_kinds:
            return f"this gateway hands out {', '.join(self.task_kinds)} tasks, not {kind.name}"
        spec = get_reward(self.reward)
        if spec.scorer is not None and spec.task_kind != kind.scored_as:
            return (f"reward {self.reward!r} scores {spec.task_kind} tasks, not {kind.name} "
                    f"(use a hybrid reward, e.g. hybrid_agentic)")
        return None

    def check_offer(self, task: Any, n: int) -> None:
        """``offer``'s checks: ``TypeError`` for anything but a task of a registered kind,
        ``ValueError`` for a kind it refuses (``refusal``) or ``n < 1``."""
        why = self.refusal(kind_of(task))
        if why:
            raise ValueError(f"offer of {task.task_id}: {why}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"offer: n must be an int >= 1, got {n!r}")

    def check_complete(self, sql: Any, reward: Any) -> None:
        """``complete``'s checks: exactly one of ``sql`` (a string of valid Unicode: no lone
        surrogate) or ``reward`` (a number within ``[-client_reward_limit, client_reward_limit]``:
        never NaN, infinite, or too large for the learner's float32 advantages; an int of any size
        is compared exactly, never converted first -- only with ``client_rewards``, else
        ``NotAllowed``); ``BadInput`` otherwise."""
        if (sql is None) == (reward is None):
            raise BadInput("complete takes exactly one of 'sql' (the final SQL) or 'reward'")
        if reward is not None:
            if not self.client_rewards:
                raise NotAllowed("this job does not accept client rewards: send the final 'sql'")
            limit = self.client_reward_limit
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not -limit <= reward <= limit:
                shown = reward if not isinstance(reward, int) or abs(reward) < 10**30 else "an integer too large"
                raise BadInput(f"reward must be a finite number in [-{limit:g}, {limit:g}], got {shown!r}",
                               param="reward")
        elif not isinstance(sql, str):
            raise BadInput(f"sql must be a string, got {type(sql).__name__}", param="sql")
        else:
            try:
                sql.encode("utf-8")  # a lone surrogate ("\\ud800" in the JSON) is no text any database takes
            except UnicodeEncodeError as exc:
                raise BadInput(f"sql is not valid Unicode text: {exc.reason} at index {exc.start}",
                               param="sql") from None

    def check_claim(self, held: int) -> None:
        """A claim by a key holding ``held`` live rollouts (and claims in progress): ``TooManyLive``
        (429 + ``Retry-After``) at ``max_live_per_key``. One key cannot take every waiting rollout
        (and let them expire), nor hold more than that many SQL threads."""
        if self.max_live_per_key and held >= self.max_live_per_key:
            raise TooManyLive(f"this key holds {held} live rollouts, the most one key may "
                              f"(gateway.max_live_per_key); complete one first", self.retry_after_s)

    def handed_out(self) -> tuple[str, ...]:
        """The registered kinds ``offer`` takes (``refusal`` None), in registry order."""
        return tuple(k.name for k in kinds() if self.refusal(k) is None)

    def accepted(self, declared: Any) -> frozenset[str] | None:
        """What a claim that declares ``kinds`` (None: any kind) may be handed: the declared kinds
        this job hands out. ``BadInput`` (400, ``param: kinds``) for anything but a non-empty list
        of registered kind names (naming the known ones); ``KindsNotOffered`` (409) when the job
        hands out none of them -- declared kinds it does not hand out besides one it does are fine
        (a client that handles several kinds works against a job that trains on fewer)."""
        if declared is None:
            return None
        if isinstance(declared, (str, bytes)) or not isinstance(declared, (list, tuple)) or not all(
                isinstance(k, str) for k in declared):
            raise BadInput("kinds must be a list of task kind names", param="kinds")
        if not declared:
            raise BadInput("kinds must name at least one task kind (leave it out to accept any kind)",
                           param="kinds")
        known = [k.name for k in kinds()]
        unknown = [k for k in declared if k not in known]
        if unknown:
            raise BadInput(f"kinds: unknown task kind(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}",
                           param="kinds")
        offered = self.handed_out()
        accepted = frozenset(declared) & frozenset(offered)
        if not accepted:
            raise KindsNotOffered(f"this job hands out {', '.join(offered) or 'no'} tasks, none of the kinds "
                                  f"declared ({', '.join(declared)})", param="kinds")
        return accepted


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


def task_payload(task: Any, schema: str | None) -> dict[str, Any]:
    """The claim's ``task`` (docs/gateway.md): ``kind``, ``task_id``, ``database``, ``dialect``,
    ``schema`` (``CREATE TABLE`` text or None), ``job`` (the built-in agent's "Your job: ..."),
    ``prompt`` (the built-in agent's user message for it: ``TaskKind.user_prompt`` of the request),
    then the kind's ``payload`` fields. Everything is read from the unlabelled request
    (``TaskKind.request``), which holds no answer."""
    kind = kind_of(task)
    request = kind.request_type().from_task(task)
    out: dict[str, Any] = {"kind": kind.name, "task_id": request.task_id, "database": request.db_id,
                           "dialect": request.dialect, "schema": schema, "job": kind.job,
                           "prompt": kind.user_prompt(request)}
    out.update((f.name, f.value(request)) for f in kind.payload)
    return out


@dataclass(frozen=True)
class Claim:
    rollout_id: str
    group_id: str
    task: Any  # a task of a registered kind (sqlrl.tasks.kinds)
    deadline_s: float
    schema: str | None  # the database's CREATE TABLE statements in the task's dialect, if known

    def task_payload(self) -> dict[str, Any]:
        """What the client is shown of the task (``task_payload``)."""
        return task_payload(self.task, self.schema)


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
    setup_failed: int = 0  # rollouts failed because their task's setup SQL failed (counted in failed too)
