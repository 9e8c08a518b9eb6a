"""jobs.train.rollout_metrics: a GRPO step's reward curve is over every scored row it drew (dynamic
sampling keeps only informative groups: a curve over those would hide a step whose groups were
all solved or all failed), excluded rows count nowhere, and the trained rows have their own mean."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.train import rollout_metrics
from sqlrl.rewards.registry import RewardBreakdown


def _b(score: float, excluded: bool = False) -> RewardBreakdown:
    return RewardBreakdown(score, {"format": 1.0, "result": score}, excluded)


def _t() -> SimpleNamespace:
    return SimpleNamespace(turns=[1], n_tool_calls=0, n_tool_errors=0, n_malformed=0, n_generated=10)


def test_rewards_are_over_every_scored_row_and_the_trained_ones_apart():
    # group A all solved (not trained), group B mixed (trained), one excluded row
    breakdowns = [_b(1.0), _b(1.0), _b(1.0), _b(0.0), _b(0.0, excluded=True)]
    m = rollout_metrics([_t() for _ in breakdowns], breakdowns, keep=[2, 3])
    assert m["reward_mean"] == pytest.approx(3 / 4) and m["pass_rate"] == pytest.approx(3 / 4)
    assert m["reward_result"] == pytest.approx(3 / 4) and m["reward_format"] == 1.0
    assert m["trained_reward_mean"] == pytest.approx(0.5)
    assert (m["trajectories"], m["trained_on"], m["excluded"]) == (5, 2, 1)


def test_a_step_that_trains_on_nothing_still_reports_what_it_drew():
    breakdowns = [_b(1.0)] * 4
    m = rollout_metrics([_t() for _ in breakdowns], breakdowns, keep=[])
    assert m["reward_mean"] == 1.0 and m["pass_rate"] == 1.0 and m["trained_on"] == 0
