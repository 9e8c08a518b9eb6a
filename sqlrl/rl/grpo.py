"""The GRPO step loop over plain callables: dynamic sampling, probe selection, group filtering.

    fns = GRPOFns(rollout=..., score=..., update=..., sync=...)
    chosen = probe(plan, tasks, fns)                    # rl.probe_samples >= 2 only
    for result in grpo_steps(plan, chosen.tasks, fns, probe=chosen):
        log(result.step, result.row())

The callables (``GRPOFns``): ``rollout(tasks) -> trajectories`` (one per task, in order; called
once per draw with every task of it -- the rollout side runs them at once, bounded by its own
``max_concurrent_trajectories``: ``sqlrl.agent.rollouts``), ``score(trajectories, tasks) -> breakdowns`` (one
per row: ``score``, ``parts``, ``excluded``), ``update(trajectories, scores, group_ids) ->
metrics`` (one policy update on the kept rows: the learner's metrics, with its own ``step``),
``sync() -> (policy_version, seconds)`` (the new weights to the rollout side) and
``progress(step, note)`` (a heartbeat; optional).

Guarantees (``grpo_steps``):
- Step ``s`` draws ``tasks_per_step`` tasks x ``group_size`` samples, the next ones after the
  previous draw (tasks cycle, from ``start.cursor``); a group is one task in one draw (group id
  ``"<step>/<draw>/<task_id>"``). The rows kept are ``sqlrl.learn.groups.trainable_rows``'s.
- Dynamic sampling (``sampling_rounds > 1``): the step keeps only groups whose rewards differ
  (``informative_rows``) and draws again until ``tasks_per_step`` such groups are found or
  ``sampling_rounds`` draws are spent; with one round every trainable group is kept (a flat group
  enters the update with zero advantage).
- ``update`` is called once per step with the kept rows, and not at all when none is kept;
  ``sync`` is called once per step, after the update.
- Each step yields a frozen ``StepResult``: ``row()`` is the metrics line of the step (the same
  keys in the same order every step; step 0 also carries the probe's counts) and ``cursor`` the
  position to resume from (``LoopState``): ``grpo_steps(..., start=LoopState(step, cursor))``
  makes the same calls from there as the uninterrupted loop did.

``probe`` (difficulty-aware selection): every task ``probe_samples`` times, scored; the tasks whose
samples' rewards are not all equal (for a pass/fail reward: sometimes solved), in order, or every
task when fewer than ``tasks_per_step`` qualify. Excluded rows count for nothing; a task with fewer
than two scored rows is not selected.
Pure Python over the callables: no ray, no torch, no jobs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from sqlrl.learn.groups import informative_rows, trainable_rows

from .outcome import mean, rollout_metrics, solved

__all__ = ["GRPOFns", "GRPOPlan", "LoopState", "ProbeResult", "StepResult", "grpo_steps", "probe"]


def _no_progress(step: int, note: str) -> None:
    return None


@dataclass(frozen=True)
class GRPOPlan:
    """The shape of the loop (``curriculum.config.RLSettings`` holds these)."""

    steps: int
    tasks_per_step: int
    group_size: int
    sampling_rounds: int = 1
    probe_samples: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "tasks_per_step", "sampling_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"GRPOPlan.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.group_size < 2:
            raise ValueError(f"GRPOPlan.group_size must be >= 2 (GRPO compares samples), got {self.group_size!r}")


@dataclass(frozen=True)
class GRPOFns:
    """What the loop calls (see the module doc)."""

    rollout: Callable[[list[Any]], list[Any]]
    score: Callable[[list[Any], list[Any]], list[Any]]
    update: Callable[[list[Any], list[float], list[str]], Mapping[str, Any]]
    sync: Callable[[], tuple[int, float]]
    progress: Callable[[int, str], None] = field(default=_no_progress)


@dataclass(frozen=True)
class LoopState:
    """Where the loop stands between steps: the next step and the next task to draw."""

    step: int = 0
    cursor: int = 0


@dataclass(frozen=True)
class ProbeResult:
    tasks: tuple[Any, ...]  # the tasks to train on (every task when the probe was not used)
    probed: int  # tasks probed
    informative: int  # tasks whose samples' rewards differ
    all_fail: int  # tasks never solved
    all_pass: int  # tasks always solved
    pass_rate: float  # over every scored sample
    used: bool  # False: fewer than tasks_per_step qualified, training on every task
    seconds: float

    def metrics(self) -> dict[str, Any]:
        """The ``probe_*`` entries of step 1's metrics line."""
        return {"probe_tasks": self.probed, "probe_informative": self.informative, "probe_all_fail": self.all_fail,
                "probe_all_pass": self.all_pass, "probe_pass_rate": self.pass_rate, "probe_used": int(self.used),
                "probe_s": self.seconds}


