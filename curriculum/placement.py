"""Placement profiles: what each kind of sqlrl actor asks Ray for, read from ``deploy/placement.yaml``.

That one file is the single source for both sides of a deployment: the stage jobs
(``cluster.placement=<profile>``; ``jobs/runtime.py`` passes each ask to the actors it starts)
and the cluster files (``cluster.yaml``, ``deploy/aws-gpu.yaml``, ``deploy/k8s/*.yaml``), which
``tests/packaging/test_cluster_files.py`` checks against it.

Guarantees:
- ``load_profile(name)`` returns a frozen ``Profile`` with one ``ActorAsk`` per kind in ``KINDS``.
  An unknown profile, a missing or unknown kind, an unknown key, a negative or non-numeric amount,
  or GPUs for a kind that never uses one (reward, db_shard) is a ``ValueError`` that names the file
  and the key.
- ``job_actors(cfg)`` lists the actors a stage job runs at its peak, each with its ask: rollout
  workers, learner ranks, reward actors and DB-pool shards (one per rollout worker plus the reward
  partition, as ``jobs/runtime.py`` lays the pool out; a test ties the two).
- ``unplaced(actors, nodes)`` places actors on nodes first-fit, largest ask first (GPUs, then
  custom resources, then CPUs), and returns the actors that found no node. It checks that the
  declared resources can hold the job. It does not simulate Ray's scheduler, and it knows nothing
  of memory or of the hardware behind a declared GPU.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

PLACEMENT_FILE = Path(__file__).resolve().parents[1] / "deploy" / "placement.yaml"
KINDS = ("rollout", "learner", "reward", "db_shard", "serve")
_GPU_KINDS = ("rollout", "learner", "serve")
_KEYS = ("num_cpus", "num_gpus", "resources")


@dataclass(frozen=True)
class ActorAsk:
    """What one actor of a kind asks Ray for (``ray.remote(...).options(**ask.options())``)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)

    def options(self) -> dict[str, Any]:
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
                "resources": dict(self.resources) or None}

    def demand(self) -> dict[str, float]:
        """The resources as Ray counts them (``CPU``, ``GPU``, custom names); zeros left out."""
        out = {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}
        return {k: float(v) for k, v in out.items() if v}


@dataclass(frozen=True)
class Profile:
    name: str
    rollout: ActorAsk
    learner: ActorAsk
    reward: ActorAsk
    db_shard: ActorAsk
    serve: ActorAsk

    def ask(self, kind: str) -> ActorAsk:
        if kind not in KINDS:
            raise ValueError(f"unknown actor kind {kind!r}; known: {', '.join(KINDS)}")
        return getattr(self, kind)

    def custom_resources(self) -> set[str]:
        return {r for kind in KINDS for r in self.ask(kind).resources}

    def with_cpus(self, *, rollout: float | None = None, learner: float | None = None) -> "Profile":
        """The profile with one run's CPU overrides (``None`` keeps the profile's)."""
        out = self
        if rollout is not None:
            out = replace(out, rollout=replace(out.rollout, num_cpus=float(rollout)))
        if learner is not None:
            out = replace(out, learner=replace(out.learner, num_cpus=float(learner)))
        return out


def profile_names(path: str | Path = PLACEMENT_FILE) -> list[str]:
    return list(_read(str(path)))


def load_profile(name: str, path: str | Path = PLACEMENT_FILE) -> Profile:
    profiles = _read(str(path))
    if name not in profiles:
        raise ValueError(f"unknown placement profile {name!r} (cluster.placement); profiles in {path}: "
                         f"{', '.join(profiles) or 'none'}")
    return profiles[name]


@functools.lru_cache(maxsize=8)
def _read(path: str) -> dict[str, Profile]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"placement file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"placement file {p} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or set(data) != {"profiles"} or not isinstance(data["profiles"], dict):
        raise ValueError(f"placement file {p} must hold one mapping 'profiles: {{name: {{kind: ask}}}}'")
    return {str(name): _profile(p, str(name), body) for name, body in data["profiles"].items()}


def _profile(path: Path, name: str, body: Any) -> Profile:
    where = f"{path}: profiles.{name}"
    if not isinstance(body, dict):
        raise ValueError(f"{where} must be a mapping of actor kinds ({', '.join(KINDS)})")
    unknown = sorted(set(body) - set(KINDS))
    missing = [k for k in KINDS if k not in body]
    if unknown or missing:
        raise ValueError(f"{where}: unknown kinds {unknown}, missing kinds {missing} "
                         f"(every profile names each of {', '.join(KINDS)})")
    return Profile(name, **{kind: _ask(f"{where}.{kind}", kind, body[kind]) for kind in KINDS})


def _ask(where: str, kind: str, body: Any) -> ActorAsk:
    if not isinstance(body, dict) or set(body) - set(_KEYS):
        raise ValueError(f"{where} must be a mapping with keys among {', '.join(_KEYS)}, got {body!r}")
    cpus = _amount(f"{where}.num_cpus", body.get("num_cpus", 1.0))
    gpus = _amount(f"{where}.num_gpus", body.get("num_gpus", 0.0))
    if gpus and kind not in _GPU_KINDS:
        raise ValueError(f"{where}.num_gpus: a {kind} actor never uses a GPU (GPU kinds: {', '.join(_GPU_KINDS)})")
    resources = body.get("resources") or {}
    if not isinstance(resources, dict):
        raise ValueError(f"{where}.resources must be a mapping of custom resource names to amounts")
    for r in resources:
        if r in ("CPU", "GPU", "memory") or not str(r).replace("_", "").isalnum():
            raise ValueError(f"{where}.resources: {r!r} is not a custom resource name (letters, digits, _)")
    return ActorAsk(cpus, gpus, {str(r): _amount(f"{where}.resources.{r}", v) for r, v in resources.items()})


def _amount(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where} must be a number >= 0, got {value!r}")
    return float(value)


# ------------------------------------------------------------------------------- jobs and nodes

def pool_shards(rollout_workers: int) -> int:
    """DB-pool shards of a stage job: one per rollout worker + one reward partition (jobs/runtime.py:
    ``per_worker={dialects: 1}, reward={dialects: 1}``)."""
    return max(1, rollout_workers) + 1


def job_actors(cluster: Any) -> list[tuple[str, ActorAsk]]:
    """``(kind, ask)`` for every actor a stage job with this ``ClusterConfig`` runs at its peak."""
    asks = cluster.asks()
    out = [("rollout", asks.rollout)] * cluster.rollout_workers
    out += [("learner", asks.learner)] * cluster.learner_ranks
    out += [("reward", asks.reward)] * cluster.reward_actors
    out += [("db_shard", asks.db_shard)] * pool_shards(cluster.rollout_workers)
    return out


def unplaced(actors: Sequence[tuple[str, ActorAsk]], nodes: Sequence[Mapping[str, float]]
             ) -> list[tuple[str, ActorAsk]]:
    """The actors that do not fit on ``nodes`` (each a mapping of Ray resources to amounts)."""
    free = [dict(n) for n in nodes]

    def size(item: tuple[str, ActorAsk]) -> tuple[float, float, float]:
        d = item[1].demand()
        return (d.get("GPU", 0.0), sum(v for k, v in d.items() if k not in ("CPU", "GPU")), d.get("CPU", 0.0))

    left = []
    for item in sorted(actors, key=size, reverse=True):
        need = item[1].demand()
        for node in free:
            if all(node.get(k, 0.0) + 1e-9 >= v for k, v in need.items()):
                for k, v in need.items():
                    node[k] = node.get(k, 0.0) - v
                break
        else:
            left.append(item)
    return left
