"""Held-out evaluation of a checkpoint: greedy rollouts on the eval tasks, scored by the rewards.

Guarantees:
- ``evaluate(rt, model, tasks, mode)`` rolls every task out once in ``mode`` at
  ``eval.temperature`` (0: greedy) on the job's rollout workers (``rollout.batch`` at once each),
  and scores them with ``hybrid_<mode>`` on the job's reward scorers. It returns an
  ``Evaluation`` (frozen; ``to_dict()`` is its ``summary.json`` entry, the keys named below) with
  one ``TaskResult`` per task.
- Success = ``sqlrl.rl.outcome.solved`` (the reward's ``result`` part is 1: the one definition the
  GRPO loop's pass rate uses too); reported overall and per task kind
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
- ``compare(before, after)`` (``Evaluation``s or their dicts, e.g. read back from a summary) is the paired bootstrap difference of two such summaries (matched by
  task id; tasks on one side only are reported in it; per-task rates when either is sampled), or
  None when either has no ``per_task``; with ``answers_changed`` (of ``answers_compared``) when both
  carry answer fingerprints.
- ``changes_since_earlier(run_dir, stage, evals)``: for each of ``evals``, the paired difference
  against the latest earlier stage of ``curriculum.stages.STAGES`` whose ``<run_dir>/<stage>/summary.json``
  holds an evaluation in the same mode (``{mode: {"vs": stage, **difference}}``; modes with no
  earlier evaluation, or none comparable, are left out).
- Rollouts run on the job's rollout workers (``jobs.runtime.Runtime``: one set of engines per job,
  kept running between evaluations; a checkpoint of the same model family is loaded into them,
  not started anew); a heartbeat runs throughout.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from jobs.console import Heartbeat
from jobs.output import console
from sqlrl.rl.outcome import mean, outcome


def _roll_out(rt: Any, model: str, tasks: Sequence[Any], mode: str, label: str, *, temperature: float,
              seed: int | None = None) -> tuple[list[Any], list[Any]]:
    """One rollout of each of ``tasks`` (repeats allowed), all in one call to the rollout workers
    (each runs ``rollout.batch`` at once), then their breakdowns."""
    with Heartbeat(f"eval ({label}) {Path(model).name}", total=len(tasks), unit="rollouts",
                   note="loading the model") as beat:
        group = rt.rollout_group(model, mode, temperature=temperature, **({} if seed is None else {"seed": seed}))
        try:
            beat.update(0, note=f"rolling out {len(tasks)}")
            trajs = list(group.rollout(list(tasks)))
        finally:
            rt.release(group)
        beat.update(len(trajs), note="scoring")
        return trajs, rt.score(trajs, tasks, f"hybrid_{mode}")


@dataclass(frozen=True)
class TaskResult:
    """One held-out task's outcome: ``success`` is 1 / 0 (greedy), the solve rate of its samples
    (sampled), or None (excluded: not scored)."""

    success: float | None
    kind: str
    difficulty: str | None
    domain: str
    answer: str | None = None  # greedy: ``fingerprint`` of what the model generated
    samples: int | None = None  # sampled: how many of its samples were scored

    def to_dict(self) -> dict[str, Any]:
        head = {"success": self.success, **({} if self.samples is None else {"samples": self.samples})}
        return {**head, "kind": self.kind, "difficulty": self.difficulty, "domain": self.domain,
                **({} if self.answer is None else {"answer": self.answer})}


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of a checkpoint in one mode (the module doc says what each number is);
    ``to_dict()`` is its entry in ``summary.json`` / ``results.json``."""

    model: str
    mode: str  # "single", "agentic", or "<mode>@<k>" for a sampled one
    n: int
    scored: int
    success: float
    successes: int
    success_ci95: tuple[float, float]
    by_kind: Mapping[str, float]  # success per task kind (``success_<kind>``)
    format_ok: float
    mean_turns: float
    stop_reasons: Mapping[str, int]
    seconds: float
    per_task: Mapping[str, TaskResult]
    sampling: Mapping[str, Any] | None = None  # sampled: rollout_mode, samples, temperature, pass_at_k, rollouts

    def to_dict(self) -> dict[str, Any]:
        kinds = {f"success_{k}": v for k, v in sorted(self.by_kind.items())}
        tail = {**kinds, "format_ok": self.format_ok, "mean_turns": self.mean_turns,
                "stop_reasons": dict(self.stop_reasons), "seconds": self.seconds,
                "per_task": {t: r.to_dict() for t, r in self.per_task.items()}}
        head = {"model": self.model, "mode": self.mode}
        if self.sampling is None:
            return {**head, "n": self.n, "scored": self.scored, "success": self.success,
                    "successes": self.successes, "success_ci95": list(self.success_ci95), **tail}
        s = self.sampling
        return {**head, "rollout_mode": s["rollout_mode"], "samples": s["samples"], "temperature": s["temperature"],
                "n": self.n, "scored": self.scored, "success": self.success,
                "success_ci95": list(self.success_ci95), "pass_at_k": s["pass_at_k"], "successes": self.successes,
                "rollouts": s["rollouts"], **tail}


