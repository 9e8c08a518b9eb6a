"""GRPO group filtering (sqlrl.learn.groups): which scored rollouts enter an update."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from sqlrl.learn.groups import informative_rows, trainable_rows


def _row(stop="submitted", generated=5, excluded=False):
    return NS(stop_reason=stop, n_generated=generated), NS(excluded=excluded)


def _split(rows):
    return [t for t, _ in rows], [b for _, b in rows]


def test_rows_that_carry_no_signal_are_dropped_and_lone_survivors_with_them():
    rows = [_row(), _row(),                      # group a: both kept
            _row(), _row(stop="error"),          # group b: one left after the error -> none kept
            _row(excluded=True), _row(), _row(),  # group c: the excluded row goes, two remain
            _row(generated=0), _row(generated=0)]  # group d: nothing generated
    groups = ["a", "a", "b", "b", "c", "c", "c", "d", "d"]
    assert trainable_rows(*_split(rows), groups) == [0, 1, 5, 6]


def test_groups_are_told_apart_by_id_not_by_position():
    rows = [_row() for _ in range(4)]
    assert trainable_rows(*_split(rows), ["x", "y", "x", "z"]) == [0, 2]
    assert trainable_rows([], [], []) == []


def test_lengths_must_agree():
    trajs, breakdowns = _split([_row(), _row()])
    with pytest.raises(ValueError, match="same length"):
        trainable_rows(trajs, breakdowns, ["a"])


def test_informative_rows_keep_only_groups_whose_rewards_differ():
    groups = ["a", "a", "b", "b", "c", "c", "c"]
    scores = [1.0, 0.0, 0.5, 0.5, 0.0, 0.0, 1e-9]
    assert informative_rows(range(7), scores, groups) == [0, 1]  # b equal; c within tol
    assert informative_rows([0, 1, 4, 5, 6], [1, 0, 0, 0, 0, 0, 0.3], groups) == [0, 1, 4, 5, 6]
    assert informative_rows([0, 2, 3], scores, groups) == []  # a reduced to one row: no spread
    assert informative_rows([], scores, groups) == []


def test_sampling_rounds_must_be_a_positive_integer():
    from curriculum.config import RLSettings

    assert RLSettings(sampling_rounds=3).sampling_rounds == 3
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="sampling_rounds"):
            RLSettings(sampling_rounds=bad)


def test_the_loss_temperature_follows_the_sampling_temperature():
    """The learner's log-probs (logits / rl.loss.temperature) are compared with the rollout's, which
    were sampled at rl.temperature: one number, set once. Before, the long preset sampled at 0.7
    and scored at 1.0, so the PPO ratio started away from 1 and clipped the wrong tokens."""
    from curriculum.config import RLSettings, load_stage_config
    from curriculum.stages import STAGES
    from sqlrl.learn.config import GRPOConfig

    assert RLSettings(temperature=0.7).loss.temperature == 0.7
    assert RLSettings().loss.temperature == 1.0
    assert RLSettings(temperature=0.6, loss=GRPOConfig(temperature=0.6)).loss.temperature == 0.6
    with pytest.raises(ValueError, match=r"rl.loss.temperature \(0.5\) must equal rl.temperature \(0.7\)"):
        RLSettings(temperature=0.7, loss=GRPOConfig(temperature=0.5))
    cfg = load_stage_config(STAGES["stage4"].config_path(), ["stage=stage4", "rl.temperature=0.8"])
    assert cfg.rl.loss.temperature == 0.8
    with pytest.raises(ValueError, match="set rl.temperature only"):
        load_stage_config(STAGES["stage4"].config_path(), ["stage=stage4", "rl.loss.temperature=0.9"])
