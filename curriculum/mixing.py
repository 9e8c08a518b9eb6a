"""Task mixing: how many tasks of each pool a stage trains on (Zeno = debugging + text-to-SQL,
Talon = debugging only).

    cfg = MixtureConfig({"critic": 0.5, "text2sql": 0.5}, size=2000, seed=0)
    tasks = mix({"critic": critic_tasks, "text2sql": text2sql_tasks}, cfg)

Per-stage mixtures are configuration: ``mixtures_from_config({"stage3": {"weights": {...},
"size": N, "seed": 0}, ...})`` (e.g. a YAML section), and the presets ``ZENO`` / ``TALON`` hold
the weights of the two models.

Guarantees:
- **Exact counts.** Pool ``p`` gets ``allocate(weights, size)[p]`` tasks: ``size * w_p / sum(w)``
  rounded by the largest-remainder method (floors first; the leftover units go to the largest
  fractional parts, ties to the alphabetically first pool), so the counts sum to ``size``
  exactly and each is within 1 of its exact share.
- **Without replacement while possible.** A pool with at least its count of tasks contributes
  distinct tasks (a seeded sample). A pool smaller than its count is *repeated*: every task of it
  appears ⌊count/len⌋ or ⌈count/len⌉ times (whole shuffled passes, then a sample without
  replacement for the rest) -- sampling with replacement, balanced so no task is over-used by
  chance. ``MixReport.repeated`` names the pools this happened to.
- **Seeded and order-independent.** The same pools, weights, size and seed give the same list,
  whatever the key order of ``weights`` (``{a: .5, b: .5}`` and ``{b: .5, a: .5}`` are one
  config): each pool is drawn with its own generator (seed, pool name), the draws are joined in
  pool-name order, and the result is shuffled with the seed so pools are interleaved.
- **Bad weights are errors** (``MixtureError``, a ``ValueError``) naming the problem: a weight
  that is negative, not a finite number, or a bool; all weights zero; no weights; a weighted pool
  that is missing from ``pools`` (unknown pool) or empty while it should give tasks; a size that
  is not a non-negative integer. Pools without a weight are simply not used.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from sqlrl.tasks.types import Task

__all__ = ["MixtureConfig", "MixtureError", "MixReport", "ZENO", "TALON", "allocate", "mix",
           "mix_with_report", "pools_by_kind", "mixtures_from_config"]

ZENO = {"critic": 0.5, "text2sql": 0.5}  # the Zeno model: debugging and text-to-SQL
TALON = {"critic": 1.0}  # the Talon model: debugging only


class MixtureError(ValueError):
    """A mixture that cannot be drawn; the message names the weight or pool at fault."""


def _check_weights(weights: Any) -> dict[str, float]:
    if not isinstance(weights, Mapping) or not weights:
        raise MixtureError(f"weights must be a non-empty mapping of pool name -> weight, got {weights!r}")
    out: dict[str, float] = {}
    for name, w in weights.items():
        if not isinstance(name, str) or not name:
            raise MixtureError(f"pool names must be non-empty strings, got {name!r}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise MixtureError(f"the weight of pool {name!r} must be a finite number, got {w!r}")
        if w < 0:
            raise MixtureError(f"the weight of pool {name!r} is negative ({w})")
        out[name] = float(w)
    if sum(out.values()) <= 0:
        raise MixtureError(f"all weights are zero ({out}): at least one pool must have a positive weight")
    return out


@dataclass(frozen=True)
class MixtureConfig:
    weights: dict[str, float] = field(hash=False)
    size: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", _check_weights(self.weights))
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise MixtureError(f"size must be a non-negative integer, got {self.size!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise MixtureError(f"seed must be an integer, got {self.seed!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "mixture") -> "MixtureConfig":
        if not isinstance(d, Mapping):
            raise MixtureError(f"{where}: expected a mapping with weights, size (and seed), got {d!r}")
        unknown = sorted(set(d) - {"weights", "size", "seed"})
        if unknown:
            raise MixtureError(f"{where}: unknown key(s) {unknown}; expected weights, size, seed")
        if "weights" not in d or "size" not in d:
            raise MixtureError(f"{where}: needs 'weights' and 'size'")
        try:
            return cls(d["weights"], d["size"], d.get("seed", 0))
        except MixtureError as exc:
            raise MixtureError(f"{where}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"weights": dict(self.weights), "size": self.size, "seed": self.seed}


def mixtures_from_config(config: Mapping[str, Any]) -> dict[str, MixtureConfig]:
    """``{stage: MixtureConfig}`` from ``{stage: {"weights", "size", "seed"}}`` (a config file)."""
    if not isinstance(config, Mapping):
        raise MixtureError(f"the mixture config must be a mapping of stage -> mixture, got {config!r}")
    return {str(stage): MixtureConfig.from_dict(d, where=f"mixture {stage!r}")
            for stage, d in config.items()}


def allocate(weights: Mapping[str, float], size: int) -> dict[str, int]:
    """Counts per pool summing to ``size`` (largest remainder; see the module doc)."""
    w = _check_weights(weights)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise MixtureError(f"size must be a non-negative integer, got {size!r}")
    total = sum(w.values())
    exact = {name: size * v / total for name, v in w.items()}
    counts = {name: math.floor(x) for name, x in exact.items()}
    left = size - sum(counts.values())
    for name in sorted(w, key=lambda n: (-(exact[n] - counts[n]), n))[:left]:  # ties: first name
        counts[name] += 1
    return counts


@dataclass(frozen=True)
class MixReport:
    counts: dict[str, int]  # pool -> tasks drawn
    available: dict[str, int]  # pool -> tasks in it
    repeated: tuple[str, ...] = ()  # pools smaller than their count (drawn with repetition)


def _draw(items: list[Any], n: int, rng: random.Random) -> list[Any]:
    if n <= len(items):
        return rng.sample(items, n)
    out: list[Any] = []
    while n - len(out) >= len(items):
        part = list(items)
        rng.shuffle(part)
        out += part
    return out + rng.sample(items, n - len(out))


def mix_with_report(pools: Mapping[str, Sequence[Task]], cfg: MixtureConfig) -> tuple[list[Task], MixReport]:
    if not isinstance(cfg, MixtureConfig):
        raise MixtureError(f"cfg must be a MixtureConfig, got {type(cfg).__name__}")
    unknown = [name for name in cfg.weights if name not in pools]
    if unknown:
        raise MixtureError(f"unknown pool(s) {unknown}: the pools given are {sorted(pools)}")
    counts = allocate(cfg.weights, cfg.size)
    empty = [name for name, n in counts.items() if n > 0 and len(pools[name]) == 0]
    if empty:
        raise MixtureError(f"pool(s) {empty} are empty but their weight asks for tasks")
    out: list[Task] = []
    for name, n in sorted(counts.items()):
        out += _draw(list(pools[name]), n, random.Random(f"mix:{cfg.seed}:{name}"))
    random.Random(f"mix:{cfg.seed}:order").shuffle(out)
    available = {name: len(pools[name]) for name in counts}
    repeated = tuple(n for n in counts if counts[n] > available[n])
    return out, MixReport(counts, available, repeated)


def mix(pools: Mapping[str, Sequence[Task]], cfg: MixtureConfig) -> list[Task]:
    """``cfg.size`` tasks drawn from ``pools`` by ``cfg.weights`` (see the module doc)."""
    return mix_with_report(pools, cfg)[0]


def pools_by_kind(tasks: Sequence[Task]) -> dict[str, list[Task]]:
    """``{"critic": [...], "text2sql": [...]}`` from a list of tasks (input order kept)."""
    out: dict[str, list[Task]] = {}
    for t in tasks:
        out.setdefault(t.kind, []).append(t)
    return out
