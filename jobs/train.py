"""The update loops of the stage jobs, in a registry: ``TRAINERS[spec.trainer]``.

- ``sft``: ``sft.epochs`` passes over the stage's ``SFTExample``s in batches of ``sft.batch_size``.
- ``grpo``: ``rl.steps`` GRPO steps over the stage's tasks -- roll out ``tasks_per_step`` tasks x
  ``group_size`` samples with the current policy, score them (``StageConfig.reward``), keep the
  rows that carry a group signal (``sqlrl.learn.groups.trainable_rows``), build the batch with verl's
  GRPO advantages, update ``rl.updates_per_batch`` times, sync the new weights to the rollout
  workers. With ``rl.sampling_rounds > 1`` (DAPO's dynamic sampling) a step draws further batches
  of ``tasks_per_step`` tasks (the next ones, cycling) until ``tasks_per_step`` groups have unequal
  rewards or the rounds are spent, and trains only on those groups (``informative_rows``); every
  step logs ``sampling_draws``, ``groups_drawn``, ``groups_trained`` (groups in the update),
  ``groups_signal`` (those of them whose rewards differ: with one draw a flat group still enters
  the update, with zero advantage) and the reward parts.
  With ``rl.probe_samples >= 2`` (difficulty-aware selection) the loop first rolls out every task
  that many times with the starting policy and trains only on the tasks whose samples' rewards
  differ -- for a pass/fail reward, pass rate strictly between 0 and 1 (``probe_tasks``; all of
  them when fewer than ``tasks_per_step`` qualify); step 1
  logs the probe's counts (``probe_*``). The rollouts sample with ``rl_seed``: ``rl.seed``, else
  ``data.seed`` (the tasks always follow ``data.seed``).

Guarantees: a trainer returns the learner (still holding the trained weights, for the job to save)
and one metrics dict per step, each also logged (``logger.log``); the optimizer's schedule spans
exactly the steps the loop makes; the GRPO loop's rollout workers are released before it returns.
``Trainer.plan`` is the line the job prints about the steps before any work; ``Trainer.signal``
sums up what the steps measured (``{"text": …, …}``: SFT's loss first -> last; GRPO's samples'
pass rate first -> last and how many of the groups drawn had unequal rewards -- the groups with a
gradient -- saying so when none had), for ``summary.json`` and the main job's table.
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
from jobs.held_out import mean
from jobs.output import console


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
    history = []
    step = 0
    with Heartbeat(f"{stage} SFT", total=optim.total_steps, unit="steps done") as beat:
        for epoch in range(s.epochs):
            order = list(examples)
            rng.shuffle(order)
            for start in range(0, len(order), s.batch_size):
                beat.update(step, note=f"epoch {epoch + 1}/{s.epochs}, step {step + 1} running")
                t0 = time.perf_counter()
                batch = sft_batch(order[start:start + s.batch_size], chat, max_length=s.max_length, pad_id=pad_id)
                m = dict(learner.step(batch, "sft", s.loss))
                m = {**m, "learner_step": m.pop("step", None), "epoch": epoch, "update_s": time.perf_counter() - t0}
                logger.log(step, m)
                history.append(m)
                step += 1
                console.print(f"  {stage} step {step}/{optim.total_steps}: loss {m.get('loss', float('nan')):.4f}")
    return learner, history


def train_grpo(rt: Any, model: str, tasks: Sequence[Any], logger: Any) -> tuple[Any, list[dict]]:
    """``rl.steps`` GRPO steps: roll out, score, filter the groups, update, sync the weights."""
    from sqlrl.learn.batch import rl_batch
    from sqlrl.learn.groups import informative_rows, trainable_rows
    from sqlrl.policy.load import load_tokenizer

    r, stage, batch_size = rt.cfg.rl, rt.cfg.stage, rt.cfg.rollout.batch
    optim = dataclasses.replace(r.optim, total_steps=max(1, r.steps * r.updates_per_batch))
    learner = rt.learner(model, optim, reference=r.loss.kl_coef > 0)
    rollout = rt.rollout_group(model, rt.cfg.mode, temperature=r.temperature, top_p=r.top_p, seed=rl_seed(rt.cfg))
    _, pad_id = load_tokenizer(model)
    history = []
    cursor = 0  # next task to draw (tasks cycle)
    with Heartbeat(f"{stage} GRPO", total=r.steps, unit="steps done") as beat:
        probe: dict[str, Any] = {}
        if r.probe_samples:
            tasks, probe = probe_tasks(rt, rollout, tasks, beat)
        for step in range(r.steps):
            t0 = time.perf_counter()
            group_tasks: list[Any] = []
            trajs: list[Any] = []
            breakdowns: list[Any] = []
            gids: list[str] = []  # a group = one task in one draw
            roll_s = reward_s = 0.0
            keep: list[int] = []
            for draw in range(r.sampling_rounds):  # 1 = no dynamic sampling
                drawn = [tasks[(cursor + i) % len(tasks)] for i in range(r.tasks_per_step) for _ in range(r.group_size)]
                cursor += r.tasks_per_step
                ta = time.perf_counter()
                new: list[Any] = []
                for first in range(0, len(drawn), batch_size):
                    beat.update(step, note=f"step {step + 1}: rollout (draw {draw + 1}), "
                                f"{len(new)}/{len(drawn)} trajectories")
                    new += rollout.rollout(drawn[first:first + batch_size])
                tb = time.perf_counter()
                beat.update(step, note=f"step {step + 1}: reward")
                group_tasks += drawn
                gids += [f"{step}/{draw}/{t.task_id}" for t in drawn]
                trajs += new
                breakdowns += rt.score(new, drawn, rt.cfg.reward)
                roll_s, reward_s = roll_s + tb - ta, reward_s + time.perf_counter() - tb
                keep = trainable_rows(trajs, breakdowns, gids)
                if r.sampling_rounds > 1:
                    keep = informative_rows(keep, [b.score for b in breakdowns], gids)
                    if len({gids[i] for i in keep}) >= r.tasks_per_step:
                        break
            t2 = time.perf_counter()
            metrics: dict[str, Any] = rollout_metrics(trajs, breakdowns, keep)
            if step == 0:
                metrics.update(probe)
            signal = informative_rows(keep, [b.score for b in breakdowns], gids)  # == keep when sampling
            metrics.update(sampling_draws=draw + 1, groups_drawn=len(set(gids)),
                           groups_trained=len({gids[i] for i in keep}), groups_signal=len({gids[i] for i in signal}))
            if keep:
                beat.update(step, note=f"step {step + 1}: update")
                batch = rl_batch([trajs[i] for i in keep], [breakdowns[i].score for i in keep],
                                 [gids[i] for i in keep], r.loss,
                                 pad_id=pad_id, max_length=rt.cfg.rollout.max_total_tokens)
                for _ in range(r.updates_per_batch):
                    m = dict(learner.step(batch, "grpo", r.loss))
                    m["learner_step"] = m.pop("step", None)  # the row's step is the GRPO step
                    metrics.update(m)
            t3 = time.perf_counter()
            beat.update(step, note=f"step {step + 1}: weight sync")
            version, sync_s = learner.sync_to(rollout)
            metrics.update({"policy_version": version, "time_rollout_s": roll_s, "time_reward_s": reward_s,
                            "time_update_s": t3 - t2, "time_sync_s": sync_s,
                            "time_tool_s": sum(t.tool_ms for tr in trajs for t in tr.turns) / 1000.0})
            logger.log(step, metrics)
            history.append(metrics)
            beat.update(step + 1, note="")
            console.print(f"  {stage} step {step + 1}/{r.steps}: reward {metrics['reward_mean']:.3f}, "
                          f"pass {metrics['pass_rate']:.2f}, groups trained {metrics['groups_trained']}/"
                          f"{metrics['groups_drawn']} ({metrics['groups_signal']} with unequal rewards), "
                          f"rollout {roll_s:.0f}s, update {t3 - t2:.0f}s")
    rt.release(rollout)
    return learner, history


def rl_seed(cfg: Any) -> int:
    """The GRPO rollouts' sampling seed: ``rl.seed`` when set, else ``data.seed``."""
    return cfg.data.seed if cfg.rl.seed is None else cfg.rl.seed


