"""Held-out evaluation of a checkpoint: greedy rollouts on the eval tasks, scored by the rewards.

Guarantees:
- ``evaluate(rt, model, tasks, mode)`` rolls every task out once in ``mode`` at
  ``eval.temperature`` (0: greedy) in batches of ``rollout.batch``, on the job's rollout workers,
  and scores them with ``hybrid_<mode>`` on the job's reward scorers.
- Success = the reward's ``result`` part is 1; reported overall and per task kind
  (``success_<kind>``), over the tasks that were scored (an excluded task -- a broken reference or
  a failed rollout -- counts in ``n`` but not in ``scored``). ``format_ok`` is the mean format part.
- The rollout workers are released before scoring starts; a heartbeat runs throughout.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

from jobs.console import Heartbeat
from jobs.output import console


def evaluate(rt: Any, model: str, tasks: Sequence[Any], mode: str) -> dict[str, Any]:
    """Greedy rollouts of ``model`` on ``tasks`` in ``mode``; success = the reward's result part is 1."""
    t0 = time.perf_counter()
    batch = rt.cfg.rollout.batch
    with Heartbeat(f"eval ({mode}) {Path(model).name}", total=len(tasks), unit="tasks rolled out",
                   note="loading the model") as beat:
        group = rt.rollout_group(model, mode, temperature=rt.cfg.eval.temperature)
        try:
            trajs = []
            for start in range(0, len(tasks), batch):
                beat.update(len(trajs), note=f"rollout batch {start // batch + 1}/{math.ceil(len(tasks) / batch)}")
                trajs += group.rollout(list(tasks[start:start + batch]))
        finally:
            rt.release(group)
        beat.update(len(trajs), note="scoring")
        breakdowns = rt.score(trajs, tasks, f"hybrid_{mode}")
    by_kind: dict[str, list[float]] = {}
    for task, b in zip(tasks, breakdowns):
        if not b.excluded:
            by_kind.setdefault(task.kind, []).append(float(b.parts.get("result", 0.0) >= 1.0))
    ok = [x for v in by_kind.values() for x in v]
    out = {"model": model, "mode": mode, "n": len(tasks), "scored": len(ok),
           "success": sum(ok) / len(ok) if ok else 0.0,
           **{f"success_{k}": sum(v) / len(v) for k, v in sorted(by_kind.items())},
           "format_ok": mean(b.parts.get("format", 0.0) for b in breakdowns if not b.excluded),
           "mean_turns": mean(len(t.turns) for t in trajs),
           "stop_reasons": dict(Counter(t.stop_reason for t in trajs)),
           "seconds": round(time.perf_counter() - t0, 1)}
    console.print(f"  eval ({mode}) {Path(model).name}: success {out['success']:.2f}, format "
                  f"{out['format_ok']:.2f} on {out['scored']} tasks in {out['seconds']:.0f} s")
    return out


def mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0
