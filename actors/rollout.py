"""Rollout workers: a policy replica + the agent loop + sessions from the worker's own pool
partition (thin: the loop is ``sqlrl.agent``, the model and backends ``sqlrl.policy``).

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
- Backends are a registry (``BACKENDS``): ``"hf"`` (transformers, CPU or GPU) and ``"vllm"`` (GPU
  machines only — unverified here, see sqlrl/policy/vllm_backend.py). The GPU path is this same
  code with ``backend="vllm"`` and ``num_gpus`` set.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from actors.db_pool import LeasedSession
from sqlrl.agent.chat_format import HFChatFormat
from sqlrl.agent.loop import AgentLoop, LoopConfig
from sqlrl.agent.trajectory import Trajectory


def _hf(policy: Any) -> Any:
    from sqlrl.policy.hf_backend import HFBackend

    return HFBackend(policy)


def _vllm(policy: Any) -> Any:
    from sqlrl.policy.vllm_backend import VLLMBackend

    return VLLMBackend(policy.path)


BACKENDS: dict[str, Callable[[Any], Any]] = {"hf": _hf, "vllm": _vllm}


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


def error_trajectories(tasks: Sequence[Any], mode: str, message: str, version: int = 0
                       ) -> list[Trajectory]:
    return [Trajectory(task_id=t.task_id, mode=mode, messages=(), token_ids=(), loss_mask=(),
                       old_logprobs=(), prompt_length=0, turns=(), n_tool_calls=0,
                       n_tool_errors=0, n_malformed=0, submitted_sql=None, stop_reason="error",
                       policy_version=version, error=message) for t in tasks]


class RolloutWorker:
    def __init__(self, index: int, config: RolloutConfig, pool_client: Any = None,
                 schemas: Mapping[str, Any] | None = None) -> None:
        from sqlrl.policy.load import load_policy

        self.index = index
        self.config = config
        self.pool = pool_client
        self.schemas = dict(schemas or {})
        self.policy = load_policy(config.model, dtype=config.dtype)
        self.backend = BACKENDS[config.backend](self.policy)
        self.chat = HFChatFormat(self.policy.tokenizer)
        self.version = 0
        self._batches = 0

    def rollout(self, tasks: Sequence[Any]) -> list[Trajectory]:
        mode = self.config.loop.mode
        if not tasks:
            return []
        self._batches += 1
        leases: list[Any] = []
        try:
            if mode == "agentic":
                if self.pool is None:
                    return error_trajectories(tasks, mode, "agentic rollouts need a DB pool client",
                                              self.version)
                keys = [f"w{self.index}/b{self._batches}/{i}" for i in range(len(tasks))]
                try:
                    leases = self.pool.lease_many([(t.db_id, t.dialect, k, tuple(getattr(t, "preprocess_sql", ())))
                                                   for t, k in zip(tasks, keys)])
                except Exception as exc:  # a LeaseError: the batch cannot start
                    return error_trajectories(tasks, mode, f"could not lease sessions: {exc}",
                                              self.version)
                sessions: list[Any] | None = [LeasedSession(self.pool, l) for l in leases]
            else:
                sessions = None
            try:
                loop = AgentLoop(tasks, sessions, self.backend, self.chat, self.config.loop,
                                 schemas=self.schemas, policy_version=self.version)
                return loop.run()
            except Exception as exc:  # a bug in a layer below: typed results, never lost tasks
                return error_trajectories(tasks, mode, f"{type(exc).__name__}: {exc}", self.version)
        finally:
            if leases:
                self.pool.release_many(leases)

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> int:
        """Load the learner's weights (a full state dict); returns the version now served."""
        missing, unexpected = self.policy.model.load_state_dict(dict(state_dict), strict=False)
        if missing or unexpected:
            raise ValueError(f"weights do not fit this model: missing {list(missing)[:5]}, "
                             f"unexpected {list(unexpected)[:5]}")
        getattr(self.backend, "clear_cache", lambda: None)()  # cached KV is of the old weights
        self.version = version
        return version

    def get_version(self) -> int:
        return self.version


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
