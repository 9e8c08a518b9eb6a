"""Training metrics on the Ray dashboard: a ``sqlrl.metrics.MetricsLogger`` sink of Ray gauges.

``ray_gauge_sink()`` returns ``sink(stage, step, metrics)`` that sets one ``ray.util.metrics.Gauge``
per metric name (``sqlrl_train_<name>``, tagged with the stage and the Ray job id of the process
that logs, so two runs of one stage stay two series), so the node's Prometheus endpoint (Prometheus
names: ``ray_sqlrl_train_<name>``; docs/monitoring.md) shows reward, pass rate, losses and phase
times as a job runs. Non-numeric values are skipped; names are sanitised to Prometheus' alphabet.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping


def _metric_name(key: str) -> str:
    return "sqlrl_train_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def ray_gauge_sink() -> Callable[[str, int, Mapping[str, Any]], None]:
    import ray
    from ray.util.metrics import Gauge

    gauges: dict[str, Any] = {}
    job_id = ray.get_runtime_context().get_job_id() if ray.is_initialized() else ""

    def sink(stage: str, step: int, metrics: Mapping[str, Any]) -> None:
        for key, value in {**metrics, "step": step}.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            name = _metric_name(key)
            if name not in gauges:
                gauges[name] = Gauge(name, description=f"sqlrl training metric {key}",
                                     tag_keys=("stage", "job_id"))
            gauges[name].set(float(value), tags={"stage": stage, "job_id": job_id})

    return sink
