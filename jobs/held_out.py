"""Held-out evaluation of a checkpoint: greedy rollouts on the eval tasks, scored by the rewards.

Guarantees:
- ``evaluate(rt, model, tasks, mode)`` rolls every task out once in ``mode`` at
  ``eval.temperature`` (0: greedy) in batches of ``rollout.batch``, on the job's rollout workers,
  and scores them with ``hybrid_<mode>`` on the job's reward scorers.
- Success = the reward's ``result`` part is 1; reported overall and per task kind
  (``success_<kind>``), over the tasks that were scored (an excluded task -- a broken reference or
  a failed rollout -- counts in ``n`` but not in ``scored``). ``format_ok`` is the mean format part.
- The summary also holds ``successes``, ``success_ci95`` (the 95% Wilson interval of ``success``,
  ``sqlrl.eval.stats``) and ``per_task``: task id -> ``{"success": 1 | 0 | None (excluded), "kind",
  "difficulty", "domain", "answer"}``, so two evaluations of the same tasks can be compared task by
  task; ``answer`` is a fingerprint of everything the model generated on the task (``fingerprint``:
  equal exactly when the generated token ids are), so a change of behaviour shows even where
  success does not move.
- ``evaluate_sampled(rt, model, tasks, mode, k, temperature)`` rolls every task out ``k`` times at
  ``temperature`` (sampling seeded with ``data.seed``, so every checkpoint draws with the same
  seeds) and reports mode ``<mode>@<k>``: ``success`` is the mean over tasks of each task's solve
  rate (the share of its k samples solved: avg@k, an estimate of the sampled policy's pass@1),
  ``success_ci95`` its bootstrap interval over tasks, ``pass_at_k`` the share of tasks solved at
  least once, and ``per_task`` holds the rates. Samples of a task that were not scored are left
  out of its rate; a task with none scored is excluded (None).
- ``compare(before, after)`` is the paired bootstrap difference of two such summaries (matched by
  task id; tasks on one side only are reported in it; per-task rates when either is sampled), or
  None when either has no ``per_task``; with ``answers_changed`` (of ``answers_compared``) when both
  carry answer fingerprints.
- ``changes_since_earlier(run_dir, stage, evals)``: for each of ``evals``, the paired difference
  against the latest earlier stage of ``curriculum.stages.STAGES`` whose ``<run_dir>/<stage>/summary.json``
  holds an evaluation in the same mode (``{mode: {"vs": stage, **difference}}``; modes with no
  earlier evaluation, or none comparable, are left out).
- The rollout workers are released before scoring starts; a heartbeat runs throughout.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from jobs.console import Heartbeat
from jobs.output import console


def _roll_out(rt: Any, model: str, tasks: Sequence[Any], mode: str, label: str, *, temperature: float,
              seed: int | None = None) -> tuple[list[Any], list[Any]]:
    """One rollout of each of ``tasks`` (repeats allowed) in batches, then their breakdowns."""
    batch = rt.cfg.rollout.batch
    with Heartbeat(f"eval ({label}) {Path(model).name}", total=len(tasks), unit="rollouts",
                   note="loading the model") as beat:
        group = rt.rollout_group(model, mode, temperature=temperature, **({} if seed is None else {"seed": seed}))
        try:
            trajs: list[Any] = []
            for start in range(0, len(tasks), batch):
                beat.update(len(trajs), note=f"rollout batch {start // batch + 1}/{math.ceil(len(tasks) / batch)}")
                trajs += group.rollout(list(tasks[start:start + batch]))
        finally:
            rt.release(group)
        beat.update(len(trajs), note="scoring")
        return trajs, rt.score(trajs, tasks, f"hybrid_{mode}")


def evaluate(rt: Any, model: str, tasks: Sequence[Any], mode: str) -> dict[str, Any]:
    """Greedy rollouts of ``model`` on ``tasks`` in ``mode``; success = the reward's result part is 1."""
    t0 = time.perf_counter()
    trajs, breakdowns = _roll_out(rt, model, tasks, mode, mode, temperature=rt.cfg.eval.temperature)
    from sqlrl.eval.stats import wilson_interval

    by_kind: dict[str, list[float]] = {}
    per_task: dict[str, dict[str, Any]] = {}
    for task, traj, b in zip(tasks, trajs, breakdowns):
        ok_one = None if b.excluded else int(b.parts.get("result", 0.0) >= 1.0)
        per_task[task.task_id] = {"success": ok_one, "kind": task.kind,
                                  "difficulty": getattr(task, "difficulty", None), "domain": task.db_id,
                                  "answer": fingerprint(traj)}
        if ok_one is not None:
            by_kind.setdefault(task.kind, []).append(float(ok_one))
    ok = [x for v in by_kind.values() for x in v]
    out = {"model": model, "mode": mode, "n": len(tasks), "scored": len(ok),
           "success": sum(ok) / len(ok) if ok else 0.0,
           "successes": int(sum(ok)), "success_ci95": list(wilson_interval(int(sum(ok)), len(ok))),
           **{f"success_{k}": sum(v) / len(v) for k, v in sorted(by_kind.items())},
           "format_ok": mean(b.parts.get("format", 0.0) for b in breakdowns if not b.excluded),
           "mean_turns": mean(len(t.turns) for t in trajs),
           "stop_reasons": dict(Counter(t.stop_reason for t in trajs)),
           "seconds": round(time.perf_counter() - t0, 1), "per_task": per_task}
    console.print(f"  eval ({mode}) {Path(model).name}: success {success_text(out)}, format "
                  f"{out['format_ok']:.2f} on {out['scored']} tasks in {out['seconds']:.0f} s")
    return out


