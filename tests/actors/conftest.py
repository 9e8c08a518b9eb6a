"""One local Ray instance for every actor test of the session (started on first use, loopback).

``num_cpus=8`` logical CPUs on a 2-core machine lets many small actors schedule (shards ask for
0.25 each). The dashboard agent runs (``include_dashboard=True``) because the metrics tests read
its Prometheus endpoint; metrics are reported every second instead of Ray's default 10 s.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=8, include_dashboard=True, dashboard_host="127.0.0.1",
                 log_to_driver=False, namespace="sqlrl-tests",
                 _system_config={"metrics_report_interval_ms": 1000})
    yield ray
    ray.shutdown()
