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
        self.updates = json.loads((Path(directory) / MANIFEST).read_text())["step"]


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


def test_a_resumed_grpo_recipe_keeps_the_probe_choice_the_cursor_and_the_rows(monkeypatch, tmp_path):
    """jobs.train.train_grpo with its actors faked, checkpointing every step: stopped after step 1
    and resumed, it skips the probe (its choice is in the checkpoint), draws from where the draws
    stopped, syncs the restored weights to the rollout workers first, and returns every step's row."""
    from types import SimpleNamespace as NS

    import sqlrl.learn.batch as batch_mod
    import sqlrl.policy.load as load_mod
    from curriculum.config import CheckpointSettings, RLSettings, RolloutSettings
    from jobs.train import train_grpo

    monkeypatch.setattr(load_mod, "load_tokenizer", lambda model: (None, 0))
    monkeypatch.setattr(batch_mod, "rl_batch", lambda trajs, rewards, gids, *a, **k: [t.task_id for t in trajs])
    rewards = {"a": 0.0, "b": 1.0, "c": 0.0}  # b: always solved; a and c: alternate below

    class GRPOLearner(Learner):
        def __init__(self, log):
            super().__init__()
            self.log = log

        def step(self, batch, kind, loss):
            self.updates += 1
            self.log.append(("update", tuple(batch)))
            return {"loss": 0.5, "step": self.updates}

        version = 0

        def sync_to(self, rollout, policy="drain"):
            self.log.append(("sync", self.updates))
            return self.updates, 0.0

    def run(resume_, stop_after=None):
        log, counter = [], {"n": 0}

        def score(trajs, tasks, reward):
            out = []
            for t in tasks:
                counter["n"] += 1
                s = rewards[t.task_id] if t.task_id == "b" else float(counter["n"] % 2)
                out.append(NS(excluded=False, score=s, parts={"result": s}))
            return out

        def rollout(tasks):
            log.append(("rollout", tuple(t.task_id for t in tasks)))
            if stop_after is not None and sum(1 for e in log if e[0] == "update") >= stop_after:
                raise KeyboardInterrupt  # stands in for the kill (the e2e test kills for real)
            return [NS(task_id=t.task_id, stop_reason="submitted", n_generated=3, turns=(NS(tool_ms=0.0),),
                       n_tool_calls=0, n_tool_errors=0, n_malformed=0, loss_mask=(1, 1, 1),
                       versions=lambda: (0, 0, 0)) for t in tasks]

        cfg = NS(rl=RLSettings(steps=3, tasks_per_step=1, group_size=2, probe_samples=2),
                 rollout=RolloutSettings(batch=8), stage="stage3", mode="single", reward_name="hybrid_single",
                 data=NS(seed=0), resume=resume_, checkpoint=CheckpointSettings(every_steps=1), stage_dir=tmp_path,
                 run_dir=str(tmp_path))
        learner = GRPOLearner(log)
        rt = NS(cfg=cfg, learner=lambda model, optim, reference=False: learner, score=score,
                rollout_group=lambda *a, **k: NS(rollout=rollout), release=lambda x: None)
        try:
            _, history = train_grpo(rt, "m", [NS(task_id=k) for k in "abc"], NS(log=lambda step, m: None))
        except KeyboardInterrupt:
            history = None
        return log, history, learner

    monkeypatch.setattr("sqlrl.config.to_dict", lambda cfg: {"stage": cfg.stage})  # the fake config's record
    whole_log, whole, _ = run(False)
    assert run(False, stop_after=1)[1] is None  # stopped during step 2
    assert json.loads((tmp_path / "checkpoints" / "step-00000001" / "loop_state.json").read_text())["tasks"] \
        == ["a", "c"]  # the probe's choice: b is always solved
    log, history, learner = run(True)
    assert learner.loaded == ["step-00000001"] and log[0] == ("sync", 1)  # restored weights to the workers first
    assert [e for e in log if e[0] == "rollout"] == [e for e in whole_log if e[0] == "rollout"][-2:]  # no probe
    assert [h["groups_drawn"] for h in history] == [h["groups_drawn"] for h in whole] and len(history) == 3
    untimed = [[{k: v for k, v in h.items() if not k.endswith("_s")} for h in rows] for rows in (history, whole)]
    assert untimed[0] == untimed[1] and "probe_informative" in history[0]  # step 1's row, probe counts and all
