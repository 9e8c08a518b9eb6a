"""The GRPO step's policy update (``sqlrl.rl.update``), shared by the stage recipes and the gateway's
agent job: ``updates_per_batch`` learner steps on one batch, the last one's metrics; stale tokens
masked before the batch is built; a bad repeat count refused."""

from __future__ import annotations

import pytest

from sqlrl.learn.config import GRPOConfig
from sqlrl.rl.update import policy_update, repeat_steps
from tests.unit.test_rl_staleness import traj


class Learner:
    """Records each step's batch; its metrics say which step it was."""

    def __init__(self, version: int = 0) -> None:
        self.version, self.batches = version, []

    def step(self, batch, algo, loss):
        assert algo == "grpo"
        self.batches.append(batch)
        return {"step": len(self.batches)}


def test_repeat_steps_runs_the_same_batch_times_over_and_returns_the_last_metrics():
    learner, batch = Learner(), object()
    assert repeat_steps(learner, batch, GRPOConfig(), 3) == {"step": 3}
    assert learner.batches == [batch] * 3


@pytest.mark.parametrize("times", [0, -1])
def test_no_update_at_all_is_refused(times):
    with pytest.raises(ValueError, match="at least 1"):
        repeat_steps(Learner(), object(), GRPOConfig(), times)


def test_policy_update_masks_tokens_of_an_older_version_before_building_the_batch():
    learner = Learner(version=1)
    update = policy_update(learner, GRPOConfig(), pad_id=0, max_length=None, times=2)
    rows = [traj([0, 1, 1, 1], versions=(1, 1, 0, 1), policy_version=1), traj([0, 1, 1], versions=(1, 1, 1),
                                                                             policy_version=1)]
    metrics = update(rows, [1.0, 0.0], ["g", "g"])
    assert metrics["step"] == 2 and len(learner.batches) == 2 and learner.batches[0] is learner.batches[1]
    # the one token version 0 wrote is counted, and out of the loss
    assert metrics["stale_tokens"] == 1 and metrics["stale_trajectories"] == 1 and metrics["stale_token_frac"] == 0.2
    mask = learner.batches[0].loss_mask.tolist()
    assert sum(map(sum, mask)) == 4  # 5 generated tokens, 1 masked