def probe_tasks(rt: Any, rollout: Any, tasks: Sequence[Any], beat: Any) -> tuple[list[Any], dict[str, Any]]:
    """Difficulty-aware selection: ``rl.probe_samples`` rollouts of every task with the starting
    policy (at ``rl.temperature``), scored with the stage's RL reward; the tasks whose samples'
    rewards are not all equal -- dynamic sampling's test for a group that carries a gradient; for a
    pass/fail reward, the tasks it sometimes solves (0 < pass rate < 1) -- in their order, or every
    task when fewer than ``rl.tasks_per_step`` qualify. Excluded rows (the infrastructure failed)
    count for nothing; a task with fewer than two scored rows is not selected."""
    r, batch_size = rt.cfg.rl, rt.cfg.rollout.batch
    t0 = time.perf_counter()
    drawn = [t for t in tasks for _ in range(r.probe_samples)]
    trajs: list[Any] = []
    for first in range(0, len(drawn), batch_size):
        beat.update(0, note=f"probe: {len(trajs)}/{len(drawn)} trajectories")
        trajs += rollout.rollout(drawn[first:first + batch_size])
    passes: dict[str, list[float]] = {}
    scores: dict[str, set[float]] = {}
    for task, b in zip(drawn, rt.score(trajs, drawn, rt.cfg.reward)):
        if not b.excluded:
            passes.setdefault(task.task_id, []).append(passed(b))
            scores.setdefault(task.task_id, set()).add(b.score)
    rates = {tid: mean(v) for tid, v in passes.items()}
    mixed = [t for t in tasks if len(scores.get(t.task_id, ())) > 1]
    used = len(mixed) >= r.tasks_per_step
    info = {"probe_tasks": len(tasks), "probe_informative": len(mixed),
            "probe_all_fail": sum(v == 0.0 for v in rates.values()),
            "probe_all_pass": sum(v == 1.0 for v in rates.values()),
            "probe_pass_rate": mean(x for v in passes.values() for x in v), "probe_used": int(used),
            "probe_s": time.perf_counter() - t0}
    console.print(f"  {rt.cfg.stage} probe: {r.probe_samples} samples x {len(tasks)} tasks, pass rate "
                  f"{info['probe_pass_rate']:.2f}; {len(mixed)} with unequal rewards; {info['probe_all_fail']} never "
                  f"solved, {info['probe_all_pass']} always -> training on "
                  + (f"those {len(mixed)}" if used else f"all {len(tasks)} (fewer than {r.tasks_per_step} qualify)")
                  + f" ({info['probe_s']:.0f}s)")
    return (mixed if used else list(tasks)), info


