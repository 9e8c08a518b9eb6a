"""The update loops of the stage jobs, in a registry: ``TRAINERS[cfg.trainer_name]`` (the stage's own, or the config's ``trainer``).

- ``sft``: ``sft.epochs`` passes over the stage's ``SFTExample``s in batches of ``sft.batch_size``.
- ``gateway`` (a stage's ``trainer: gateway``; agentic stages): the same ``rl.*`` steps through the
  training gateway with external agent clients (``jobs.gateway_stage.train_stage``, docs/gateway_training.md);
  its engine is the stage's rollout policy, and what it cannot honour is refused before any work (``Trainer.check``).
- ``grpo``: ``rl.steps`` GRPO steps over the stage's tasks: the loop itself -- roll out
  ``tasks_per_step`` tasks x ``group_size`` samples, score them (``StageConfig.reward_name``, with the ``reward`` section's settings), keep the
  groups with a signal (dynamic sampling with ``rl.sampling_rounds > 1``), update, sync -- is
  ``sqlrl.rl.grpo.grpo_steps`` (Ray-free, its own tests); this recipe wires it to the job's
  rollout workers (``rollout``), reward scorers (``score``), learner (``update``: verl's GRPO
  advantages in ``rl_batch``, ``rl.updates_per_batch`` updates; tokens an older policy generated
  masked first, ``sqlrl.rl.staleness``, counted as ``stale_*``) and weight sync (``sync``: into the
  running engines under ``rl.weight_update``, drain by default), and logs each ``StepResult.row()``. With ``rl.probe_samples >= 2`` it first runs
  ``sqlrl.rl.grpo.probe`` (difficulty-aware selection) and trains on the tasks it picks; step 1
  logs the probe's counts (``probe_*``). The rollouts sample with ``rl_seed``: ``rl.seed``, else
  ``data.seed`` (the tasks always follow ``data.seed``).

Guarantees: a trainer returns the learner (still holding the trained weights, for the job to save)
and one metrics dict per step, each also logged (``logger.log``); the optimizer's schedule spans
exactly the steps the loop makes; the GRPO loop's rollout workers are released before it returns.
``Trainer.plan`` is the line the job prints about the steps before any work; ``Trainer.signal``
sums up what the steps measured (``{"text": …, …}``: SFT's loss first -> last; GRPO's samples'
pass rate first -> last and how many of the groups drawn had unequal rewards -- the groups with a
gradient -- saying so when none had), for ``summary.json`` and the main job's table;
``Trainer.curves`` is the report's figure of its stages (``jobs.report``). Both loops save their
full state every ``checkpoint.every_steps`` steps and, with ``resume=true``, go on after the
newest such checkpoint (``StageCheckpoints``): the same batches, draws and updates as a run never
stopped, so the same final weights.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from curriculum.config import StageConfig
from jobs.console import Heartbeat
from jobs.output import console
from sqlrl.rl.outcome import grpo_signal, rollout_metrics, sft_signal  # noqa: F401 (rollout_metrics: re-exported)


def train_sft(rt: Any, model: str, examples: Sequence[Any], logger: Any) -> tuple[Any, list[dict]]:
    """``sft.epochs`` passes over ``examples`` in batches of ``sft.batch_size``."""
    from sqlrl.agent.chat_format import HFChatFormat
    from sqlrl.learn.batch import sft_batch
    from sqlrl.policy.load import load_tokenizer

    s, stage = rt.cfg.sft, rt.cfg.stage
    steps_per_epoch = math.ceil(len(examples) / s.batch_size)
    optim = dataclasses.replace(s.optim, total_steps=max(1, s.epochs * steps_per_epoch))
    learner = rt.learner(model, optim)
    tokenizer, pad_id = load_tokenizer(model)
    chat = HFChatFormat(tokenizer)
    rng = random.Random(rt.cfg.data.seed)
    checkpoints = StageCheckpoints(rt.cfg)
    state = checkpoints.restore(learner) or {"step": 0, "history": []}
    history = list(state["history"])
    step = 0
    with Heartbeat(f"{stage} SFT", total=optim.total_steps, unit="steps done") as beat:
        for epoch in range(s.epochs):
            order = list(examples)
            rng.shuffle(order)  # every epoch's, also those a resumed run skips: the same order as unresumed
            for start in range(0, len(order), s.batch_size):
                if step < state["step"]:  # done before the checkpoint this run resumed from
                    step += 1
                    continue
                beat.update(step, note=f"epoch {epoch + 1}/{s.epochs}, step {step + 1} running")
                t0 = time.perf_counter()
                batch = sft_batch(order[start:start + s.batch_size], chat, max_length=s.max_length, pad_id=pad_id)
                m = dict(learner.step(batch, "sft", s.loss))
                m = {**m, "learner_step": m.pop("step", None), "epoch": epoch, "update_s": time.perf_counter() - t0}
                logger.log(step, m)
                history.append(m)
                step += 1
                console.print(f"  {stage} step {step}/{optim.total_steps}: loss {m.get('loss', float('nan')):.4f}")
                checkpoints.after(learner, step, optim.total_steps, {"history": history})
    return learner, history


def train_grpo(rt: Any, model: str, tasks: Sequence[Any], logger: Any) -> tuple[Any, list[dict]]:
    """``rl.steps`` GRPO steps (``sqlrl.rl.grpo``) on this job's learner, rollout workers and scorers."""
    from sqlrl.policy.load import load_tokenizer
    from sqlrl.rl.grpo import GRPOFns, LoopState, grpo_steps
    from sqlrl.rl.update import policy_update

    r, stage = rt.cfg.rl, rt.cfg.stage
    optim = dataclasses.replace(r.optim, total_steps=max(1, r.steps * r.updates_per_batch))
    learner = rt.learner(model, optim, reference=r.loss.kl_coef > 0)
    rollout = rt.rollout_group(model, rt.cfg.mode, temperature=r.temperature, top_p=r.top_p, seed=rl_seed(rt.cfg))
    _, pad_id = load_tokenizer(model)

    update = policy_update(learner, r.loss, pad_id=pad_id, max_length=rt.cfg.rollout.max_total_tokens,
                           times=r.updates_per_batch)  # stale tokens masked, rl_batch, the steps
    checkpoints = StageCheckpoints(rt.cfg)
    state = checkpoints.restore(learner)
    history: list[dict] = []
    with Heartbeat(f"{stage} GRPO", total=r.steps, unit="steps done") as beat:
        fns = GRPOFns(rollout=rollout.rollout, score=lambda trajs, drawn: rt.score(trajs, drawn, rt.cfg.reward_name),
                      update=update, sync=lambda: learner.sync_to(rollout, r.weight_update),
                      progress=lambda step, note: beat.update(step, note=note))
        chosen, start = None, LoopState()
        if state is not None:  # resumed: the probe's choice, the data position and the metrics so far
            by_id = {t.task_id: t for t in tasks}
            tasks, start, history = [by_id[i] for i in state["tasks"]], LoopState(state["step"], state["cursor"]), \
                list(state["history"])
            fns.sync()  # the rollout workers sample with the restored weights
        elif r.probe_samples:
            tasks, chosen = probe_tasks(rt, fns, tasks)
        for result in grpo_steps(grpo_plan(rt.cfg), tasks, fns, probe=chosen, start=start):
            metrics = result.row()
            logger.log(result.step, metrics)
            history.append(metrics)
            checkpoints.after(learner, result.step + 1, r.steps,
                              {"cursor": result.cursor, "tasks": [t.task_id for t in tasks], "history": history})
            beat.update(result.step + 1, note="")
            console.print(f"  {stage} step {result.step + 1}/{r.steps}: reward {metrics['reward_mean']:.3f}, "
                          f"pass {metrics['pass_rate']:.2f}, groups trained {result.groups_trained}/"
                          f"{result.groups_drawn} ({result.groups_signal} with unequal rewards), "
                          f"rollout {result.time_rollout_s:.0f}s, update {result.time_update_s:.0f}s")
    rt.release(rollout)  # the job's engines keep running: the evaluation loads the final checkpoint into them
    return learner, history