@dataclass(frozen=True)
class StepResult:
    step: int  # 0-based
    rollout: Mapping[str, Any]  # sqlrl.rl.outcome.rollout_metrics over every row drawn
    sampling_draws: int
    groups_drawn: int
    groups_trained: int  # groups in the update
    groups_signal: int  # of those, the ones whose rewards differ
    update: Mapping[str, Any]  # the learner's metrics (``learner_step`` its own step); {} without an update
    policy_version: int
    time_rollout_s: float
    time_reward_s: float
    time_update_s: float
    time_sync_s: float
    time_tool_s: float
    cursor: int  # the next task to draw: resume with LoopState(step + 1, cursor)
    probe: Mapping[str, Any] = field(default_factory=dict)  # step 0 only: ProbeResult.metrics()

    @property
    def next_state(self) -> LoopState:
        return LoopState(self.step + 1, self.cursor)

    def row(self) -> dict[str, Any]:
        """The step's metrics line (metrics.jsonl, the stage's history)."""
        return {**self.rollout, **self.probe, "sampling_draws": self.sampling_draws,
                "groups_drawn": self.groups_drawn, "groups_trained": self.groups_trained,
                "groups_signal": self.groups_signal, **self.update, "policy_version": self.policy_version,
                "time_rollout_s": self.time_rollout_s, "time_reward_s": self.time_reward_s,
                "time_update_s": self.time_update_s, "time_sync_s": self.time_sync_s,
                "time_tool_s": self.time_tool_s}


def _roll_out(fns: GRPOFns, tasks: list[Any], step: int, label: str) -> list[Any]:
    fns.progress(step, f"{label}{len(tasks)} trajectories")
    return list(fns.rollout(tasks))


def probe(plan: GRPOPlan, tasks: Sequence[Any], fns: GRPOFns, *,
          clock: Callable[[], float] = time.perf_counter) -> ProbeResult:
    """Difficulty-aware selection (see the module doc)."""
    if plan.probe_samples < 2:
        raise ValueError(f"a probe needs probe_samples >= 2, got {plan.probe_samples}")
    t0 = clock()
    drawn = [t for t in tasks for _ in range(plan.probe_samples)]
    trajs = _roll_out(fns, drawn, 0, "probe: ")
    passes: dict[str, list[float]] = {}
    scores: dict[str, set[float]] = {}
    for task, b in zip(drawn, fns.score(trajs, drawn)):
        if not b.excluded:
            passes.setdefault(task.task_id, []).append(float(solved(b)))
            scores.setdefault(task.task_id, set()).add(b.score)
    rates = [mean(v) for v in passes.values()]
    mixed = [t for t in tasks if len(scores.get(t.task_id, ())) > 1]
    used = len(mixed) >= plan.tasks_per_step
    return ProbeResult(tuple(mixed if used else tasks), len(tasks), len(mixed), sum(v == 0.0 for v in rates),
                       sum(v == 1.0 for v in rates), mean(x for v in passes.values() for x in v), used, clock() - t0)


def grpo_steps(plan: GRPOPlan, tasks: Sequence[Any], fns: GRPOFns, *, probe: ProbeResult | None = None,
               start: LoopState = LoopState(), clock: Callable[[], float] = time.perf_counter) -> Iterator[StepResult]:
    """Steps ``start.step`` .. ``plan.steps - 1`` of GRPO over ``tasks`` (see the module doc)."""
    if not tasks:
        raise ValueError("GRPO needs at least one task")
    cursor = start.cursor
    for step in range(start.step, plan.steps):
        trajs: list[Any] = []
        breakdowns: list[Any] = []
        gids: list[str] = []
        roll_s = reward_s = 0.0
        keep: list[int] = []
        draws = 0
        for draw in range(plan.sampling_rounds):  # 1 = no dynamic sampling
            drawn = [tasks[(cursor + i) % len(tasks)] for i in range(plan.tasks_per_step) for _ in range(plan.group_size)]
            cursor += plan.tasks_per_step
            draws = draw + 1
            ta = clock()
            new = _roll_out(fns, drawn, step, f"step {step + 1}: rollout (draw {draw + 1}), ")
            tb = clock()
            fns.progress(step, f"step {step + 1}: reward")
            gids += [f"{step}/{draw}/{t.task_id}" for t in drawn]
            trajs += new
            breakdowns += fns.score(new, drawn)
            roll_s, reward_s = roll_s + tb - ta, reward_s + clock() - tb
            keep = trainable_rows(trajs, breakdowns, gids)
            if plan.sampling_rounds > 1:
                keep = informative_rows(keep, [b.score for b in breakdowns], gids)
                if len({gids[i] for i in keep}) >= plan.tasks_per_step:
                    break
        t2 = clock()
        rollout = rollout_metrics(trajs, breakdowns, keep)
        signal = informative_rows(keep, [b.score for b in breakdowns], gids)  # == keep when sampling
        update: dict[str, Any] = {}
        if keep:
            fns.progress(step, f"step {step + 1}: update")
            update = dict(fns.update([trajs[i] for i in keep], [breakdowns[i].score for i in keep],
                                     [gids[i] for i in keep]))
            update["learner_step"] = update.pop("step", None)  # the row's step is the GRPO step
        t3 = clock()
        fns.progress(step, f"step {step + 1}: weight sync")
        version, sync_s = fns.sync()
        yield StepResult(step=step, rollout=rollout, sampling_draws=draws, groups_drawn=len(set(gids)),
                         groups_trained=len({gids[i] for i in keep}), groups_signal=len({gids[i] for i in signal}),
                         update=update, policy_version=version, time_rollout_s=roll_s, time_reward_s=reward_s,
                         time_update_s=t3 - t2, time_sync_s=sync_s,
                         time_tool_s=sum(t.tool_ms for tr in trajs for t in tr.turns) / 1000.0,
                         cursor=cursor, probe=probe.metrics() if probe is not None and step == 0 else {})
