"""sqlrl.learn.resume and jobs.train.StageCheckpoints with a learner that writes only a manifest:
the newest complete checkpoint with a loop state is the one resumed from, an interrupted one is
skipped, older ones are pruned to ``keep``; a fresh run clears stale ones; a resume made with
another config is refused naming the keys, before any state is loaded. (The weights themselves:
tests/e2e/test_stage_resume.py kills real stage jobs and compares them bitwise.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curriculum.config import load_stage_config
from jobs.train import StageCheckpoints
from sqlrl.learn import resume
from sqlrl.learn.checkpoint import FORMAT, MANIFEST


class Learner:
    def __init__(self) -> None:
        self.updates, self.loaded = 0, []

    def save(self, directory, overwrite=False):
        Path(directory).mkdir(parents=True, exist_ok=overwrite)
        (Path(directory) / MANIFEST).write_text(json.dumps({"format": FORMAT, "step": self.updates, "files": {}}))

    def load(self, directory):
        self.loaded.append(Path(directory).name)


def test_the_newest_complete_checkpoint_is_resumed_and_older_ones_pruned(tmp_path):
    learner = Learner()
    for step in (1, 2, 3):
        learner.updates = 5  # a step without an update: the learner's count does not order them
        resume.save(learner, tmp_path, step, {"cursor": 2 * step}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000003"]
    path, state = resume.latest(tmp_path)
    assert path.name == "step-00000003" and state == {"cursor": 6, "step": 3}
    learner.save(tmp_path / "step-00000004")  # killed before its loop state was written
    assert resume.restore(learner, tmp_path) == {"cursor": 6, "step": 3} and learner.loaded == ["step-00000003"]
    assert resume.latest(tmp_path / "none") is None and resume.restore(learner, tmp_path / "none") is None
    with pytest.raises(ValueError, match="keep"):
        resume.save(learner, tmp_path, 5, {}, keep=0)


def _cfg(tmp_path, *more):
    return load_stage_config(None, ["stage=stage1", f"run_dir={tmp_path}", "checkpoint.every_steps=2", *more])


def test_stage_checkpoints_save_when_due_resume_and_refuse_another_config(tmp_path, capsys):
    learner = Learner()
    run = StageCheckpoints(_cfg(tmp_path))
    assert run.restore(learner) is None  # a fresh run
    for step in range(1, 5):
        run.after(learner, step, 4, {"history": [step]})
    assert [p.name for p in run.root.iterdir()] == ["step-00000002"]  # every 2 steps, not after the last (final/)
    state = StageCheckpoints(_cfg(tmp_path, "resume=true", "checkpoint.keep=3")).restore(learner)
    assert state["step"] == 2 and state["history"] == [2] and learner.loaded == ["step-00000002"]
    assert "resuming after step 2" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"made with another config \(sft.epochs: 1 -> 3\)"):
        StageCheckpoints(_cfg(tmp_path, "resume=true", "sft.epochs=3")).restore(learner)
    assert learner.loaded == ["step-00000002"]  # refused before loading anything
    StageCheckpoints(_cfg(tmp_path)).restore(learner)  # a fresh run again: the stale checkpoints go
    assert not run.root.exists()
    assert StageCheckpoints(_cfg(tmp_path, "resume=true")).restore(learner) is None
    assert "holds no checkpoint: from step 0" in capsys.readouterr().err


def test_bad_checkpoint_settings_are_refused():
    for bad in ("checkpoint.every_steps=-1", "checkpoint.keep=0", "checkpoint.every_steps=1.5"):
        with pytest.raises(ValueError, match="checkpoint"):
            load_stage_config(None, [bad])
