"""Where a verl agent-loop worker's sessions come from: its own partition of the DB-session pool,
or local sessions when no pool is configured.

verl starts ``rollout.agent.num_workers`` ``AgentLoopWorker`` actors and does not tell them their
index. The driver (``publish_pool``) therefore publishes a ``PoolDirectory``: a named Ray actor
holding one picklable ``PoolClient`` per rollout-worker partition of a ``DBPoolGroup`` (built
with ``rollout_workers = num_workers``). Each worker process claims an index there once, keyed by
its own Ray actor id -- never by parsing actor names -- and leases only from that partition's shards.
A pool built ``in_process`` (no Ray) is published in this process instead, and claimed by the
process id (every worker of one process shares its partition: the in-process run has one).

Guarantees:
- ``WorkerSlots.claim(owner)``: the same owner always gets the same index; different owners get
  different indices, the smallest free one; more owners than slots is a ``RuntimeError`` that
  names the sizes (the pool must be built for ``agent.num_workers`` workers).
- ``worker_sessions(catalog=…, pool=…)`` returns one ``SessionSource`` per process and arguments
  (cached): ``PoolSessions`` on this worker's partition when ``pool`` names a directory, else
  ``LocalSessions`` over the catalog (a JSON file ``{db_id: {dialect: url}}`` or a mapping).
  Neither given is a ``ValueError``.
- ``unpublish_pool(name)`` forgets an in-process published pool and this process's cached source
  on it, so a pool shut down leaves nothing behind and its name can be published again.

Not guaranteed here: the pool's own rules (TTL, routing, retries: ``sqlrl.db.leases.client``).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from sqlrl.db.source import LocalSessions, PoolSessions, SessionSource

_SOURCES: dict[tuple[str, str], SessionSource] = {}
_SOURCES_LOCK = threading.Lock()
_LOCAL_DIRECTORIES: dict[str, "PoolDirectory"] = {}  # pools published in_process, by name


class WorkerSlots:
    """Indices ``0..n-1`` handed to owners (agent-loop worker processes), one each, for good."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"need at least one slot, got {n}")
        self.n = n
        self._owners: dict[str, int] = {}
        self._lock = threading.Lock()

    def claim(self, owner: str) -> int:
        with self._lock:
            if owner in self._owners:
                return self._owners[owner]
            free = sorted(set(range(self.n)) - set(self._owners.values()))
            if not free:
                raise RuntimeError(f"all {self.n} DB-pool partitions are claimed by other agent-loop "
                                   f"workers; build the pool with rollout_workers = "
                                   f"actor_rollout_ref.rollout.agent.num_workers")
            self._owners[owner] = free[0]
            return free[0]


class PoolDirectory:
    """The named actor's state: one pool client per partition, handed out by ``WorkerSlots``."""

    def __init__(self, clients: Sequence[Any]) -> None:
        self.clients = list(clients)
        self.slots = WorkerSlots(len(self.clients))

    def claim(self, owner: str) -> tuple[int, Any]:
        index = self.slots.claim(owner)
        return index, self.clients[index]


def publish_pool(group: Any, name: str, namespace: str | None = None) -> Any:
    """Publish ``group``'s (a ``DBPoolGroup``) rollout partitions as the detached named actor
    ``name``, for the agent-loop workers (``pool: <name>`` in the agent-loop YAML); an
    ``in_process`` pool is published in this process (no Ray)."""
    clients = [group.client(worker=w) for w in group.plan.workers]
    if group.config.in_process:
        _LOCAL_DIRECTORIES[name] = PoolDirectory(clients)
        return _LOCAL_DIRECTORIES[name]
    import ray

    return ray.remote(num_cpus=0)(PoolDirectory).options(
        name=name, namespace=namespace, lifetime="detached", get_if_exists=True).remote(clients)


def unpublish_pool(name: str) -> None:
    """Forget the in-process pool published as ``name`` and the cached source on it (the caller
    shuts its group down); unknown names are ignored."""
    with _SOURCES_LOCK:
        _LOCAL_DIRECTORIES.pop(name, None)
        _SOURCES.pop(("pool", name), None)


def _claim_from(pool: str) -> Any:
    if pool in _LOCAL_DIRECTORIES:
        return _LOCAL_DIRECTORIES[pool].claim(f"pid-{os.getpid()}")[1]
    import ray

    owner = ray.get_runtime_context().get_actor_id() or ray.get_runtime_context().get_worker_id()
    directory = ray.get_actor(pool)
    _, client = ray.get(directory.claim.remote(owner))
    return client


def load_catalog(catalog: Any) -> dict[str, dict[str, str]]:
    """A catalog from a mapping or a JSON file ``{db_id: {dialect: url}}``."""
    if isinstance(catalog, Mapping):
        return {str(k): dict(v) for k, v in catalog.items()}
    path = Path(str(catalog))
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{path}: a catalog is a JSON object {{db_id: {{dialect: url}}}}")
    return data


def worker_sessions(*, catalog: Any = None, pool: str | None = None) -> SessionSource:
    """This process's session source (see the module doc); created once per arguments."""
    if pool is None and catalog is None:
        raise ValueError("the sqlrl agent loop needs `pool` (a published DB-pool directory) or "
                         "`catalog` (local sessions); set one in the agent-loop YAML")
    if isinstance(catalog, Mapping):  # a mapping (an OmegaConf DictConfig from the YAML too)
        catalog = load_catalog(catalog)
    key = ("pool", pool) if pool is not None else ("catalog", json.dumps(catalog, sort_keys=True))
    with _SOURCES_LOCK:
        if key not in _SOURCES:
            _SOURCES[key] = (PoolSessions(_claim_from(pool)) if pool is not None
                             else LocalSessions(load_catalog(catalog)))
        return _SOURCES[key]
