"""The learner (Ray-free): loss configs, training batches and losses; the engine lives beside them.

Names are exported lazily (``from sqlrl.learn import TokenBatch`` imports ``sqlrl.learn.batch`` and
torch only then), so importing the package is cheap. verl (and, through it, Ray) is imported only
when a loss, an advantage or a ``GRPOConfig`` is computed — never at module import.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SFTConfig": "config", "GRPOConfig": "config", "LOSS_AGG_MODES": "config", "KL_TYPES": "config",
    "SFTExample": "batch", "TokenBatch": "batch", "SFTLengthWarning": "batch", "read_sft_jsonl": "batch",
    "tokenize_sft": "batch", "sft_batch": "batch", "rl_batch": "batch", "grpo_advantages": "batch",
    "LossOutput": "losses", "forward_logprobs": "losses", "sft_loss": "losses", "grpo_loss": "losses",
    "grpo_loss_from_logprobs": "losses", "loss_weight": "losses", "LOSSES": "losses",
    "trainable_rows": "groups",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sqlrl.learn' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
