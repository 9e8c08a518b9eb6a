"""The agent-training job's config and step loop (Ray-free): offer -> wait -> drain -> build -> update -> push.

``jobs/train_agent.py`` wires the pieces (DB pool, learner, engine, gateway) and calls
``run_steps``; everything here is a function of the two small interfaces it is given
(``StepGateway``, ``StepLearner``), so tests drive it with in-process ones.

Per step ``s`` (``run_steps``):

1. ``tasks_per_step`` tasks (the step's slice of the task list, cycling) are offered, each to
   ``group_size`` rollouts under the group id ``s<step>/g<i>`` (a GRPO group); after the last
   step's offers the gateway is told ``finish()`` (clients then get 410 once the work is claimed).
2. ``gateway.wait_step(step_timeout_s)``: until every offered rollout was claimed and ended
   (completed by its client, or expired at its per-rollout deadline, or failed). This waits on the
   gateway's state changes, never on a guessed time; ``step_timeout_s`` (None: no limit) bounds a
   step with no client at all, and running past it is a ``StepTimeout`` naming what was left.
3. ``drain()``: the step's ``RolloutTrace`` values -> ``build_step`` (``sqlrl.gateway.train``: one
   verl GRPO advantage per rollout, tags, unfinished rollouts, group filters).
4. When a batch is left: ``updates_per_batch`` ``learner.step(batch, "grpo", loss)`` calls, then the
   learner's weights go to the gateway's engine with ``update_policy`` (drain / abort / continue);
   calls arriving meanwhile wait or get 429 (``during_update``). No batch: no update, no push (the
   metrics say why: ``groups_signal`` / ``groups_trained``).
5. One metrics row: ``build_step``'s line, the learner's (``loss``, ``grad_norm``, ... prefixed
   ``learner_``), the gateway's counters (``GatewayStats`` prefixed ``gateway_``), the phase times
   (``time_rollout_s``, ``time_update_s``, ``time_sync_s``) and ``policy_version``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Protocol, Sequence

from sqlrl.learn.config import GRPOConfig
from sqlrl.learn.optim import OptimConfig
from sqlrl.policy.engine import UpdatePolicy

from .contract import GatewayConfig, GatewayStats
from .sequences import SequenceConfig
from .trace import RolloutTrace
from .train import TraceTrainConfig, build_step

__all__ = ["AgentJobConfig", "DataSpec", "StepGateway", "StepLearner", "StepTimeout", "run_steps", "step_tasks"]


@dataclass(frozen=True)
class DataSpec:
    """The embedded text-to-SQL tasks (``sqlrl.synth``'s generated domains), generated on first use."""

    synth_dir: str = "runs/data/agent_synth"
    domains: tuple[str, ...] = ("shop",)
    n_per_domain: int = 24
    split: str = "train"
    seed: int = 0
    size: int = 0  # tasks used (0: every task of the split), shuffled with ``seed``


@dataclass(frozen=True)
class AgentJobConfig:
    """``jobs/configs/agent.yaml``: the job's whole config (one place; every key documented there)."""

    run_dir: str = "runs/agent"
    model: str = "tiny"  # the policy the gateway serves and the learner trains: a checkpoint folder or a named model
    backend: str = "hf"  # the gateway's engine (sqlrl.policy.backends: hf, vllm, auto)
    max_batch: int = 8  # sequences the engine generates at once
    steps: int = 2
    tasks_per_step: int = 2
    group_size: int = 4
    rollout_deadline_s: float = 300.0  # a claimed rollout must complete within this long, else it expires
    step_timeout_s: float | None = None  # None: wait for clients as long as it takes
    train_tags: tuple[str, ...] | None = None  # None: every tagged call trains
    untagged: str = "train"  # train | skip
    unfinished: str = "drop"  # drop | zero: what an expired / failed rollout counts as
    max_length: int | None = 4096
    min_group_size: int = 2
    drop_equal_groups: bool = True
    updates_per_batch: int = 1
    update_policy: str = "drain"  # drain | abort | continue (the engine's UpdatePolicy)
    during_update: str = "wait"  # wait | reject (429 + Retry-After)
    client_rewards: bool = False  # True: complete may carry {"reward": x} (non-SQL agents)
    reward: str = "hybrid_agentic"  # the reward registry's name the Judge scores the final SQL with
    retry_after_s: int = 1
    api_keys: tuple[str, ...] = ()
    api_keys_env: str = "SQLRL_GATEWAY_API_KEYS"
    host: str = "127.0.0.1"  # 0.0.0.0: serve other machines
    port: int = 0  # 0: any free port
    tick_s: float = 1.0  # the gateway's expiry / gauge period
    ray: bool = False  # True: the learner ranks and DB pool as Ray actors (ray job submit sets RAY_ADDRESS)
    learner_ranks: int = 1
    placement: str = "cpu"  # deploy/placement.yaml profile (what the actors ask Ray for)
    seed: int = 0
    loss: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, micro_batch_size=1))
    data: DataSpec = field(default_factory=DataSpec)

    def __post_init__(self) -> None:
        for name in ("steps", "tasks_per_step", "group_size", "updates_per_batch", "learner_ranks", "max_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if self.step_timeout_s is not None and not self.step_timeout_s > 0:
            raise ValueError(f"step_timeout_s must be > 0 or null, got {self.step_timeout_s!r}")
        try:
            UpdatePolicy(self.update_policy)
        except ValueError:
            raise ValueError(f"update_policy {self.update_policy!r} is not one of "
                             f"{', '.join(p.value for p in UpdatePolicy)}") from None
        self.train_config()  # tags, unfinished, group sizes: refused here, before anything starts
        self.gateway_config()

    def train_config(self, turn_end_ids: Sequence[int] = ()) -> TraceTrainConfig:
        return TraceTrainConfig(SequenceConfig(train_tags=self.train_tags, untagged=self.untagged,
                                               unfinished=self.unfinished, max_length=self.max_length,
                                               turn_end_ids=tuple(turn_end_ids)),
                                min_group_size=self.min_group_size, drop_equal_groups=self.drop_equal_groups)

    def gateway_config(self) -> GatewayConfig:
        return GatewayConfig(deadline_s=self.rollout_deadline_s, client_rewards=self.client_rewards,
                             reward=self.reward, retry_after_s=self.retry_after_s, during_update=self.during_update)


class StepTimeout(RuntimeError):
    """A step's rollouts did not all end within ``step_timeout_s``."""


class StepGateway(Protocol):
    """What the loop needs of the gateway (``jobs.train_agent``'s in-process host)."""

    def offer(self, group_id: str, task: Any, n: int) -> None: ...

    def finish(self) -> None: ...

    def wait_step(self, timeout: float | None) -> bool: ...  # every offered rollout ended

    def drain(self) -> list[RolloutTrace]: ...

    def stats(self) -> GatewayStats: ...

    def update_weights(self, weights: Mapping[str, Any], policy: str) -> int: ...


class StepLearner(Protocol):
    def step(self, batch: Any, loss: str, loss_cfg: Any) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...


def step_tasks(tasks: Sequence[Any], step: int, per_step: int) -> list[Any]:
    """Step ``step``'s tasks: the next ``per_step`` of the list, cycling."""
    if not tasks:
        raise ValueError("no tasks to train on")
    return [tasks[(step * per_step + i) % len(tasks)] for i in range(per_step)]


def _stats_row(stats: GatewayStats) -> dict[str, Any]:
    return {f"gateway_{f.name}": getattr(stats, f.name) for f in fields(stats)}


def run_steps(cfg: AgentJobConfig, tasks: Sequence[Any], gateway: StepGateway, learner: StepLearner, *,
              pad_id: int, turn_end_ids: Sequence[int] = (), log: Callable[[int, dict], None] = lambda s, m: None,
              rewards: Callable[[list[RolloutTrace]], list[RolloutTrace]] | None = None) -> list[dict[str, Any]]:
    """``cfg.steps`` steps (module docstring); returns each step's metrics row (also ``log``ged).
    ``rewards``: applied to a step's traces before ``build_step`` (tests only: giving a random
    model's all-zero groups a signal, as tests/gateway/test_seq_e2e.py does); None in the job."""
    train_cfg = cfg.train_config(turn_end_ids)
    history: list[dict[str, Any]] = []
    version = 0
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        for i, task in enumerate(step_tasks(tasks, step, cfg.tasks_per_step)):
            gateway.offer(f"s{step}/g{i}", task, cfg.group_size)
        if step == cfg.steps - 1:
            gateway.finish()
        if not gateway.wait_step(cfg.step_timeout_s):
            s = gateway.stats()
            raise StepTimeout(f"step {step}: {s.waiting} rollout(s) never claimed and {s.active} still live "
                              f"after step_timeout_s={cfg.step_timeout_s}")
        traces = gateway.drain()
        if rewards is not None:
            traces = rewards(traces)
        t1 = time.perf_counter()
        build = build_step(traces, train_cfg, cfg.loss, pad_id=pad_id)
        learned: dict[str, Any] = {}
        t2 = t3 = t1
        if build.batch is not None:
            for _ in range(cfg.updates_per_batch):
                learned = dict(learner.step(build.batch, "grpo", cfg.loss))
            t2 = time.perf_counter()
            version = gateway.update_weights(learner.state_dict(), cfg.update_policy)
            t3 = time.perf_counter()
        row = {**build.metrics, **{f"learner_{k}": v for k, v in learned.items()},
               **_stats_row(gateway.stats()), "updated": build.batch is not None, "policy_version": version,
               "time_rollout_s": t1 - t0, "time_update_s": t2 - t1, "time_sync_s": t3 - t2}
        log(step, row)
        history.append(row)
    return history
