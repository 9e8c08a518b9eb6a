"""bench/suite_training.py's pieces that need no training: the arms' stage overrides come from the
long preset's stage 3 or 4 (then --quick's, then --set), the pooled comparison pairs tasks by seed,
the rewarded/rejected counts come from the metrics rows, and bad arguments are one-line exits. The
whole script ran with --quick, --stage 3 and 4 (docs/rewards.md)."""

from __future__ import annotations

from argparse import Namespace

import pytest

from bench.suite_training import ARMS, main, pooled, rewarded, stage_config, stage_overrides
from curriculum.config import load_stage_config


def test_the_arms_run_the_long_presets_stage3_and_differ_only_in_the_reward():
    args = Namespace(preset="long", stage=3, variant="zeno", quick=False, init="/ckpt", set=["rl.steps=3"])
    base = stage_overrides(args)
    assert "data.train_size=384" in base and "model.init=/ckpt" in base and base[-1] == "rl.steps=3"
    ex, suite = (load_stage_config("jobs/configs/stage3.yaml", ["stage=stage3", *base, *ARMS[a],
                                                                "reward.test_suite_dir=/tmp/ts"])
                 for a in ("ex", "suite"))
    assert not ex.reward.test_suite and suite.reward.test_suite
    assert ex.data == suite.data and ex.rl == suite.rl and ex.rl.steps == 3
    quick = stage_overrides(Namespace(preset="long", stage=3, variant="zeno", quick=True, init=None, set=[]))
    assert "model.init=tiny" in quick and quick.index("model.init=tiny") > quick.index("data.train_size=384")


def test_stage_4_runs_the_long_presets_agentic_stage4_with_its_own_overrides():
    args = Namespace(preset="long", stage=4, variant="zeno", quick=False, init="/ckpt", set=["rl.steps=3"])
    base = stage_overrides(args)
    assert "data.train_size=192" in base and "rl.group_size=6" in base and "data.train_size=384" not in base
    ex, suite = (stage_config(4, [*base, *ARMS[a], "reward.test_suite_dir=/tmp/ts"]) for a in ("ex", "suite"))
    assert ex.stage == "stage4" and ex.rollout.max_turns == 4 and ex.rl.steps == 3 and ex.model.init == "/ckpt"
    assert not ex.reward.test_suite and suite.reward.test_suite and ex.rl == suite.rl and ex.data == suite.data


def test_rewarded_counts_ex_passes_as_suite_passes_plus_lucky_matches():
    suite_rows = [{"step": 0, "trajectories": 48, "excluded": 0, "pass_rate": 0.25, "reward_lucky_match": 0.0},
                  {"step": 1, "trajectories": 48, "excluded": 8, "pass_rate": 0.5, "reward_lucky_match": 0.125}]
    r = rewarded(suite_rows)
    assert [(s["scored"], s["rewarded_ex"], s["rejected"]) for s in r["steps"]] == [(48, 12, 0), (40, 25, 5)]
    assert (r["scored"], r["rewarded_ex"], r["rejected"]) == (88, 37, 5)
    ex = rewarded([{"step": 0, "trajectories": 10, "pass_rate": 0.3}])  # the ex arm logs no lucky_match
    assert ex["steps"][0]["rewarded_ex"] == 3 and ex["steps"][0]["rejected"] is None and ex["rejected"] is None
    with pytest.raises(ValueError, match="step 2"):
        rewarded([{"step": 2, "pass_rate": 0.5}])


def test_the_pooled_difference_pairs_each_task_with_itself_per_seed():
    ev = {"ex_s0": {"per_task": {"a": {"success": 0}, "b": {"success": 1}}},
          "suite_s0": {"per_task": {"a": {"success": 1}, "b": {"success": 1}}},
          "ex_s1": {"per_task": {"a": {"success": 0}, "b": {"success": 0}}},
          "suite_s1": {"per_task": {"a": {"success": 0}, "b": {"success": 1}}}}
    d = pooled(ev, [0, 1], "ex", "suite")
    assert d["n"] == 4 and d["gained"] == 2 and d["lost"] == 0 and d["diff"] == pytest.approx(0.5)


@pytest.mark.parametrize("argv,message", [([], "--init is needed"), (["--seeds", "x"], "--seeds must be"),
                                          (["--quick", "--seeds", ","], "no seed"),
                                          (["--quick", "--arms", "ex,bogus"], "--arms must name"),
                                          (["--quick", "--arms", ","], "--arms must name"),
                                          (["--quick", "--arms", "suite,suite"], "--arms must name"),
                                          (["--stage", "4"], "start checkpoint of stage 4")])
def test_bad_arguments_are_one_line_exits(argv, message, tmp_path):
    with pytest.raises(SystemExit, match=message):
        main([*argv, "--out", str(tmp_path)])


def test_a_stage_other_than_3_or_4_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--quick", "--stage", "2", "--out", str(tmp_path)])
    assert "invalid choice" in capsys.readouterr().err
