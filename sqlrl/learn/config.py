"""Loss configurations for the learner: frozen, validated values (no torch, no verl at import time).

Guarantees:
- ``SFTConfig`` and ``GRPOConfig`` are frozen dataclasses of plain values (picklable, hashable,
  safe across Ray boundaries); every bad value raises ``ValueError`` naming the field, the value
  and what is allowed, at construction.
- ``loss_agg_mode`` is one of ``LOSS_AGG_MODES`` — verl's aggregation modes except ``"token-sum"``:
  the engine combines micro-batch losses as a weighted mean (``LossOutput.weight``), which cannot
  reproduce a global token *sum*. ``"seq-mean-token-sum-norm"`` needs a constant
  ``loss_scale_factor`` (verl would otherwise divide by the padded width, which differs between
  micro-batches).
- ``GRPOConfig.policy_loss`` must name a policy loss in verl's ``core_algos`` registry; that check
  imports verl (and, through it, Ray) the first time it runs — the only config field that does.
- ``GRPOConfig.kl_type`` is a verl ``kl_penalty`` estimator (``KL_TYPES``), optionally with a ``+``
  suffix (straight-through k2 gradient).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
# verl.trainer.ppo.core_algos.kl_penalty_forward's estimators ("full" is not implemented there).
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def verl_policy_losses() -> tuple[str, ...]:
    """The policy-loss names verl's ``core_algos`` registers (imports verl)."""
    from verl.trainer.ppo import core_algos

    return tuple(core_algos.POLICY_LOSS_REGISTRY)


def _check_agg(owner: str, mode: str, loss_scale_factor: int | None) -> None:
    if mode not in LOSS_AGG_MODES:
        extra = (" ('token-sum' is not supported: the engine averages micro-batch losses by weight)"
                 if mode == "token-sum" else "")
        raise ValueError(f"{owner}.loss_agg_mode {mode!r} is not one of {', '.join(LOSS_AGG_MODES)}{extra}")
    if loss_scale_factor is not None and (isinstance(loss_scale_factor, bool)
                                          or not isinstance(loss_scale_factor, int)
                                          or loss_scale_factor < 1):
        raise ValueError(f"{owner}.loss_scale_factor must be a positive int or None, got {loss_scale_factor!r}")
    if mode == "seq-mean-token-sum-norm" and loss_scale_factor is None:
        raise ValueError(f"{owner}.loss_agg_mode 'seq-mean-token-sum-norm' needs loss_scale_factor (a constant "
                         "such as the maximum generated tokens per sequence), so that micro-batches of "
                         "different padded widths are scaled alike")


def _number(owner: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{owner}.{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning: negative log-likelihood of the trained (assistant) tokens."""

    loss_agg_mode: str = "token-mean"
    loss_scale_factor: int | None = None  # only for "seq-mean-token-sum-norm"

    def __post_init__(self) -> None:
        _check_agg("SFTConfig", self.loss_agg_mode, self.loss_scale_factor)


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO: verl's clipped policy loss on group-normalised outcome advantages, + entropy and KL terms."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0  # dual-clip lower bound for negative advantages (verl: must be > 1)
    loss_agg_mode: str = "token-mean"
    policy_loss: str = "vanilla"  # a name in verl's POLICY_LOSS_REGISTRY
    kl_coef: float = 0.0  # > 0: add kl_coef * KL(policy || reference) (needs batch.ref_logprobs)
    kl_type: str = "low_var_kl"
    entropy_coef: float = 0.0  # > 0: subtract entropy_coef * entropy (an exploration bonus)
    norm_adv_by_std_in_grpo: bool = True  # False = Dr.GRPO (mean-centred only)
    temperature: float = 1.0  # the rollout sampling temperature: logits / temperature
    loss_scale_factor: int | None = None  # only for "seq-mean-token-sum-norm"
    # Run a group's shared prompt once per micro-batch and its samples on its KV cache (same numbers
    # up to float rounding; losses.forward_logprobs). Pays off when a micro-batch holds whole groups.
    share_prefix: bool = True

    def __post_init__(self) -> None:
        owner = "GRPOConfig"
        low = _number(owner, "clip_ratio_low", self.clip_ratio_low)
        high = _number(owner, "clip_ratio_high", self.clip_ratio_high)
        if not 0 <= low < 1:
            raise ValueError(f"{owner}.clip_ratio_low must be in [0, 1), got {low}")
        if high < 0:
            raise ValueError(f"{owner}.clip_ratio_high must be >= 0, got {high}")
        if _number(owner, "clip_ratio_c", self.clip_ratio_c) <= 1:
            raise ValueError(f"{owner}.clip_ratio_c must be > 1 (dual-clip bound), got {self.clip_ratio_c}")
        for name in ("kl_coef", "entropy_coef"):
            if _number(owner, name, getattr(self, name)) < 0:
                raise ValueError(f"{owner}.{name} must be >= 0, got {getattr(self, name)}")
        if _number(owner, "temperature", self.temperature) <= 0:
            raise ValueError(f"{owner}.temperature must be > 0 (greedy rollouts have no sampling "
                             f"distribution to correct for), got {self.temperature}")
        if not isinstance(self.share_prefix, bool):
            raise ValueError(f"{owner}.share_prefix must be a bool, got {self.share_prefix!r}")
        if not isinstance(self.norm_adv_by_std_in_grpo, bool):
            raise ValueError(f"{owner}.norm_adv_by_std_in_grpo must be a bool, got {self.norm_adv_by_std_in_grpo!r}")
        base = self.kl_type[:-1] if isinstance(self.kl_type, str) and self.kl_type.endswith("+") else self.kl_type
        if base not in KL_TYPES:
            raise ValueError(f"{owner}.kl_type {self.kl_type!r} is not one of {', '.join(KL_TYPES)} "
                             "(optionally with a '+' suffix)")
        _check_agg(owner, self.loss_agg_mode, self.loss_scale_factor)
        if not isinstance(self.policy_loss, str) or self.policy_loss not in verl_policy_losses():
            raise ValueError(f"{owner}.policy_loss {self.policy_loss!r} is not a verl policy loss; "
                             f"known: {', '.join(verl_policy_losses())}")
