"""The agent-training job's config and step loop (Ray-free): offer -> wait -> drain -> build -> update -> push.

``jobs/train_agent.py`` wires the pieces (DB pool, learner, engine, gateway) and calls
``run_steps``; everything here is a function of the two small interfaces it is given
(``StepGateway``, ``StepLearner``), so tests drive it with in-process ones.

Per step ``s`` (``run_steps``):

1. A draw: the next ``tasks_per_step`` tasks of the list (a cursor, cycling) are offered, each to
   ``group_size`` rollouts under the group id ``s<step>/g<i>`` (a GRPO group; ``i`` counts on
   across the step's draws).
2. ``settle_groups``: ``gateway.wait_step(step_timeout_s)`` until every offered rollout was
   claimed and ended (completed by its client, or expired at its per-rollout deadline, or failed).
   This waits on the gateway's state changes, never on a guessed time; ``step_timeout_s`` (None:
   no limit) bounds a step with no client at all, and running past it is a ``StepTimeout`` naming
   what was left. Then ``drain()``; with ``redraws: N`` a group's expired / failed rollouts (a dead
   client) are offered again -- same task, same group -- at most N per group per step, and waited
   for; the replaced traces are counted (``redrawn``), not trained. A rollout whose task's setup SQL
   failed (``RolloutTrace.setup_failed``: the gateway dropped the task's waiting rollouts with it)
   is not redrawn: the task is out of this step, counted in ``failed`` and ``setup_failed``.
3. Dynamic sampling (``sampling_rounds > 1``, as the built-in GRPO loop's ``rl.sampling_rounds``):
   while fewer than ``tasks_per_step`` groups would train (``trained_groups``: enough members and,
   with ``drop_equal_groups``, unequal rewards -- ``sqlrl.learn.groups.informative_rows``), draw
   again (step 1 with the next tasks), at most ``sampling_rounds`` draws. The gateway is told
   ``finish()`` (clients then get 410 once the waiting rollouts are claimed) as soon as no more
   offers can come: right after the last step's last possible draw is offered when ``redraws`` is
   0, else after the last step's last draw has settled.
4. ``build_step`` on every counted trace of the step (``sqlrl.gateway.train``: one verl GRPO
   advantage per rollout, tags, unfinished rollouts, group filters).
5. When a batch is left: ``updates_per_batch`` ``learner.step(batch, "grpo", loss)`` calls, then the
   learner's weights go to the gateway's engine with ``update_policy`` (drain / abort / continue);
   calls arriving meanwhile wait or get 429 (``during_update``). No batch: no update, no push (the
   metrics say why: ``groups_signal`` / ``groups_trained``).
6. One metrics row: ``build_step``'s line, ``redrawn`` and ``sampling_draws``, the learner's
   (``loss``, ``grad_norm``, ... prefixed ``learner_``), the gateway's counters (``GatewayStats``
   prefixed ``gateway_``, counted from this gateway's start), the phase times (``time_rollout_s``,
   ``time_update_s``, ``time_sync_s``) and ``policy_version``.
7. With ``checkpoints`` (``StepCheckpoints``: ``sqlrl.learn.resume.Checkpoints`` through
   ``job_checkpoints(cfg)``, or a stage's ``jobs.train.StageCheckpoints``): after the step,
   ``checkpoints.after`` saves the learner (weights, optimizer, scheduler, RNG) with the loop's
   ``StepsState`` (steps done, task cursor, the task order, the policy version the gateway serves,
   the metrics rows so far) every ``checkpoint.every_steps`` steps.

**Resume** (``resume_steps(checkpoints, learner)`` before the gateway starts, then
``run_steps(..., start=)``): the learner holds the newest checkpoint's state, and the loop goes on
at its next step: the tasks in the recorded order from the recorded cursor (a task trained before
is not offered again), group ids ``s<step>/g<i>`` as an unstopped run's, and -- before the first
offer -- the learner's weights go to the (new) gateway's engine as the recorded policy version
(``update_weights(..., version=)``: calls are recorded under it, the next push is version + 1).
**A step is the unit of resume**: rollouts in flight when the job stopped (claimed or ended, in a
step not checkpointed) are lost with its gateway; their step is offered again from the start. With
the same config and seeds and rollouts that come out the same (a deterministic engine and clients)
the resumed job ends with the weights of a run never stopped; with sampling, the redone steps'
samples are new ones, as in any rerun. A resume with another config is refused (``ResumeRefused``,
one line naming the keys, before anything is loaded; ``RESUME_ANY_WAY`` may change); no checkpoint:
from step 0, saying so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Protocol, Sequence

from sqlrl.config import rename_keys
from sqlrl.learn.config import GRPOConfig
from sqlrl.learn.fsdp import precision_name
from sqlrl.learn.optim import OptimConfig
from sqlrl.rl.update import repeat_steps
from sqlrl.learn.resume import CheckpointSettings
from sqlrl.policy.engine import UpdatePolicy
from sqlrl.policy.spec import PolicySpec

from .contract import GatewayConfig, GatewayStats
from .resume import RESUME_ANY_WAY, StepCheckpoints, StepsState, job_checkpoints, resume_steps
from .sequences import SequenceConfig
from .trace import RolloutTrace
from .train import TraceTrainConfig, build_step, trained_groups

__all__ = ["AgentJobConfig", "DataSpec", "RESUME_ANY_WAY", "StepCheckpoints", "StepGateway", "StepLearner",
           "StepTimeout", "StepsState", "draw_tasks", "job_checkpoints", "resume_steps", "run_steps",
           "settle_groups", "step_tasks"]


GATEWAY_HOSTS = ("process", "actor")  # where the gateway runs: jobs.train_agent's registry has one entry each


@dataclass(frozen=True)
class DataSpec:
    """The embedded tasks (``sqlrl.synth``'s generated domains: ``<kind>_<split>.jsonl``), generated on
    first use. ``kinds``: the task kinds the job trains on (``sqlrl.tasks.kinds`` names: ``text2sql``,
    ``critic`` -- debugging tasks made by verified bug injection); the gateway hands out only these."""

    synth_dir: str = "runs/data/agent_synth"
    domains: tuple[str, ...] = ("shop",)
    n_per_domain: int = 24
    split: str = "train"
    seed: int = 0
    size: int = 0  # tasks used (0: every task of the split), shuffled with ``seed``
    kinds: tuple[str, ...] = ("text2sql",)

    def __post_init__(self) -> None:
        from sqlrl.tasks.kinds import get_kind

        if not self.kinds or isinstance(self.kinds, str):
            raise ValueError(f"data.kinds must be a non-empty list of task kinds, got {self.kinds!r}")
        for name in self.kinds:
            try:
                get_kind(name)
            except KeyError as exc:
                raise ValueError(f"data.kinds: {exc.args[0]}") from None


@dataclass(frozen=True)
class AgentJobConfig:
    """``jobs/configs/agent.yaml``: the job's whole config (one place; every key documented there)."""

    run_dir: str = "runs/agent"
    # The policy the gateway serves and the learner trains (sqlrl.policy.spec.PolicySpec, as serving's
    # models.NAME.policy): model (a checkpoint folder or a named model), backend (the gateway's engine:
    # hf, vllm, auto), dtype (the engine's weights), device, engine_options.
    policy: PolicySpec = field(default_factory=lambda: PolicySpec("tiny", backend="hf"))
    max_batch_size: int = 8  # sequences the gateway's engine runs at once (hf max_batch, vLLM max_num_seqs)
    # The learner's precision (as a stage's model.mixed_precision): float32, or bfloat16 (fp32 weights
    # and Adam state); policy.dtype is the engine's alone.
    mixed_precision: str = "float32"
    steps: int = 2
    tasks_per_step: int = 2
    group_size: int = 4
    rollout_deadline_s: float = 300.0  # a claimed rollout must complete within this long, else it expires
    step_timeout_s: float | None = None  # None: wait for clients as long as it takes
    train_tags: tuple[str, ...] | None = None  # None: every tagged call trains
    untagged: str = "train"  # train | skip
    unfinished: str = "drop"  # drop | zero: what an expired / failed rollout counts as
    redraws: int = 0  # replacement rollouts a group may get per step for its expired / failed ones (0: none)
    sampling_rounds: int = 1  # > 1: dynamic sampling -- draw more groups until tasks_per_step groups train
    gateway_host: str | None = None  # process | actor (jobs.train_agent.GATEWAY_HOSTS); None: actor with ray=true
    gateway_max_restarts: int | None = None  # Ray restarts of the gateway actor; None: 3 with the actor, else 0
    gateway_restart_timeout_s: float = 300.0  # how long the driver waits for a restarted gateway actor
    max_length: int | None = 4096
    min_group_size: int = 2
    drop_equal_groups: bool = True
    updates_per_batch: int = 1
    update_policy: str = "drain"  # drain | abort | continue (the engine's UpdatePolicy)
    during_update: str = "wait"  # wait | reject (429 + Retry-After)
    client_rewards: bool = False  # True: complete may carry {"reward": x} (non-SQL agents)
    reward: str = "hybrid_agentic"  # the reward registry's name the Judge scores the final SQL with
    retry_after_s: int = 1
    max_live_per_key: int = 0  # live rollouts one API key may hold (429 beyond); 0: no cap
    api_keys: tuple[str, ...] = ()
    api_keys_env: str = "SQLRL_GATEWAY_API_KEYS"
    host: str = "127.0.0.1"  # 0.0.0.0: serve other machines
    port: int = 0  # 0: any free port
    tick_s: float = 1.0  # the gateway's expiry / gauge period
    ray: bool = False  # True: the learner ranks and DB pool as Ray actors (ray job submit sets RAY_ADDRESS)
    learner_ranks: int = 1
    placement: str = "cpu"  # deploy/placement.yaml profile (what the actors ask Ray for)
    seed: int = 0
    # every checkpoint.every_steps steps the whole state goes to <run_dir>/checkpoints (0: final/ only);
    # resume: true continues a stopped job from the newest (same config), else step 0
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    resume: bool = False
    loss: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, micro_batch_size=1))
    data: DataSpec = field(default_factory=DataSpec)

    def __post_init__(self) -> None:
        for name in ("steps", "tasks_per_step", "group_size", "updates_per_batch", "learner_ranks",
                     "max_batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if isinstance(self.redraws, bool) or not isinstance(self.redraws, int) or self.redraws < 0:
            raise ValueError(f"redraws must be an int >= 0, got {self.redraws!r}")
        if isinstance(self.sampling_rounds, bool) or not isinstance(self.sampling_rounds, int) or self.sampling_rounds < 1:
            raise ValueError(f"sampling_rounds must be an int >= 1, got {self.sampling_rounds!r}")
        if self.sampling_rounds > 1 and not self.drop_equal_groups:
            raise ValueError("sampling_rounds > 1 draws more groups to replace those with equal rewards: "
                             "it needs drop_equal_groups: true")
        if self.gateway_host is not None and self.gateway_host not in GATEWAY_HOSTS:
            raise ValueError(f"gateway_host {self.gateway_host!r} is not one of {', '.join(GATEWAY_HOSTS)} (or null)")
        if self.host_kind == "actor" and not self.ray:
            raise ValueError("gateway_host: actor needs ray: true (the actor's DB sessions are the Ray pool's)")
        m = self.gateway_max_restarts
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
            raise ValueError(f"gateway_max_restarts must be an int >= 0 or null, got {m!r}")
        if m and self.host_kind != "actor":
            raise ValueError("gateway_max_restarts needs gateway_host: actor (Ray restarts an actor; a gateway "
                             "in the job's process ends with it)")
        if not self.gateway_restart_timeout_s > 0:
            raise ValueError(f"gateway_restart_timeout_s must be > 0, got {self.gateway_restart_timeout_s!r}")
        if self.step_timeout_s is not None and not self.step_timeout_s > 0:
            raise ValueError(f"step_timeout_s must be > 0 or null, got {self.step_timeout_s!r}")
        try:
            UpdatePolicy(self.update_policy)
        except ValueError:
            raise ValueError(f"update_policy {self.update_policy!r} is not one of "
                             f"{', '.join(p.value for p in UpdatePolicy)}") from None
        if not isinstance(self.policy, PolicySpec):
            raise ValueError(f"policy must be a PolicySpec, got {type(self.policy).__name__}")
        object.__setattr__(self, "mixed_precision", precision_name(self.mixed_precision))
        self.train_config()  # tags, unfinished, group sizes: refused here, before anything starts
        self.gateway_config()

    @property
    def host_kind(self) -> str:
        """Where the gateway runs: ``gateway_host``, or ``actor`` with ``ray: true`` else ``process``."""
        return self.gateway_host or ("actor" if self.ray else "process")

    @property
    def gateway_restarts(self) -> int:
        """How often Ray may restart the gateway actor: ``gateway_max_restarts``, or 3 with the actor
        (the job always journals, which a restart resumes from) and 0 in the job's process."""
        if self.gateway_max_restarts is not None:
            return self.gateway_max_restarts
        return 3 if self.host_kind == "actor" else 0

    def train_config(self, turn_end_ids: Sequence[int] = ()) -> TraceTrainConfig:
        return TraceTrainConfig(SequenceConfig(train_tags=self.train_tags, untagged=self.untagged,
                                               unfinished=self.unfinished, max_length=self.max_length,
                                               turn_end_ids=tuple(turn_end_ids)),
                                min_group_size=self.min_group_size, drop_equal_groups=self.drop_equal_groups)

    def gateway_config(self) -> GatewayConfig:
        return GatewayConfig(deadline_s=self.rollout_deadline_s, client_rewards=self.client_rewards,
                             reward=self.reward, retry_after_s=self.retry_after_s, during_update=self.during_update,
                             task_kinds=tuple(self.data.kinds), max_live_per_key=self.max_live_per_key)  # a reward that cannot score a kind: refused here


# the keys of AgentJobConfig before its policy was a PolicySpec (serving's spelling)
rename_keys(AgentJobConfig, {"model": "policy.model", "backend": "policy.backend", "max_batch": "max_batch_size"})


class StepTimeout(RuntimeError):
    """A step's rollouts did not all end within ``step_timeout_s``."""


class StepGateway(Protocol):
    """What the loop needs of the gateway (``jobs.train_agent``'s in-process host)."""

    def offer(self, group_id: str, task: Any, n: int) -> None: ...

    def finish(self) -> None: ...

    def wait_step(self, timeout: float | None) -> bool: ...  # every offered rollout ended

    def drain(self) -> list[RolloutTrace]: ...

    def stats(self) -> GatewayStats: ...

    # ``version``: the job's number for these weights (a resume's restore); None: the last one + 1
    def update_weights(self, weights: Mapping[str, Any], policy: str, version: int | None = None) -> int: ...


class StepLearner(Protocol):
    def step(self, batch: Any, loss: str, loss_cfg: Any) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...


def step_tasks(tasks: Sequence[Any], step: int, per_step: int) -> list[Any]:
    """Step ``step``'s tasks without dynamic sampling: the next ``per_step`` of the list, cycling."""
    return draw_tasks(tasks, step * per_step, per_step)


def draw_tasks(tasks: Sequence[Any], cursor: int, n: int) -> list[Any]:
    """``n`` tasks from position ``cursor`` of the list, cycling."""
    if not tasks:
        raise ValueError("no tasks to train on")
    return [tasks[(cursor + i) % len(tasks)] for i in range(n)]


def _stats_row(stats: GatewayStats) -> dict[str, Any]:
    return {f"gateway_{f.name}": getattr(stats, f.name) for f in fields(stats)}


def _wait(cfg: AgentJobConfig, gateway: StepGateway, step: int) -> None:
    if not gateway.wait_step(cfg.step_timeout_s):
        s = gateway.stats()
        raise StepTimeout(f"step {step}: {s.waiting} rollout(s) never claimed and {s.active} still live "
                          f"after step_timeout_s={cfg.step_timeout_s}")


def settle_groups(cfg: AgentJobConfig, gateway: StepGateway, offered: Mapping[str, Any],
                  step: int) -> tuple[list[RolloutTrace], list[RolloutTrace]]:
    """Wait for the groups just ``offered`` (group id -> task) to end; a group's expired or failed
    rollouts are offered again (same group id, same task), at most ``cfg.redraws`` per group, and
    waited for in turn -- but not those whose task's setup SQL failed (``setup_failed``: it would
    fail again; they count, out of their group). Returns ``(traces, replaced)``: the traces that count, and the unfinished
    ones a redraw replaced (reported, not trained). With ``redraws: 0`` nothing is re-offered."""
    budget = {g: cfg.redraws for g in offered}
    traces: list[RolloutTrace] = []
    replaced: list[RolloutTrace] = []
    while True:
        _wait(cfg, gateway, step)
        again: dict[str, int] = {}
        for t in gateway.drain():
            if t.status != "completed" and not t.setup_failed and budget.get(t.group_id, 0) > 0:
                budget[t.group_id] -= 1
                again[t.group_id] = again.get(t.group_id, 0) + 1
                replaced.append(t)
            else:
                traces.append(t)
        if not again:
            return traces, replaced
        for g, n in again.items():
            gateway.offer(g, offered[g], n)


def run_steps(cfg: AgentJobConfig, tasks: Sequence[Any], gateway: StepGateway, learner: StepLearner, *,
              pad_id: int, turn_end_ids: Sequence[int] = (), log: Callable[[int, dict], None] = lambda s, m: None,
              rewards: Callable[[list[RolloutTrace]], list[RolloutTrace]] | None = None,
              observe: Callable[[int, list[RolloutTrace]], None] | None = None,
              checkpoints: StepCheckpoints | None = None, start: StepsState = StepsState()) -> list[dict[str, Any]]:
    """``cfg.steps`` steps (module docstring); returns each step's metrics row (also ``log``ged),
    the rows of steps done before a resume first.
    ``observe(step, traces)``: sees every step's counted traces before they are built (evaluations
    read per-task outcomes from them: bench/gateway_learn.py).
    ``rewards``: applied to each draw's traces before they are counted (tests only: giving a random
    model's all-zero groups a signal, as tests/gateway/test_seq_e2e.py does); None in the job.
    ``checkpoints``: saved to after each step (module docstring, 7); ``start``: ``resume_steps``'
    state (the learner already restored): the loop goes on from there."""
    train_cfg = cfg.train_config(turn_end_ids)
    tasks = start.tasks(tasks)
    history: list[dict[str, Any]] = list(start.history)
    version, cursor = start.version, start.cursor
    if version:  # a resume: the new gateway's engine gets the restored weights as their version, before any offer
        version = gateway.update_weights(learner.state_dict(), cfg.update_policy, version)
    for step in range(start.step, cfg.steps):
        t0 = time.perf_counter()
        traces: list[RolloutTrace] = []
        replaced: list[RolloutTrace] = []
        draws = 0
        finished = False
        for draw in range(cfg.sampling_rounds):  # 1 = no dynamic sampling
            offered = {}
            for i, task in enumerate(draw_tasks(tasks, cursor, cfg.tasks_per_step)):
                group = f"s{step}/g{draw * cfg.tasks_per_step + i}"
                gateway.offer(group, task, cfg.group_size)
                offered[group] = task
            cursor += cfg.tasks_per_step
            draws = draw + 1
            if step == cfg.steps - 1 and draw == cfg.sampling_rounds - 1 and cfg.redraws == 0:
                gateway.finish()  # nothing can be offered after these: clients get 410 once they are claimed
                finished = True
            got, lost = settle_groups(cfg, gateway, offered, step)
            traces += rewards(got) if rewards is not None else got
            replaced += lost
            if cfg.sampling_rounds > 1 and len(trained_groups(traces, train_cfg, cfg.loss)) >= cfg.tasks_per_step:
                break
        if step == cfg.steps - 1 and not finished:
            gateway.finish()
        if observe is not None:
            observe(step, list(traces))
        t1 = time.perf_counter()
        build = build_step(traces, train_cfg, cfg.loss, pad_id=pad_id)
        learned: dict[str, Any] = {}
        t2 = t3 = t1
        if build.batch is not None:
            learned = repeat_steps(learner, build.batch, cfg.loss, cfg.updates_per_batch)
            t2 = time.perf_counter()
            version = gateway.update_weights(learner.state_dict(), cfg.update_policy)
            t3 = time.perf_counter()
        row = {**build.metrics, "redrawn": len(replaced), "sampling_draws": draws,
               **{f"learner_{k}": v for k, v in learned.items()},
               **_stats_row(gateway.stats()), "updated": build.batch is not None, "policy_version": version,
               "time_rollout_s": t1 - t0, "time_update_s": t2 - t1, "time_sync_s": t3 - t2}
        log(step, row)
        history.append(row)
        if checkpoints is not None:
            state = StepsState(step + 1, cursor, version, tuple(history), tuple(t.task_id for t in tasks))
            checkpoints.after(learner, step + 1, cfg.steps, state.to_state())
    return history
