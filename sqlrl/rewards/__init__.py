"""Rewards that cannot be gamed: response parsing, execution verdicts, pure scorers in a registry.

See ``registry`` for the list and the fail-closed guarantees, ``judge`` for execution and the
gold cache, ``parse`` for the response formats; docs/rewards.md for the design.
"""

from .judge import ExecVerdict, Judge
from .parse import STYLES, Extracted, FormatStyle, extract_agentic, extract_single
from .registry import (REWARDS, RewardBreakdown, RewardConfig, RewardSpec, SQLR1Config,
                       batch_means, compute, compute_batch, get_reward, score)

__all__ = ["REWARDS", "STYLES", "ExecVerdict", "Extracted", "FormatStyle", "Judge",
           "RewardBreakdown", "RewardConfig", "RewardSpec", "SQLR1Config", "batch_means",
           "compute", "compute_batch", "extract_agentic", "extract_single", "get_reward",
           "score"]
