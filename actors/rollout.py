"""Rollout workers: a ``sqlrl.agent.Agent`` (policy replica + backend + chat format + loop, the
same composition serving uses) over sessions from the worker's own pool partition
(``PoolSessions``, the Ray pool's ``SessionSource``).

- ``RolloutWorker.rollout(tasks)`` leases one session per task from this worker's shards
  (``DBPoolClient.lease_many``, one round trip per shard, the task's ``preprocess_sql`` applied),
  runs ``AgentLoop`` over the whole batch (one batched generation per turn), and releases every
  session in ``finally`` (``release_many``). It never raises for a task: a refused lease or a
  failing loop gives that batch ``stop_reason="error"`` trajectories with the message; a
  trajectory past ``loop.deadline_s`` ends ``"timeout"`` (its session is released like the others).
- ``update_weights(state_dict, version)`` loads new weights (the learner's); every trajectory
  carries the ``policy_version`` it was generated with, so stale-policy data is visible.
- ``RolloutGroup(n_workers=0)`` runs one worker in-process (no Ray) with the same code. With Ray,
  tasks are split into contiguous chunks (a GRPO group stays on one worker when the group size
  divides the chunk); a worker that dies or does not answer within ``timeout_s`` yields error
  trajectories for its chunk, never a hang, and is restarted by Ray.
- Backends are the registry ``sqlrl.policy.backends.BACKENDS``: ``"hf"`` (transformers, CPU or
  GPU), ``"vllm"`` (GPU machines only — unverified here, see sqlrl/policy/vllm_backend.py) and
  ``"scripted"``. The GPU path is this same code with ``backend="vllm"`` and ``num_gpus`` set.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from actors.db_pool import LeasedSession
from sqlrl.agent.agent import Agent, AgentConfig, error_trajectories
from sqlrl.agent.loop import LoopConfig
from sqlrl.agent.trajectory import Trajectory
from sqlrl.policy.backends import BACKENDS

__all__ = ["BACKENDS", "PoolSessions", "RolloutConfig", "RolloutGroup", "RolloutWorker",
           "error_trajectories"]


@dataclass(frozen=True)
class RolloutConfig:
    model: str = "tiny"  # a sqlrl.policy.load MODELS name or a checkpoint folder
    dtype: str = "float32"
    backend: str = "hf"
    loop: LoopConfig = field(default_factory=LoopConfig)
    n_workers: int = 0  # 0: in-process
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources per worker
    timeout_s: float = 1800.0  # the longest the group waits for one worker's batch

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; known: {', '.join(BACKENDS)}")


class PoolSessions:
    """The Ray pool as the agent's ``SessionSource``: one lease per item from this worker's shards
    (``lease_many``: one round trip per shard, the item's ``preprocess_sql`` applied), a round's
    SQL in one ``execute_many`` (one round trip per shard), all released together
    (``release_many``)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def open_many(self, items: Sequence[Any], keys: Sequence[str]) -> list[LeasedSession]:
        leases = self.client.lease_many([(t.db_id, t.dialect, k, tuple(getattr(t, "preprocess_sql", ())))
                                         for t, k in zip(items, keys)])
        return [LeasedSession(self.client, lease) for lease in leases]

    def close_many(self, sessions: Sequence[LeasedSession]) -> None:
        self.client.release_many([s.lease for s in sessions])

    def execute_many(self, pairs: Sequence[tuple[LeasedSession, str]]) -> list[Any]:
        """A round's execute_sql calls: one ``submit_many`` per shard (never raises)."""
        return self.client.execute_many([(s.lease, sql) for s, sql in pairs])


class RolloutWorker:
    def __init__(self, index: int, config: RolloutConfig, pool_client: Any = None,
                 schemas: Mapping[str, Any] | None = None) -> None:
        self.index = index
        self.config = config
        self.pool = pool_client
        self.agent = Agent.build(
            AgentConfig(model=config.model, dtype=config.dtype, backend=config.backend,
                        loop=config.loop),
            sessions=PoolSessions(pool_client) if pool_client is not None else None,
            schemas=schemas)
        self._batches = 0

    # the agent's parts, for callers that inspect or swap them (benchmarks, tests)
    policy = property(lambda self: self.agent.policy)
    chat = property(lambda self: self.agent.chat_format)
    version = property(lambda self: self.agent.version)

    @property
    def backend(self) -> Any:
        return self.agent.backend

    @backend.setter
    def backend(self, backend: Any) -> None:
        self.agent.backend = backend

    def rollout(self, tasks: Sequence[Any]) -> list[Trajectory]:
        """Never raises for a task: a refused lease or a failing loop gives error trajectories."""
        self._batches += 1
        return self.agent.run(tasks, keys=[f"w{self.index}/b{self._batches}/{i}"
                                           for i in range(len(tasks))])

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> int:
        """Load the learner's weights (a full state dict); returns the version now served."""
        return self.agent.update_weights(state_dict, version)

    def get_version(self) -> int:
        return self.agent.version


class RolloutGroup:
    def __init__(self, config: RolloutConfig, pool: Any = None,
                 schemas: Mapping[str, Any] | None = None) -> None:
        """``pool``: a ``DBPoolGroup`` (worker *i* gets ``pool.client(i)``) or None (single mode)."""
        self.config = config
        if config.n_workers == 0:
            self._local = RolloutWorker(0, config, pool.client(0) if pool else None, schemas)
            self.workers: list[Any] = []
            return
        import ray

        remote = ray.remote(RolloutWorker).options(
            num_cpus=config.num_cpus, num_gpus=config.num_gpus, resources=dict(config.resources) or None,
            max_restarts=-1, max_task_retries=0)
        self.workers = [remote.remote(i, config, pool.client(i) if pool else None, schemas)
                        for i in range(config.n_workers)]

    def rollout(self, tasks: Sequence[Any]) -> list[Trajectory]:
        tasks = list(tasks)
        if not self.workers:
            return self._local.rollout(tasks)
        import ray

        n = len(self.workers)
        size = -(-len(tasks) // n)
        chunks = [(w, list(range(w * size, min(len(tasks), (w + 1) * size)))) for w in range(n)]
        refs = {self.workers[w].rollout.remote([tasks[i] for i in idx]): (w, idx)
                for w, idx in chunks if idx}
        out: list[Trajectory | None] = [None] * len(tasks)
        deadline = time.monotonic() + self.config.timeout_s
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1,
                                      timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            w, idx = refs[ready[0]]
            try:
                values = ray.get(ready[0])
            except Exception as exc:  # the worker died
                values = error_trajectories([tasks[i] for i in idx], self.config.loop.mode,
                                            f"rollout worker {w} failed: {type(exc).__name__}: {exc}")
            for i, v in zip(idx, values):
                out[i] = v
        for ref in pending:  # no answer in time: restart the worker, report its chunk
            w, idx = refs[ref]
            ray.kill(self.workers[w], no_restart=False)
            for i, v in zip(idx, error_trajectories([tasks[i] for i in idx], self.config.loop.mode,
                                                    f"rollout worker {w} did not answer within "
                                                    f"{self.config.timeout_s} s")):
                out[i] = v
        return out  # type: ignore[return-value]

    def update_weights(self, state_dict: Any, version: int) -> None:
        """``state_dict``: a mapping, or an ObjectRef to one already in the object store (the
        learner's ``state_dict_ref()``), which Ray workers then read without another copy."""
        if not self.workers:
            if not isinstance(state_dict, Mapping):
                import ray

                state_dict = ray.get(state_dict)
            self._local.update_weights(state_dict, version)
            return
        import ray

        ref = ray.put(dict(state_dict)) if isinstance(state_dict, Mapping) else state_dict
        ray.get([w.update_weights.remote(ref, version) for w in self.workers])

    def shutdown(self) -> None:
        if self.workers:
            import ray

            for w in self.workers:
                ray.kill(w, no_restart=True)
            self.workers = []