def grpo_plan(cfg: Any) -> Any:
    """The loop's shape (``sqlrl.rl.grpo.GRPOPlan``) from ``rl.*``."""
    from sqlrl.rl.grpo import GRPOPlan

    r = cfg.rl
    return GRPOPlan(steps=r.steps, tasks_per_step=r.tasks_per_step, group_size=r.group_size,
                    sampling_rounds=r.sampling_rounds, probe_samples=r.probe_samples)


def rl_seed(cfg: Any) -> int:
    """The GRPO rollouts' sampling seed: ``rl.seed`` when set, else ``data.seed``."""
    return cfg.data.seed if cfg.rl.seed is None else cfg.rl.seed


def probe_tasks(rt: Any, fns: Any, tasks: Sequence[Any]) -> tuple[list[Any], Any]:
    """Difficulty-aware selection (``sqlrl.rl.grpo.probe``) with the stage's RL reward, at
    ``rl.temperature``, and its line on the console: the tasks to train on and the ``ProbeResult``."""
    from sqlrl.rl.grpo import probe

    r = rt.cfg.rl
    p = probe(grpo_plan(rt.cfg), tasks, fns)
    console.print(f"  {rt.cfg.stage} probe: {r.probe_samples} samples x {p.probed} tasks, pass rate "
                  f"{p.pass_rate:.2f}; {p.informative} with unequal rewards; {p.all_fail} never "
                  f"solved, {p.all_pass} always -> training on "
                  + (f"those {p.informative}" if p.used else f"all {p.probed} (fewer than {r.tasks_per_step} qualify)")
                  + f" ({p.seconds:.0f}s)")
    return list(p.tasks), p