def passed(breakdown: Any) -> float:
    """1.0 when a scored row's result part is full marks (the task solved), else 0.0."""
    return float(breakdown.parts.get("result", 0.0) >= 1.0)


def rollout_metrics(trajs: Sequence[Any], breakdowns: Sequence[Any], keep: Sequence[int]) -> dict[str, Any]:
    """One GRPO step's rollout and reward metrics. Rewards, their parts and the pass rate are over
    every scored row the step drew (not the excluded ones), so they are the policy's learning curve
    whichever groups dynamic sampling kept; ``trained_reward_mean`` is over the rows trained on."""
    scored = [b for b in breakdowns if not b.excluded]
    parts: dict[str, list[float]] = {}
    for b in scored:
        for k, v in b.parts.items():
            parts.setdefault(k, []).append(v)
    return {"reward_mean": mean(b.score for b in scored),
            "pass_rate": mean(passed(b) for b in scored),
            **{f"reward_{k}": mean(v) for k, v in parts.items()},
            "trained_reward_mean": mean(breakdowns[i].score for i in keep),
            "trajectories": len(trajs), "trained_on": len(keep),
            "excluded": sum(b.excluded for b in breakdowns),
            "turns_mean": mean(len(t.turns) for t in trajs),
            "tool_calls_mean": mean(t.n_tool_calls for t in trajs),
            "tool_errors_mean": mean(t.n_tool_errors for t in trajs),
            "malformed_mean": mean(t.n_malformed for t in trajs),
            "response_tokens_mean": mean(t.n_generated for t in trajs)}


def plan_sft(cfg: StageConfig) -> str:
    s, d = cfg.sft, cfg.data
    steps = s.epochs * math.ceil(d.train_size / s.batch_size)
    return (f"up to {steps} SFT step(s): {s.epochs} epoch(s) over the verified examples of "
            f"{d.train_size} tasks, batches of {s.batch_size}; teacher {cfg.teacher.kind}")


def plan_grpo(cfg: StageConfig) -> str:
    r = cfg.rl
    probe = (f"; first a probe of {r.probe_samples} samples per task, training on the tasks whose rewards differ"
             if r.probe_samples else "")
    return (f"{r.steps} GRPO step(s) x {r.tasks_per_step} task(s) x {r.group_size} samples (reward {cfg.reward})"
            + probe)


def signal_sft(history: Sequence[dict]) -> dict[str, Any]:
    losses = [h["loss"] for h in history if isinstance(h.get("loss"), (int, float))]
    if not losses:
        return {"steps": len(history), "text": f"{len(history)} steps, no loss logged"}
    return {"steps": len(history), "loss_first": losses[0], "loss_last": losses[-1],
            "text": f"loss {losses[0]:.2f} -> {losses[-1]:.2f} over {len(history)} steps"}


def signal_grpo(history: Sequence[dict]) -> dict[str, Any]:
    passes = [h["pass_rate"] for h in history if isinstance(h.get("pass_rate"), (int, float))]
    drawn = sum(int(h.get("groups_drawn") or 0) for h in history)
    # groups whose rewards differ: the only ones with a non-zero advantage
    signal = sum(int(h.get("groups_signal") or 0) for h in history)
    out = {"steps": len(history), "groups_signal": signal, "groups_drawn": drawn,
           "updates": sum(1 for h in history if h.get("learner_step") is not None)}
    if passes:
        out.update(pass_first=passes[0], pass_last=passes[-1])
    rate = (f"samples' pass {passes[0]:.2f} -> {passes[-1]:.2f}" if len(passes) > 1
            else f"samples' pass {passes[0]:.2f}" if passes else "no rollouts")
    groups = (f"{signal} of {drawn} groups with unequal rewards" if signal
              else f"no group of {drawn} had unequal rewards: zero advantages, no gradient")
    out["text"] = f"{rate}, {groups} over {len(history)} step{'s' if len(history) != 1 else ''}"
    return out


@dataclass(frozen=True)
class Trainer:
    train: Callable[[Any, str, Sequence[Any], Any], tuple[Any, list[dict]]]  # (rt, model, items, logger)
    plan: Callable[[StageConfig], str]  # the "steps:" line of the job's plan
    signal: Callable[[Sequence[dict]], dict[str, Any]]  # what the steps measured, with a "text" line


TRAINERS: dict[str, Trainer] = {"sft": Trainer(train_sft, plan_sft, signal_sft),
                                "grpo": Trainer(train_grpo, plan_grpo, signal_grpo)}
