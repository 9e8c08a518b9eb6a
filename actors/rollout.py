"""Rollout workers: a ``sqlrl.agent.Agent`` -- a policy replica and ONE engine over it
(``PolicySpec.build``: ``make_engine(policy.backend)``), kept for the worker's life -- over sessions
from the worker's own pool partition (``sqlrl.db.source.PoolSessions``, the Ray pool's
``SessionSource``).

- ``RolloutWorker.rollout(tasks, seed_indexes)`` is ``sqlrl.agent.rollouts.roll_out`` on the
  worker's engine: every task at once, at most ``loop.max_concurrent_trajectories`` in flight,
  each leasing its session from this worker's shards as it starts (``PoolClient.lease_many``,
  the task's ``preprocess_sql`` applied) and releasing it as it ends. It never raises for a task:
  a refused lease or a failing loop gives ``stop_reason="error"`` trajectories with the message;
  a trajectory past ``loop.deadline_s`` is aborted in the engine and ends ``"timeout"``.
- ``update_weights(state_dict, version, policy)`` loads the learner's weights into the running
  engine under an ``UpdatePolicy`` (``drain``: the default); every trajectory carries the
  ``policy_version`` it was generated with, and each token the version that produced it.
- ``RolloutConfig(in_process=True)`` runs one worker in this process (no Ray) with the same code;
  otherwise ``n_workers`` Ray actors (``actors.group.ActorGroup``). ``RolloutGroup.rollout``
  routes tasks with ``sticky_routes`` (the samples of one task -- a GRPO group -- on ONE worker,
  for its engine's prefix cache; whole groups balanced) and sends each worker its share in one
  call with each task's index in the whole call (its seeds do not depend on the split). A worker
  that dies or does not answer within ``timeout_s`` yields error trajectories for its share,
  never a hang, and is restarted by Ray.
- The engine is one of the registry ``sqlrl.policy.backends.ENGINES`` (``PolicySpec.backend``):
  ``"hf"`` (``HFEngine``, CPU or GPU), ``"vllm"`` (``VLLMEngine``: vLLM's CPU build here, CUDA on
  GPUs -- unverified), ``"auto"``, the lock-step ``"hf-batched"``/``"vllm-batched"`` and
  ``"scripted"``. The GPU path is this same code with ``backend="vllm"`` and ``num_gpus`` set.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from actors.group import RAISED, TIMEOUT, ActorGroup, Failed
from sqlrl.agent.agent import Agent, AgentConfig, error_trajectories
from sqlrl.agent.loop import LoopConfig
from sqlrl.agent.rollouts import sticky_routes
from sqlrl.agent.trajectory import Trajectory
from sqlrl.db.source import PoolSessions
from sqlrl.policy.backends import BACKENDS
from sqlrl.policy.batched import BatchedEngine, as_engine
from sqlrl.policy.engine import UpdatePolicy
from sqlrl.policy.spec import PolicySpec

__all__ = ["BACKENDS", "PolicySpec", "PoolSessions", "RolloutConfig", "RolloutGroup", "RolloutWorker",
           "error_trajectories"]


@dataclass(frozen=True)
class RolloutConfig:
    policy: PolicySpec = field(default_factory=PolicySpec)  # model, backend (engine), dtype, device, options
    loop: LoopConfig = field(default_factory=LoopConfig)
    in_process: bool = False  # one worker in this process, no Ray
    n_workers: int = 1  # Ray workers (when not in_process)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources per worker
    timeout_s: float = 1800.0  # the longest the group waits for one worker's batch

    def __post_init__(self) -> None:
        if not self.in_process and (isinstance(self.n_workers, bool) or self.n_workers < 1):
            raise ValueError(f"n_workers must be >= 1, got {self.n_workers!r} "
                             "(in_process=True runs one worker in this process)")
        if not isinstance(self.policy, PolicySpec):
            raise ValueError(f"RolloutConfig.policy must be a PolicySpec, got {type(self.policy).__name__}")


class RolloutWorker:
    def __init__(self, index: int, config: RolloutConfig, pool_client: Any = None,
                 schemas: Mapping[str, Any] | None = None) -> None:
        self.index = index
        self.config = config
        self.pool = pool_client
        self.agent = Agent.build(  # the policy and ONE engine over it (make_engine)
            AgentConfig(policy=config.policy, loop=config.loop),
            sessions=PoolSessions(pool_client) if pool_client is not None else None,
            schemas=schemas)
        self._batches = 0

    # the agent's parts, for callers that inspect or swap them (benchmarks, tests)
    policy = property(lambda self: self.agent.policy)
    chat = property(lambda self: self.agent.chat_format)
    version = property(lambda self: self.agent.version)
    engine = property(lambda self: self.agent.backend)

    @property
    def backend(self) -> Any:
        """The batch backend under the engine (``HFEngine.backend``, ``BatchedEngine.backend``), for
        benchmarks and tests that call it directly; the engine itself when it has none (vLLM)."""
        from sqlrl.policy.hf_engine import HFEngine  # torch: only when asked

        engine = self.agent.backend
        return engine.backend if isinstance(engine, (HFEngine, BatchedEngine)) else engine

    @backend.setter
    def backend(self, backend: Any) -> None:
        """Generate with ``backend`` from now on: an ``AsyncEngine``, or a batch backend (its native
        engine, else the batching adapter: ``as_engine``). The engine it replaces is closed."""
        engine, _ = as_engine(backend)
        if engine is not self.agent.backend:
            self.agent.close()
        self.agent.backend = engine
        self.agent.version_map = {engine.policy_version: self.agent.version}

    def rollout(self, tasks: Sequence[Any], seed_indexes: Sequence[int] | None = None,
                loop: LoopConfig | None = None) -> list[Trajectory]:
        """Every task at once on this worker's engine (``sqlrl.agent.rollouts.roll_out``: at most
        ``loop.max_concurrent_trajectories`` in flight, a session leased per trajectory).
        ``seed_indexes``: each task's index in the whole call (turn seeds); ``loop``: this call's
        agent loop (mode, sampling, turns; default the worker's). Never raises for a task: a
        refused lease or a failing loop gives error trajectories."""
        self._batches += 1
        return self.agent.run(tasks, keys=[f"w{self.index}/b{self._batches}/{i}" for i in range(len(tasks))],
                              seed_indexes=seed_indexes, loop=loop)

    def load_checkpoint(self, spec: PolicySpec) -> int:
        """Serve checkpoint ``spec.model`` from the running engine (``Agent.load_checkpoint``: a
        ``ValueError`` when it is not of this engine's model family); returns the version (0)."""
        return self.agent.load_checkpoint(spec)

    def update_weights(self, state_dict: Mapping[str, Any], version: int,
                       policy: UpdatePolicy = UpdatePolicy.DRAIN) -> int:
        """Load the learner's weights (a full state dict) into the running engine under ``policy``;
        returns the version now served."""
        return self.agent.update_weights(state_dict, version, UpdatePolicy(policy))

    def get_version(self) -> int:
        return self.agent.version

    def close(self) -> None:
        """Close the engine (a vLLM engine's processes, an HF engine's thread); the worker is done."""
        self.agent.close()


class RolloutGroup:
    def __init__(self, config: RolloutConfig, pool: Any = None,
                 schemas: Mapping[str, Any] | None = None) -> None:
        """``pool``: a ``DBPoolGroup`` (worker *i* gets ``pool.client(i)``) or None (single mode)."""
        self.config = config
        self.workers = ActorGroup(RolloutWorker, in_process=config.in_process, num_cpus=config.num_cpus,
                                  num_gpus=config.num_gpus, resources=config.resources)
        n = 1 if config.in_process else config.n_workers
        self.workers.add({i: (i, config, pool.client(i) if pool else None, schemas) for i in range(n)})

    def with_loop(self, loop: LoopConfig) -> "RolloutGroup":
        """A view of this group whose ``rollout`` runs ``loop`` (another mode, temperature or seed)
        on the SAME workers and engines; shutting the view down shuts the workers down."""
        view = copy.copy(self)
        view.config = replace(self.config, loop=loop)
        return view

    def rollout(self, tasks: Sequence[Any]) -> list[Trajectory]:
        """One trajectory per task, in order: tasks split over the workers by ``sticky_routes`` (the
        samples of one task -- a GRPO group -- on one worker), each worker running its share at once
        with this group's ``config.loop``."""
        tasks = list(tasks)
        if not tasks:
            return []
        routes = sticky_routes(tasks, len(self.workers))
        chunks = {w: [i for i, r in enumerate(routes) if r == w] for w in sorted(set(routes))}
        answers = self.workers.fan_out(RolloutWorker.rollout,
                                       {w: ([tasks[i] for i in idx], idx, self.config.loop)
                                        for w, idx in chunks.items()},
                                       timeout_s=self.config.timeout_s, restart_late=True)
        out: list[Trajectory | None] = [None] * len(tasks)
        for w, values in answers.items():
            if isinstance(values, Failed):  # died or raised: its chunk; late: restarted, its chunk
                why = (f"did not answer within {self.config.timeout_s} s" if values.kind == TIMEOUT
                       else f"failed: {values.message}")
                values = error_trajectories([tasks[i] for i in chunks[w]], self.config.loop.mode,
                                            f"rollout worker {w} {why}")
            for i, v in zip(chunks[w], values):
                out[i] = v
        return out  # type: ignore[return-value]

    def update_weights(self, state_dict: Any, version: int, policy: UpdatePolicy = UpdatePolicy.DRAIN) -> None:
        """``state_dict``: a mapping, or an ObjectRef to one already in the object store (the
        learner's ``state_dict_ref()``), which Ray workers then read without another copy; each
        worker loads it into its running engine under ``policy`` (``UpdatePolicy``: drain, abort,
        continue). Raises when a worker could not load them."""
        policy = UpdatePolicy(policy)
        if self.workers.in_process != isinstance(state_dict, Mapping):  # a ref here, or a dict to Ray
            import ray

            state_dict = ray.get(state_dict) if self.workers.in_process else ray.put(dict(state_dict))
        answers = self.workers.call_all(RolloutWorker.update_weights, state_dict, version, policy,
                                        timeout_s=self.config.timeout_s)
        for w, answer in answers.items():
            if isinstance(answer, Failed):
                if answer.error is not None and answer.kind == RAISED:
                    raise answer.error
                raise RuntimeError(f"rollout worker {w} did not take the weights: {answer.message}")

    def load_checkpoint(self, spec: PolicySpec) -> None:
        """Every worker serves checkpoint ``spec.model`` from its running engine (no restart);
        ``ValueError`` when a worker cannot (another model family: start a new group instead)."""
        answers = self.workers.call_all(RolloutWorker.load_checkpoint, spec, timeout_s=self.config.timeout_s)
        for w, answer in answers.items():
            if isinstance(answer, Failed):
                if answer.error is not None and answer.kind == RAISED:
                    raise answer.error
                raise RuntimeError(f"rollout worker {w} did not load {spec.model}: {answer.message}")
        self.config = replace(self.config, policy=spec)

    def shutdown(self) -> None:
        self.workers.stop()