def evaluate_sampled(rt: Any, model: str, tasks: Sequence[Any], mode: str, k: int,
                     temperature: float) -> dict[str, Any]:
    """``k`` sampled rollouts of ``model`` per task at ``temperature``: avg@k and pass@k (module doc)."""
    from sqlrl.eval.stats import mean_interval

    if k < 2 or not temperature > 0:
        raise ValueError(f"a sampled evaluation needs k >= 2 and temperature > 0, got k={k}, temperature={temperature}")
    t0 = time.perf_counter()
    drawn = [t for t in tasks for _ in range(k)]
    label = f"{mode}@{k}"
    trajs, breakdowns = _roll_out(rt, model, drawn, mode, label, temperature=temperature, seed=rt.cfg.data.seed)
    solved: dict[str, list[int]] = {t.task_id: [] for t in tasks}
    for task, b in zip(drawn, breakdowns):
        if not b.excluded:
            solved[task.task_id].append(int(b.parts.get("result", 0.0) >= 1.0))
    per_task: dict[str, dict[str, Any]] = {}
    by_kind: dict[str, list[float]] = {}
    for task in tasks:
        xs = solved[task.task_id]
        rate = sum(xs) / len(xs) if xs else None
        per_task[task.task_id] = {"success": rate, "samples": len(xs), "kind": task.kind,
                                  "difficulty": getattr(task, "difficulty", None), "domain": task.db_id}
        if rate is not None:
            by_kind.setdefault(task.kind, []).append(rate)
    rates = [x for v in by_kind.values() for x in v]
    out = {"model": model, "mode": label, "rollout_mode": mode, "samples": k, "temperature": temperature,
           "n": len(tasks), "scored": len(rates), "success": mean(rates),
           "success_ci95": list(mean_interval(rates)),  # (0, 1) when no task was scored
           "pass_at_k": mean(float(r > 0) for r in rates), "successes": sum(sum(v) for v in solved.values()),
           "rollouts": len(drawn),
           **{f"success_{kind}": mean(v) for kind, v in sorted(by_kind.items())},
           "format_ok": mean(b.parts.get("format", 0.0) for b in breakdowns if not b.excluded),
           "mean_turns": mean(len(t.turns) for t in trajs),
           "stop_reasons": dict(Counter(t.stop_reason for t in trajs)),
           "seconds": round(time.perf_counter() - t0, 1), "per_task": per_task}
    console.print(f"  eval ({label}) {Path(model).name}: success (avg@{k}, T {temperature}) {success_text(out)}, "
                  f"pass@{k} {out['pass_at_k']:.2f}, format {out['format_ok']:.2f} on {out['scored']} tasks "
                  f"in {out['seconds']:.0f} s")
    return out


