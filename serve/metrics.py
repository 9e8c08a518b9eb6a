"""sqlrl's serving metrics (Ray metrics; Prometheus shows them as ``ray_sqlrl_serve_*``).

Next to Serve's own request metrics (``ray_serve_*``: request counts, latencies, queue lengths)
these say what the model did: ``sqlrl_serve_requests`` (counter: endpoint, model, status),
``sqlrl_serve_latency_ms`` (histogram: endpoint, model), ``sqlrl_serve_generated_tokens``
(counter: model), ``sqlrl_serve_tokens_per_s`` (gauge: model, of the last request),
``sqlrl_serve_batch_size`` (histogram: model, requests in the replica when one starts -- the
engine's running batch it joins), ``sqlrl_serve_tokens_per_s`` per request (its generated tokens
over its own wall time),
``sqlrl_serve_agent_turns`` and ``sqlrl_serve_tool_calls`` (histograms per SQL request).

Guarantees: created lazily once per process; recording never raises (a metrics failure must not
fail a request).
"""

from __future__ import annotations

from typing import Any

_M: dict[str, Any] = {}
_SIZE_BOUNDS = [1, 2, 4, 8, 16, 32, 64]
_MS_BOUNDS = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000]


def _metrics() -> dict[str, Any]:
    if not _M:
        from ray.util.metrics import Counter, Gauge, Histogram

        _M.update(
            requests=Counter("sqlrl_serve_requests", "requests answered",
                             tag_keys=("endpoint", "model", "status")),
            latency=Histogram("sqlrl_serve_latency_ms", "end-to-end latency in the ingress (ms)",
                              boundaries=_MS_BOUNDS, tag_keys=("endpoint", "model")),
            tokens=Counter("sqlrl_serve_generated_tokens", "tokens generated", tag_keys=("model",)),
            tps=Gauge("sqlrl_serve_tokens_per_s", "tokens/s of the last request",
                      tag_keys=("model",)),
            batch=Histogram("sqlrl_serve_batch_size", "requests in the replica when one starts",
                            boundaries=_SIZE_BOUNDS, tag_keys=("model",)),
            turns=Histogram("sqlrl_serve_agent_turns", "agent turns per SQL request",
                            boundaries=_SIZE_BOUNDS, tag_keys=("model",)),
            tool_calls=Histogram("sqlrl_serve_tool_calls", "tool calls per SQL request",
                                 boundaries=_SIZE_BOUNDS, tag_keys=("model",)))
    return _M


def record(kind: str, value: float, **tags: str) -> None:
    try:
        m = _metrics()[kind]
        if kind in ("requests", "tokens"):
            m.inc(value, tags=tags)
        elif kind == "tps":
            m.set(value, tags=tags)
        else:
            m.observe(value, tags=tags)
    except Exception:
        pass
