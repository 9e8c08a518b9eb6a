"""What the stage jobs print and log: one console for all of them, the per-stage metrics logger.

Guarantees:
- ``console`` is the one console (stderr) every stage-job module prints on, so ``jobs.main``'s
  progress display (on the same console) keeps their lines above it in a terminal; off a terminal
  it prints plain unwrapped lines (``jobs.console.make_console``).
- ``stage_logger`` writes every step's metrics to ``<run_dir>/metrics.jsonl``, TensorBoard and the
  PNG curves (``sqlrl.metrics.MetricsLogger``), plus Ray gauges for the dashboard when the job
  runs on Ray (``actors.metrics``, imported only then).
"""

from __future__ import annotations

from typing import Any

from curriculum.config import StageConfig
from jobs.console import Heartbeat, make_console

console = make_console(stderr=True)


def stage_logger(cfg: StageConfig) -> Any:
    from sqlrl.metrics import MetricsLogger

    sinks = []
    if cfg.cluster.ray:
        from actors.metrics import ray_gauge_sink

        sinks.append(ray_gauge_sink())
    return MetricsLogger(cfg.run_dir, cfg.stage, sinks=sinks)


def build_phase(cfg: StageConfig, what: str, n: int) -> Heartbeat:
    """The heartbeat of a stage's data build (teacher / verification of ``n`` tasks)."""
    return Heartbeat(f"{cfg.stage} data: {what}", total=None, unit="", note=f"{n} tasks")
