"""Optimizer and learning-rate schedule for the learner: ``torch.optim.AdamW`` + ``LambdaLR``.

``OptimConfig`` is a frozen value (it crosses the driver -> rank-actor boundary). Guarantees:
- ``build_optimizer(params, cfg)`` is plain ``torch.optim.AdamW`` (works on FSDP2 DTensor params).
- ``build_scheduler(opt, cfg)`` is ``torch.optim.lr_scheduler.LambdaLR`` over ``lr_factor``: a linear
  warm-up from ``1/(warmup_steps+1)`` to 1 over ``warmup_steps`` updates, then the ``SCHEDULES``
  entry ("cosine", "linear" or "constant") decays to ``min_lr_ratio`` at ``total_steps`` and stays
  there. The factor is a pure function of the step, so a resumed run (scheduler ``last_epoch``
  restored) continues on exactly the same curve.
- Bad values raise ``ValueError`` at construction, naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

SCHEDULES: dict[str, Callable[[float], float]] = {
    # progress in [0, 1] after warm-up -> decay factor in [0, 1] (1 = full lr, 0 = min lr)
    "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
    "linear": lambda p: 1.0 - p,
    "constant": lambda p: 1.0,
}


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    total_steps: int = 1000
    schedule: str = "cosine"
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0  # max global grad norm; None or 0: no clipping (norm still reported)
    micro_batch_size: int = 8  # rows per forward/backward on one rank (gradient accumulation)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}")
        checks = {"lr": self.lr > 0, "weight_decay": self.weight_decay >= 0, "eps": self.eps > 0,
                  "warmup_steps": self.warmup_steps >= 0, "total_steps": self.total_steps >= 1,
                  "min_lr_ratio": 0.0 <= self.min_lr_ratio <= 1.0,
                  "grad_clip": self.grad_clip is None or self.grad_clip >= 0,
                  "micro_batch_size": self.micro_batch_size >= 1,
                  "betas": len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas)}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid OptimConfig field(s) {', '.join(bad)}: {self}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))


def lr_factor(step: int, cfg: OptimConfig) -> float:
    """The multiplier of ``cfg.lr`` for update number ``step`` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * SCHEDULES[cfg.schedule](progress)


def build_optimizer(params: Iterable[Any], cfg: OptimConfig) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                             weight_decay=cfg.weight_decay)


def build_scheduler(optimizer: Any, cfg: OptimConfig) -> Any:
    import functools

    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, functools.partial(lr_factor, cfg=cfg))
