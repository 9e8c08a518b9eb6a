"""The gateway's Prometheus gauges (``sqlrl_gateway_*``; Prometheus: ``ray_sqlrl_gateway_*``): every
``GatewayStats`` field plus ``calls_per_s`` and ``generated_tokens_per_s`` over the last tick,
tagged with the Ray job id. Setting them never raises (metrics must never break the gateway)."""

from __future__ import annotations

from typing import Any

from sqlrl.config import to_dict
from sqlrl.gateway.rollouts import GatewayStats


class Gauges:
    """``sqlrl_gateway_*`` Ray gauges from ``GatewayStats`` (module docstring); never raises."""

    def __init__(self) -> None:
        self._g: dict[str, Any] = {}
        self._last: tuple[float, GatewayStats] | None = None

    def set(self, stats: GatewayStats, now: float) -> None:
        try:
            import ray
            from ray.util.metrics import Gauge

            job = ray.get_runtime_context().get_job_id() if ray.is_initialized() else ""
            values = {k: float(v) for k, v in to_dict(stats).items()}
            if self._last is not None and now > self._last[0]:
                dt, before = now - self._last[0], self._last[1]
                values["calls_per_s"] = (stats.calls - before.calls) / dt
                values["generated_tokens_per_s"] = (stats.generated_tokens - before.generated_tokens) / dt
            self._last = (now, stats)
            for name, value in values.items():
                if name not in self._g:
                    self._g[name] = Gauge(f"sqlrl_gateway_{name}", f"sqlrl gateway: {name}", tag_keys=("job_id",))
                self._g[name].set(value, tags={"job_id": job})
        except Exception:
            pass  # metrics must never break the gateway
