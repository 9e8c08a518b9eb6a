"""jobs.train's ``Trainer.signal``: what a stage's steps measured, as summary.json and the main
job's table carry it -- SFT's loss first -> last, GRPO's samples' pass rate and the groups whose
rewards differed (the only ones with a gradient), and a plain "no gradient" when none did."""

from __future__ import annotations

from jobs.train import TRAINERS, signal_grpo, signal_sft


def test_sft_reports_the_first_and_last_loss():
    s = signal_sft([{"loss": 2.0}, {"loss": 1.0}, {"loss": 0.5}])
    assert (s["loss_first"], s["loss_last"], s["steps"]) == (2.0, 0.5, 3)
    assert s["text"] == "loss 2.00 -> 0.50 over 3 steps"
    assert signal_sft([]) == {"steps": 0, "text": "0 steps, no loss logged"}


def test_grpo_reports_the_pass_rate_and_the_groups_whose_rewards_differed():
    s = signal_grpo([{"pass_rate": 0.2, "groups_drawn": 8, "groups_trained": 8, "groups_signal": 3, "learner_step": 1},
                     {"pass_rate": 0.6, "groups_drawn": 4, "groups_trained": 4, "groups_signal": 4, "learner_step": 2}])
    assert (s["pass_first"], s["pass_last"], s["groups_signal"], s["groups_drawn"], s["updates"]) == (0.2, 0.6, 7, 12, 2)
    assert s["text"] == "samples' pass 0.20 -> 0.60, 7 of 12 groups with unequal rewards over 2 steps"


def test_grpo_says_when_no_group_carried_a_gradient():
    # one draw a step: flat groups still enter the update (groups_trained), with zero advantage
    s = signal_grpo([{"pass_rate": 0.0, "groups_drawn": 2, "groups_trained": 2, "groups_signal": 0, "learner_step": 1}])
    assert s["updates"] == 1 and s["groups_signal"] == 0
    assert s["text"] == "samples' pass 0.00, no group of 2 had unequal rewards: zero advantages, no gradient over 1 step"


def test_every_trainer_has_a_signal():
    for name, trainer in TRAINERS.items():
        assert "text" in trainer.signal([]), name