def evaluations(rt: Any, model: str, tasks: Sequence[Any], modes: Sequence[str]) -> list[dict[str, Any]]:
    """A checkpoint's evaluations as a stage makes them (``eval.*``): greedy in each of ``modes``,
    then sampled in ``eval.sampled_modes(modes)``."""
    e = rt.cfg.eval
    out = [evaluate(rt, model, tasks, m) for m in modes]
    return out + [evaluate_sampled(rt, model, tasks, m, e.samples, e.sample_temperature)
                  for m in e.sampled_modes(modes)]


def outcomes(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """Task id -> 1 / 0 / None of an evaluation summary, or None when it has no ``per_task``."""
    per_task = summary.get("per_task")
    return None if per_task is None else {t: v.get("success") for t, v in per_task.items()}


def compare(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any] | None:
    """``after - before`` on the tasks both evaluations scored (paired bootstrap, 95%), as a dict
    (``sqlrl.eval.stats.PairedDiff.to_dict``); None when either lacks ``per_task`` or they share
    no scored task."""
    from sqlrl.eval.stats import paired_difference

    b, a = outcomes(before), outcomes(after)
    if b is None or a is None:
        return None
    fractional = any((s.get("samples") or 1) > 1 for s in (before, after))
    try:
        out = paired_difference(b, a, fractional=fractional).to_dict()
    except ValueError:
        return None
    pb, pa = before["per_task"], after["per_task"]
    both = [t for t in pb if t in pa and (pb[t] or {}).get("answer") and (pa[t] or {}).get("answer")]
    if both:
        out.update(answers_compared=len(both), answers_changed=sum(pb[t]["answer"] != pa[t]["answer"] for t in both))
    return out


def fingerprint(traj: Any) -> str:
    """16 hex digits of SHA-256 over the model-generated token ids of a trajectory (the ids under
    its loss mask, in order): the same for two rollouts exactly when the model wrote the same."""
    import hashlib

    ids = [t for t, m in zip(traj.token_ids, traj.loss_mask) if m]
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def changes_since_earlier(run_dir: str | Path, stage: str, evals: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """See the module doc: each mode's change since the latest earlier stage evaluated in it."""
    import json

    from curriculum.stages import previous_stage

    earlier: list[tuple[str, dict]] = []
    before = previous_stage(stage)
    while before is not None:
        path = Path(run_dir) / before / "summary.json"
        try:
            earlier.append((before, json.loads(path.read_text()) if path.is_file() else {}))
        except (OSError, ValueError):
            pass
        before = previous_stage(before)
    out: dict[str, Any] = {}
    for e in evals:
        for name, summary in earlier:
            prev = next((x for x in summary.get("eval", ()) if isinstance(x, dict) and x.get("mode") == e["mode"]), None)
            if prev is not None:
                d = compare(prev, e)
                if d is not None:
                    out[e["mode"]] = {"vs": name, **d}
                break
    return out


def success_text(e: Mapping[str, Any]) -> str:
    """``0.25 [0.15, 0.37]``: the success rate and its 95% interval (the rate alone when the
    summary has no interval)."""
    ci = e.get("success_ci95")
    return f"{e['success']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def change_text(d: Mapping[str, Any]) -> str:
    """``+0.06 [-0.03, +0.16] (n=64, +9/-5, 21 answers changed)``: a paired difference, its
    interval, the tasks gained and lost, and (when both sides have answer fingerprints) on how many
    tasks the model's output changed at all; ``unmatched tasks!`` marks a comparison whose task
    sets differ (listed in ``d``)."""
    lo, hi = d["ci95"]
    mismatch = "" if not (d["only_before"] or d["only_after"] or d["unscored"]) else ", unmatched tasks!"
    answers = f", {d['answers_changed']} answers changed" if "answers_changed" in d else ""
    return f"{d['diff']:+.2f} [{lo:+.2f}, {hi:+.2f}] (n={d['n']}, +{d['gained']}/-{d['lost']}{answers}{mismatch})"


def mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0
