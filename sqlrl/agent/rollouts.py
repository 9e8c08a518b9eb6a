"""The one rollout function: N trajectories at once on ONE async engine, sessions leased per trajectory.

    trajectories = roll_out(engine, chat_format, tasks, loop_config, sessions=source, schemas=schemas)
    trajectories = await aroll_out(...)                      # inside an event loop

Every rollout in sqlrl goes through here: the rollout workers (``actors/rollout.py``, which the
stage jobs' held-out evaluation, batch inference and GRPO steps call) and ``Agent.run``.

Guarantees:
- One trajectory per task, in order; all of them are coroutines on ``engine`` (an ``AsyncEngine``,
  or a sync batch backend wrapped for the call: ``AgentLoop``) and at most
  ``loop.max_concurrent_trajectories`` are in progress at once (None: all). A trajectory that ends
  frees its slot for the next one at once -- nobody waits for a batch or a round.
- In agentic mode each trajectory leases its session from ``sessions`` (a ``SessionSource``) when
  it starts -- one ``SessionRequest`` with the task's ``db_id``, ``dialect``, ``preprocess_sql``
  and ``keys[i]`` (a pool routes by it) -- and closes it when it ends, so at most
  ``max_concurrent_trajectories`` sessions are open; trajectories that start together share one
  ``open_many`` (the pool: one round trip per shard), so they also reach the engine together. A
  refused lease ends that trajectory ``"error"`` ("could not open sessions: ..."); the others go
  on (a refused shared ``open_many`` is retried one session at a time). ``execute_many`` of the source
  (the Ray pool's) batches tool calls that are ready together.
- It never raises for a task: no session source in agentic mode, or a failure of the loop itself,
  gives ``stop_reason="error"`` trajectories with the message (``error_trajectories``).
- Seeds: turn ``k`` of task ``i`` samples with ``turn_seed(loop.sampling.seed, seed_indexes[i], k)``
  (default ``seed_indexes[i] = i``): a caller that splits one call's tasks over several workers
  passes each task's index in the whole call, so its samples do not depend on the split.
- ``schemas[i]`` (or ``schemas[db_id]``) is the schema the prompt shows; a task's own ``schema``
  (an unlabelled request's) wins.

``sticky_routes(tasks, n)``: which of ``n`` rollout workers (engine replicas) runs each task, so
that the samples of one task -- a GRPO group: the same task repeated -- go to ONE worker (its
engine's prefix cache holds their shared prompt once), whole groups balanced by size.
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

from sqlrl.db.source import SessionRequest, SessionSource
from sqlrl.tasks.kinds import kind_of

from .loop import AgentLoop, LoopConfig
from .trajectory import Trajectory

__all__ = ["aroll_out", "error_trajectories", "roll_out", "sticky_routes"]


def error_trajectories(items: Sequence[Any], mode: str, message: str, version: int = 0
                       ) -> list[Trajectory]:
    return [Trajectory(task_id=t.task_id, mode=mode, messages=(), token_ids=(), loss_mask=(),
                       old_logprobs=(), prompt_length=0, turns=(), n_tool_calls=0,
                       n_tool_errors=0, n_malformed=0, submitted_sql=None, stop_reason="error",
                       policy_version=version, error=message) for t in items]


class _SourceLeases:
    """A ``SessionSource`` as the loop's per-trajectory ``Leases`` (``sqlrl.agent.toolrun``)."""

    def __init__(self, source: SessionSource, tasks: Sequence[Any], keys: Sequence[str]) -> None:
        self.source, self.tasks, self.keys = source, tasks, keys

    def open_many(self, indexes: Sequence[int]) -> list[Any]:
        return list(self.source.open_many([SessionRequest(
            self.tasks[i].db_id, self.tasks[i].dialect, kind_of(self.tasks[i]).scene_sql(self.tasks[i]),
            key=self.keys[i]) for i in indexes]))

    def close(self, index: int, session: Any) -> None:
        self.source.close_many([session])


async def aroll_out(engine: Any, chat_format: Any, tasks: Sequence[Any], loop: LoopConfig, *,
                    sessions: SessionSource | None = None,
                    schemas: Mapping[str, Any] | Sequence[Any] | None = None,
                    keys: Sequence[str] | None = None, seed_indexes: Sequence[int] | None = None,
                    version: int = 0, versions: Mapping[int, int] | None = None) -> list[Trajectory]:
    """Roll out every task once on ``engine`` (module docstring); ``version`` is the policy version
    the trajectories report, ``versions`` maps the engine's own weight versions to that numbering
    for each token (``Trajectory.token_versions``)."""
    tasks = list(tasks)
    if not tasks:
        return []
    if loop.mode == "agentic" and sessions is None:
        return error_trajectories(tasks, loop.mode, "agentic rollouts need a session source", version)
    keys = list(keys) if keys is not None else [str(i) for i in range(len(tasks))]
    if isinstance(schemas, Mapping) or schemas is None:
        by_db = dict(schemas or {})
        shown = [getattr(t, "schema", None) or by_db.get(t.db_id) for t in tasks]
    else:
        shown = [getattr(t, "schema", None) or s for t, s in zip(tasks, schemas)]
    try:
        agent_loop = AgentLoop(tasks, None, engine, chat_format, loop, schemas=shown, policy_version=version,
                               execute_many=getattr(sessions, "execute_many", None),
                               leases=None if sessions is None else _SourceLeases(sessions, tasks, keys),
                               seed_indexes=seed_indexes, versions=versions)
        return await agent_loop.arun()
    except Exception as exc:  # a bug in a layer below: typed results, never lost tasks
        return error_trajectories(tasks, loop.mode, f"{type(exc).__name__}: {exc}", version)


def roll_out(engine: Any, chat_format: Any, tasks: Sequence[Any], loop: LoopConfig, **options: Any
             ) -> list[Trajectory]:
    """``aroll_out`` from sync code (not inside a running event loop)."""
    from sqlrl.policy.engine import run_sync

    return run_sync(aroll_out(engine, chat_format, tasks, loop, **options))


def sticky_routes(tasks: Sequence[Any], n: int, key: Any = None) -> list[int]:
    """The worker (0..n-1) of each task: tasks with the same ``key(task)`` (default: the task id,
    so a GRPO group) go to one worker; groups, in order of first appearance, each go to the worker
    with the fewest trajectories so far (the lowest index on a tie). Deterministic."""
    if n < 1:
        raise ValueError(f"sticky_routes needs n >= 1 workers, got {n}")
    key = key or (lambda t: t.task_id)
    sizes: dict[Hashable, int] = {}
    for t in tasks:
        k = key(t)
        sizes[k] = sizes.get(k, 0) + 1
    load = [0] * n
    where: dict[Hashable, int] = {}
    for k, size in sizes.items():
        w = min(range(n), key=lambda i: (load[i], i))
        where[k] = w
        load[w] += size
    return [where[key(t)] for t in tasks]
