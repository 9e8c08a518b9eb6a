"""bench/suite_training.py's pieces that need no training: the arms' stage overrides come from the
long preset (then --quick's, then --set), the pooled comparison pairs tasks by seed, and bad
arguments are one-line exits. The whole script ran with --quick (docs/rewards.md)."""

from __future__ import annotations

from argparse import Namespace

import pytest

from bench.suite_training import ARMS, main, pooled, stage_overrides
from curriculum.config import load_stage_config


def test_the_arms_run_the_long_presets_stage3_and_differ_only_in_the_reward():
    args = Namespace(preset="long", variant="zeno", quick=False, init="/ckpt", set=["rl.steps=3"])
    base = stage_overrides(args)
    assert "data.train_size=384" in base and "model.init=/ckpt" in base and base[-1] == "rl.steps=3"
    ex, suite = (load_stage_config("jobs/configs/stage3.yaml", ["stage=stage3", *base, *ARMS[a],
                                                                "reward.test_suite_dir=/tmp/ts"])
                 for a in ("ex", "suite"))
    assert not ex.reward.test_suite and suite.reward.test_suite
    assert ex.data == suite.data and ex.rl == suite.rl and ex.rl.steps == 3
    quick = stage_overrides(Namespace(preset="long", variant="zeno", quick=True, init=None, set=[]))
    assert "model.init=tiny" in quick and quick.index("model.init=tiny") > quick.index("data.train_size=384")


def test_the_pooled_difference_pairs_each_task_with_itself_per_seed():
    ev = {"ex_s0": {"per_task": {"a": {"success": 0}, "b": {"success": 1}}},
          "suite_s0": {"per_task": {"a": {"success": 1}, "b": {"success": 1}}},
          "ex_s1": {"per_task": {"a": {"success": 0}, "b": {"success": 0}}},
          "suite_s1": {"per_task": {"a": {"success": 0}, "b": {"success": 1}}}}
    d = pooled(ev, [0, 1], "ex", "suite")
    assert d["n"] == 4 and d["gained"] == 2 and d["lost"] == 0 and d["diff"] == pytest.approx(0.5)


@pytest.mark.parametrize("argv,message", [([], "--init is needed"), (["--seeds", "x"], "--seeds must be"),
                                          (["--quick", "--seeds", ","], "no seed")])
def test_bad_arguments_are_one_line_exits(argv, message, tmp_path):
    with pytest.raises(SystemExit, match=message):
        main([*argv, "--out", str(tmp_path)])
