"""A local Ray instance for the actor tests (loopback), the same one for every module of the session
while nobody else touches Ray.

``num_cpus=8`` logical CPUs on a 2-core machine lets many small actors schedule (shards ask for
0.25 each). The dashboard agent runs (``include_dashboard=True``) because the metrics tests read
its Prometheus endpoint; metrics are reported every second instead of Ray's default 10 s.

Each module checks, when it starts, that this instance is the one connected (namespace
``sqlrl-tests``), and starts it again if not: in a random test order another module may have run
in between and shut it down (tests/e2e/test_serve.py starts a private instance of its own), and a
Ray call without a connection would start Ray's default instance (one logical CPU per core, too
few for the chaos test's actors: it waited forever for one to be scheduled).
"""

from __future__ import annotations

import pytest

NAMESPACE = "sqlrl-tests"


def _ours(ray) -> bool:
    return ray.is_initialized() and ray.get_runtime_context().namespace == NAMESPACE


def stop_ours() -> None:
    """Shut the actor tests' instance down when it is the one connected (never imports Ray)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and _ours(ray):
        ray.shutdown()


@pytest.fixture(scope="session")
def _ray_instance():
    """Shuts the actor tests' instance down at the end of the session (when it is still up)."""
    yield
    stop_ours()


@pytest.fixture(scope="module")
def ray_session(_ray_instance):
    import ray

    if not _ours(ray):
        if ray.is_initialized():  # another module's instance, still connected: not the one set up here
            ray.shutdown()
        ray.init(num_cpus=8, include_dashboard=True, dashboard_host="127.0.0.1",
                 log_to_driver=False, namespace=NAMESPACE,
                 _system_config={"metrics_report_interval_ms": 1000})
    yield ray
