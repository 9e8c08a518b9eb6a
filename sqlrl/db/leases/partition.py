"""PartitionPlan: which DB-session shards exist and which caller may use which (Ray-free).

The rule, deterministic and documented in docs/pool.md:

- **Dialect groups.** The plan is configured per *dialect group*: a dialect name (``"sqlite"``) or
  several joined by ``+`` (``"postgresql+mysql"``: one shard serves both). Each dialect belongs to at
  most one group.
- **Rollout partition.** Every rollout worker *w* owns ``per_worker[group]`` shards of every group,
  with ids ``rollout/w<w>/<group>/<k>``. No other worker is ever routed to them, so two workers never
  contend for the same shard's threads, connections or lease slots.
- **Reward partition.** ``reward[group]`` shards, ids ``reward/<group>/<k>``, shared by all reward
  actors (their sessions are short: replay gold and predicted SQL, release).
- **Routing inside a caller's shard set**: ``crc32(key) % n`` over the caller's shards of the
  dialect's group (stable across processes, unlike ``hash``); callers pass the trajectory id as key.
- **Rebalancing** when the set of rollout workers changes: shard ids depend only on the worker index,
  so every surviving worker keeps its shards (and their warm connections), new workers get new
  shards, and departed workers' shards are drained and retired. Worker indices need not be dense.

Worker identity is the index a job gives each rollout worker when it creates it; nothing is parsed
from actor names or process ids.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..dialects.base import available_dialects
from .protocol import LeaseError, LeaseErrorKind

ROLES = ("rollout", "reward")


@dataclass(frozen=True)
class ShardSpec:
    id: str
    role: str  # "rollout" | "reward"
    group: str  # dialect group key, e.g. "sqlite" or "postgresql+mysql"
    dialects: tuple[str, ...]
    worker: int | None  # owning rollout worker; None for reward shards
    index: int  # k-th shard of this (role, worker, group)


@dataclass(frozen=True)
class Rebalance:
    plan: "PartitionPlan"
    added: tuple[ShardSpec, ...]  # shards to start
    removed: tuple[ShardSpec, ...]  # shards to drain and retire
    kept: tuple[str, ...]  # shard ids untouched


def _groups(counts: Mapping[str, int], what: str) -> tuple[tuple[str, int], ...]:
    known = set(available_dialects())
    seen: dict[str, str] = {}
    out = []
    for key, n in counts.items():
        dialects = tuple(key.split("+"))
        for d in dialects:
            if d not in known:
                raise ValueError(f"{what}: unknown dialect {d!r} in {key!r}; known: "
                                 f"{', '.join(sorted(known))}")
            if d in seen:
                raise ValueError(f"{what}: dialect {d!r} is in two groups ({seen[d]!r}, {key!r})")
            seen[d] = key
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"{what}[{key!r}] must be an integer >= 0, got {n!r}")
        if n:
            out.append((key, n))
    return tuple(sorted(out))


@dataclass(frozen=True)
class PartitionPlan:
    workers: tuple[int, ...]  # rollout worker indices
    per_worker: tuple[tuple[str, int], ...]  # (group, shards per rollout worker)
    reward: tuple[tuple[str, int], ...] = ()  # (group, reward shards)

    @classmethod
    def build(cls, rollout_workers: int | Iterable[int], per_worker: Mapping[str, int],
              reward: Mapping[str, int] | None = None) -> "PartitionPlan":
        """``per_worker={"sqlite": 1, "postgresql+mysql": 1}``; ``reward`` defaults to one shard
        per group."""
        groups = _groups(per_worker, "per_worker")
        reward_groups = _groups(reward if reward is not None else {g: 1 for g, _ in groups}, "reward")
        return cls(_workers(rollout_workers), groups, reward_groups)

    def shards(self) -> tuple[ShardSpec, ...]:
        out = [ShardSpec(f"rollout/w{w}/{g}/{k}", "rollout", g, tuple(g.split("+")), w, k)
               for w in self.workers for g, n in self.per_worker for k in range(n)]
        out += [ShardSpec(f"reward/{g}/{k}", "reward", g, tuple(g.split("+")), None, k)
                for g, n in self.reward for k in range(n)]
        return tuple(out)

    def shard_ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.shards())

    def shards_for(self, role: str, worker: int | None = None,
                   dialect: str | None = None) -> tuple[ShardSpec, ...]:
        """The shards a caller may use: a rollout worker's own, or the reward partition."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        if role == "rollout" and worker not in self.workers:
            raise ValueError(f"rollout worker {worker!r} is not in this plan (workers: "
                             f"{', '.join(map(str, self.workers)) or 'none'})")
        return tuple(s for s in self.shards()
                     if s.role == role and (role == "reward" or s.worker == worker)
                     and (dialect is None or dialect in s.dialects))

    def pick(self, role: str, worker: int | None, dialect: str, key: str) -> str:
        """The shard id for one trajectory (``key``) of a caller on ``dialect``."""
        candidates = self.shards_for(role, worker, dialect)
        if not candidates:
            served = sorted({d for s in self.shards_for(role, worker) for d in s.dialects})
            raise LeaseError(LeaseErrorKind.BAD_REQUEST,
                             f"no {role} shard serves dialect {dialect!r} "
                             f"(this pool serves: {', '.join(served) or 'nothing'})")
        return candidates[zlib.crc32(key.encode()) % len(candidates)].id

    def rebalance(self, rollout_workers: int | Iterable[int]) -> Rebalance:
        new = PartitionPlan(_workers(rollout_workers), self.per_worker, self.reward)
        old_ids, new_ids = set(self.shard_ids()), set(new.shard_ids())
        return Rebalance(
            plan=new,
            added=tuple(s for s in new.shards() if s.id not in old_ids),
            removed=tuple(s for s in self.shards() if s.id not in new_ids),
            kept=tuple(i for i in new.shard_ids() if i in old_ids))


def _workers(spec: int | Iterable[int]) -> tuple[int, ...]:
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"rollout_workers must be >= 0, got {spec}")
        return tuple(range(spec))
    workers = tuple(sorted(set(spec)))
    if any(not isinstance(w, int) or w < 0 for w in workers):
        raise ValueError(f"rollout worker indices must be integers >= 0, got {workers}")
    return workers