class StageCheckpoints:
    """A stage's mid-stage checkpoints in ``<stage_dir>/checkpoints`` (``sqlrl.learn.resume.Checkpoints``):
    ``after(learner, steps_done, total, state)`` saves the learner and the loop's ``state`` every
    ``checkpoint.every_steps`` steps (not after the last: ``final/`` follows); ``restore(learner)``
    with ``resume=true`` loads the newest into ``learner`` and returns its state -- refusing (one
    line, ``SystemExit``) one made with another config -- and otherwise (a fresh run) clears stale ones."""

    SAME_ANY_WAY = ("resume", "overwrite", "checkpoint.every_steps", "checkpoint.keep")  # may change on resume

    def __init__(self, cfg: StageConfig) -> None:
        from sqlrl.learn.resume import Checkpoints

        self.cfg, self.root = cfg, cfg.stage_dir / "checkpoints"
        self._run = Checkpoints(self.root, cfg.checkpoint, resume=cfg.resume, config=cfg, name=cfg.stage,
                                ignore=self.SAME_ANY_WAY, say=console.print,
                                fresh_hint="pass overwrite=true without resume to start over")

    def restore(self, learner: Any) -> dict[str, Any] | None:
        from sqlrl.learn.resume import ResumeRefused

        try:
            return self._run.restore(learner)
        except ResumeRefused as exc:
            raise SystemExit(str(exc)) from None

    def after(self, learner: Any, steps_done: int, total: int, state: dict[str, Any]) -> None:
        self._run.after(learner, steps_done, total, state)


def plan_sft(cfg: StageConfig) -> str:
    s, d = cfg.sft, cfg.data
    steps = s.epochs * math.ceil(d.train_size / s.batch_size)
    return (f"up to {steps} SFT step(s): {s.epochs} epoch(s) over the verified examples of "
            f"{d.train_size} tasks, batches of {s.batch_size}; teacher {cfg.teacher.kind}")


def plan_grpo(cfg: StageConfig) -> str:
    r = cfg.rl
    probe = (f"; first a probe of {r.probe_samples} samples per task, training on the tasks whose rewards differ"
             if r.probe_samples else "")
    return (f"{r.steps} GRPO step(s) x {r.tasks_per_step} task(s) x {r.group_size} samples (reward {cfg.reward_name})"
            + probe)


def signal_sft(history: Sequence[dict]) -> dict[str, Any]:
    return sft_signal(history).to_dict()


def signal_grpo(history: Sequence[dict]) -> dict[str, Any]:
    return grpo_signal(history).to_dict()


@dataclass(frozen=True)
class Curves:
    """The report's figure of a trainer's stages (``jobs.report``): one panel per stage, these
    metrics per step."""

    file: str  # e.g. "rl_curves.png", in <run_dir>/curves
    title: str
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class Trainer:
    train: Callable[[Any, str, Sequence[Any], Any], tuple[Any, list[dict]]]  # (rt, model, items, logger)
    plan: Callable[[StageConfig], str]  # the "steps:" line of the job's plan
    signal: Callable[[Sequence[dict]], dict[str, Any]]  # what the steps measured, with a "text" line
    curves: Curves  # how jobs.report draws its stages' metrics
    takes: str = "tasks"  # what its items are: "tasks" | "SFT examples" (a stage's trainer may be swapped for one that takes the same)
    modes: tuple[str, ...] = ()  # the stage modes it can train (empty: any)
    # the stage config's settings it cannot honour: ValueError naming the key (jobs.stage.check_trainer, before any work)
    check: Callable[[StageConfig], None] = lambda cfg: None


def train_gateway(rt: Any, model: str, tasks: Sequence[Any], logger: Any) -> tuple[Any, list[dict]]:
    """``rl.steps`` GRPO steps through the training gateway, agent client processes rolling out
    (``jobs.gateway_stage.train_stage``)."""
    from jobs.gateway_stage import train_stage

    return train_stage(rt, model, tasks, logger)


def check_gateway(cfg: StageConfig) -> None:
    """The gateway's engine is the stage's rollout policy: what it cannot honour is refused
    (``jobs.gateway_stage.check_settings``)."""
    from jobs.gateway_stage import check_settings

    check_settings(cfg)


def plan_gateway(cfg: StageConfig) -> str:
    g = cfg.gateway
    return (plan_grpo(cfg) + f"; through the training gateway, {g.clients} {g.agent} client process(es) rolling out"
            + (f", {g.redraws} redraw(s) per group" if g.redraws else ""))


# In the report's figure order (jobs.report draws one figure per trainer, in this order).
TRAINERS: dict[str, Trainer] = {
    "grpo": Trainer(train_grpo, plan_grpo, signal_grpo,
                    Curves("rl_curves.png", "RL stages", ("reward_mean", "pass_rate", "reward_format", "reward_result"))),
    "sft": Trainer(train_sft, plan_sft, signal_sft, Curves("sft_loss.png", "SFT loss", ("loss",)), takes="SFT examples"),
    "gateway": Trainer(train_gateway, plan_gateway, signal_grpo,
                       Curves("gateway_curves.png", "RL stages through the gateway", ("reward_mean", "pass_rate")),
                       modes=("agentic",), check=check_gateway),
}
