"""``LoopConfig``: the agent loop's settings (frozen; every bad value is a ``ValueError`` naming the
field when the config is made). ``sqlrl.agent.loop`` re-exports it."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlrl.policy.types import SamplingParams

from .parsers import PARSERS
from .prompts import MODES, SCHEMA_STYLES

__all__ = ["LoopConfig"]


@dataclass(frozen=True)
class LoopConfig:
    max_turns: int = 8
    max_total_tokens: int = 8192
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=512))
    parser: str = "hermes"
    mode: str = "agentic"
    deadline_s: float | None = None  # wall-clock limit of one run(); None = none
    batch_tools: bool = True  # a group's execute_sql calls in one execute_many (when the source has one)
    tool_window_s: float = 0.0  # tool calls ready within this of each other form one group (0: same step)
    max_concurrent_trajectories: int | None = None  # rollouts in progress at once; None = all
    schema_style: str | None = None  # prompts.SCHEMA_STYLES key; None: $SQLRL_SCHEMA_STYLE or the default

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"LoopConfig.mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.parser not in PARSERS:
            raise ValueError(f"LoopConfig.parser {self.parser!r} is not one of {', '.join(PARSERS)}")
        if self.max_turns < 1:
            raise ValueError(f"LoopConfig.max_turns must be >= 1, got {self.max_turns}")
        if self.sampling.n != 1:
            raise ValueError("LoopConfig.sampling.n must be 1: repeat a task to make a GRPO group")
        if self.max_total_tokens <= self.sampling.max_new_tokens:
            raise ValueError(f"LoopConfig.max_total_tokens ({self.max_total_tokens}) must exceed "
                             f"sampling.max_new_tokens ({self.sampling.max_new_tokens})")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"LoopConfig.deadline_s must be > 0, got {self.deadline_s}")
        if self.tool_window_s < 0:
            raise ValueError(f"LoopConfig.tool_window_s must be >= 0, got {self.tool_window_s}")
        if self.max_concurrent_trajectories is not None and self.max_concurrent_trajectories < 1:
            raise ValueError("LoopConfig.max_concurrent_trajectories must be >= 1 (or None), got "
                             f"{self.max_concurrent_trajectories}")
        if self.schema_style is not None and self.schema_style not in SCHEMA_STYLES:
            raise ValueError(f"LoopConfig.schema_style {self.schema_style!r} is not one of {', '.join(SCHEMA_STYLES)}")
