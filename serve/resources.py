"""What the serve app asks Ray for, fitted to the cluster before anything is deployed (pure, no Ray).

Ray Serve places a replica only where its ``num_cpus``/``num_gpus`` are free, and a replica that
cannot be placed waits forever (the ingress stays pending, nothing answers). So the app's asks
are fitted to the cluster's totals when it is built:

- the ingress asks ``ServeConfig.ingress_num_cpus`` (0.25 by default: it parses and forwards);
- a model with an explicit ``num_cpus`` asks that per replica;
- a model with ``num_cpus`` unset (the default) gets a fair share of what is left, per replica
  at most 1 CPU (``MAX_DEFAULT_CPUS``) and at least ``MIN_CPUS``;
- colocated models (``colocate: true``) live in the ingress replicas, which then ask for the
  ingress's share only.

``fit(config, cpus, gpus)`` returns the ``Asks`` or raises ``ResourceError`` with ONE line that
names the resource, what is asked and available, and the setting that fixes it. ``cpus``/
``gpus`` None (unknown: no Ray connected) fit the defaults as if the machine had
``os.cpu_count()`` CPUs and checks no GPUs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .config import ServeConfig

MAX_DEFAULT_CPUS = 1.0
MIN_CPUS = 0.05


class ResourceError(ValueError):
    """The app's resource asks do not fit the cluster (one line: what, and the setting to change)."""


@dataclass(frozen=True)
class Asks:
    ingress_cpus: float
    model_cpus: dict[str, float]  # per replica


def fit(config: ServeConfig, cpus: float | None, gpus: float | None = None) -> Asks:
    total = float(cpus) if cpus is not None else float(os.cpu_count() or 1)
    ingress = config.ingress_num_cpus
    if config.colocate:
        if ingress > total:
            raise ResourceError(f"serve: the ingress asks for {ingress:g} CPU but the cluster has "
                                f"{total:g}; lower ingress_num_cpus")
        return Asks(ingress, {name: 0.0 for name in config.models})
    explicit = {n: s.num_cpus for n, s in config.models.items() if s.num_cpus is not None}
    asked = ingress + sum(c * config.models[n].num_replicas for n, c in explicit.items())
    unset = [n for n in config.models if n not in explicit]
    replicas = sum(config.models[n].num_replicas for n in unset)
    need = asked + replicas * MIN_CPUS
    if need > total + 1e-9:
        parts = [f"ingress {ingress:g}"] + [f"{n} {config.models[n].num_replicas}x{c:g}" for n, c in explicit.items()]
        parts += [f"{n} {config.models[n].num_replicas}x>={MIN_CPUS:g}" for n in unset]
        fix = ", ".join(f"models.{n}.num_cpus" for n in explicit) or "num_replicas"
        raise ResourceError(f"serve: the app asks for {need:g} CPU "
                            f"({' + '.join(parts)}) but the cluster has {total:g}; lower {fix} "
                            "or ingress_num_cpus (or leave num_cpus unset to share what is left)")
    if gpus is not None:
        need = sum(s.num_gpus * s.num_replicas for s in config.models.values())
        if need > gpus + 1e-9:
            names = ", ".join(f"models.{n}.num_gpus" for n, s in config.models.items() if s.num_gpus)
            raise ResourceError(f"serve: the models ask for {need:g} GPU but the cluster has {gpus:g}; "
                                f"lower {names} or num_replicas")
    share = min(MAX_DEFAULT_CPUS, (total - asked) / replicas) if replicas else 0.0
    return Asks(ingress, {n: explicit.get(n, share) for n in config.models})