def evaluate(rt: Any, model: str, tasks: Sequence[Any], mode: str) -> Evaluation:
    """Greedy rollouts of ``model`` on ``tasks`` in ``mode``; success = ``sqlrl.rl.outcome.solved``."""
    t0 = time.perf_counter()
    trajs, breakdowns = _roll_out(rt, model, tasks, mode, mode, temperature=rt.cfg.eval.temperature)
    from sqlrl.eval.stats import wilson_interval

    by_kind: dict[str, list[float]] = {}
    per_task: dict[str, TaskResult] = {}
    for task, traj, b in zip(tasks, trajs, breakdowns):
        ok_one = outcome(b)
        per_task[task.task_id] = TaskResult(ok_one, task.kind, getattr(task, "difficulty", None), task.db_id,
                                            answer=fingerprint(traj))
        if ok_one is not None:
            by_kind.setdefault(task.kind, []).append(float(ok_one))
    ok = [x for v in by_kind.values() for x in v]
    out = Evaluation(model=model, mode=mode, n=len(tasks), scored=len(ok), success=sum(ok) / len(ok) if ok else 0.0,
                     successes=int(sum(ok)), success_ci95=wilson_interval(int(sum(ok)), len(ok)),
                     by_kind={k: sum(v) / len(v) for k, v in by_kind.items()},
                     format_ok=mean(b.parts.get("format", 0.0) for b in breakdowns if not b.excluded),
                     mean_turns=mean(len(t.turns) for t in trajs),
                     stop_reasons=dict(Counter(t.stop_reason for t in trajs)),
                     seconds=round(time.perf_counter() - t0, 1), per_task=per_task)
    console.print(f"  eval ({mode}) {Path(model).name}: success {success_text(out)}, format "
                  f"{out.format_ok:.2f} on {out.scored} tasks in {out.seconds:.0f} s")
    return out


def evaluate_sampled(rt: Any, model: str, tasks: Sequence[Any], mode: str, k: int,
                     temperature: float) -> Evaluation:
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
        if (one := outcome(b)) is not None:
            solved[task.task_id].append(one)
    per_task: dict[str, TaskResult] = {}
    by_kind: dict[str, list[float]] = {}
    for task in tasks:
        xs = solved[task.task_id]
        rate = sum(xs) / len(xs) if xs else None
        per_task[task.task_id] = TaskResult(rate, task.kind, getattr(task, "difficulty", None), task.db_id,
                                            samples=len(xs))
        if rate is not None:
            by_kind.setdefault(task.kind, []).append(rate)
    rates = [x for v in by_kind.values() for x in v]
    out = Evaluation(model=model, mode=label, n=len(tasks), scored=len(rates), success=mean(rates),
                     successes=sum(sum(v) for v in solved.values()),
                     success_ci95=mean_interval(rates),  # (0, 1) when no task was scored
                     by_kind={kind: mean(v) for kind, v in by_kind.items()},
                     format_ok=mean(b.parts.get("format", 0.0) for b in breakdowns if not b.excluded),
                     mean_turns=mean(len(t.turns) for t in trajs),
                     stop_reasons=dict(Counter(t.stop_reason for t in trajs)),
                     seconds=round(time.perf_counter() - t0, 1), per_task=per_task,
                     sampling={"rollout_mode": mode, "samples": k, "temperature": temperature,
                               "pass_at_k": mean(float(r > 0) for r in rates), "rollouts": len(drawn)})
    console.print(f"  eval ({label}) {Path(model).name}: success (avg@{k}, T {temperature}) {success_text(out)}, "
                  f"pass@{k} {out.sampling['pass_at_k']:.2f}, format {out.format_ok:.2f} on {out.scored} tasks "  # type: ignore[index]
                  f"in {out.seconds:.0f} s")
    return out


def evaluations(rt: Any, model: str, tasks: Sequence[Any], modes: Sequence[str]) -> list[Evaluation]:
    """A checkpoint's evaluations as a stage makes them (``eval.*``): greedy in each of ``modes``,
    then sampled in ``eval.sampled_modes(modes)``."""
    e = rt.cfg.eval
    out = [evaluate(rt, model, tasks, m) for m in modes]
    return out + [evaluate_sampled(rt, model, tasks, m, e.samples, e.sample_temperature)
                  for m in e.sampled_modes(modes)]


def as_dict(e: "Evaluation | Mapping[str, Any]") -> Mapping[str, Any]:
    """An evaluation as its ``summary.json`` entry (a summary read back from a file already is one)."""
    return e.to_dict() if isinstance(e, Evaluation) else e


def outcomes(summary: "Evaluation | Mapping[str, Any]") -> dict[str, Any] | None:
    """Task id -> 1 / 0 / None of an evaluation summary, or None when it has no ``per_task``."""
    summary = as_dict(summary)
    per_task = summary.get("per_task")
    return None if per_task is None else {t: v.get("success") for t, v in per_task.items()}


def compare(before: "Evaluation | Mapping[str, Any]", after: "Evaluation | Mapping[str, Any]") -> dict[str, Any] | None:
    """``after - before`` on the tasks both evaluations scored (paired bootstrap, 95%), as a dict
    (``sqlrl.eval.stats.PairedDiff.to_dict``); None when either lacks ``per_task`` or they share
    no scored task."""
    from sqlrl.eval.stats import paired_difference

    before, after = as_dict(before), as_dict(after)
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


def changes_since_earlier(run_dir: str | Path, stage: str,
                          evals: "Sequence[Evaluation | Mapping[str, Any]]") -> dict[str, Any]:
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
    for e in map(as_dict, evals):
        for name, summary in earlier:
            prev = next((x for x in summary.get("eval", ()) if isinstance(x, dict) and x.get("mode") == e["mode"]), None)
            if prev is not None:
                d = compare(prev, e)
                if d is not None:
                    out[e["mode"]] = {"vs": name, **d}
                break
    return out


def success_text(e: "Evaluation | Mapping[str, Any]") -> str:
    """``0.25 [0.15, 0.37]``: the success rate and its 95% interval (the rate alone when the
    summary has no interval)."""
    e = as_dict(e)
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
