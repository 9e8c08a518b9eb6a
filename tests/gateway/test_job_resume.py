"""The agent job's checkpoints and resume (``sqlrl.gateway.job.run_steps`` with ``checkpoints`` /
``start``, ``sqlrl.gateway.resume``) on a deterministic fake gateway and the real in-process tiny
learner: a job stopped in step k (an exception from its step hook, as a kill would stop it) and
resumed with ``resume=true`` offers only the steps from k on, gives the new gateway the restored
weights at their policy version before any offer, and ends with the very weights (bitwise), rows
and pushes of a run never stopped; a resume with another config is refused in one line before
anything is loaded; ``resume=true`` with nothing saved starts at step 0 saying so. (The whole job
on a real gateway: tests/e2e/test_train_agent_resume.py.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch", reason="the policy stack (torch) is not installed")

from sqlrl.gateway.contract import GatewayStats  # noqa: E402
from sqlrl.gateway.job import AgentJobConfig, run_steps  # noqa: E402
from sqlrl.gateway.resume import StepsState, job_checkpoints, resume_steps  # noqa: E402
from sqlrl.learn.config import GRPOConfig  # noqa: E402
from sqlrl.learn.optim import OptimConfig  # noqa: E402
from sqlrl.learn.resume import CheckpointSettings, ResumeRefused  # noqa: E402

from .conftest import shop_task  # noqa: E402
from .test_seq_train import traced  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TASKS = [NS(task_id=f"t{i}") for i in range(5)]


class Stopped(Exception):
    """Stands in for the kill: raised from the job's step hook, mid-step."""


class Gateway:
    """Every offered rollout completes at once, the same calls for every rollout; in each group the
    first gets reward 1 and the others 0 (a signal in every group). Records offers and pushes."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.pending: list = []
        self.version = 0

    def offer(self, group_id, task, n):
        self.events.append(("offer", group_id, task.task_id))
        self.pending += [traced(f"{group_id}-{k}", group_id, 1.0 if k == 0 else 0.0) for k in range(n)]

    def finish(self):
        self.events.append(("finish",))

    def wait_step(self, timeout):
        return True

    def drain(self):
        out, self.pending = self.pending, []
        return out

    def stats(self):
        return GatewayStats()

    def update_weights(self, weights, policy, version=None):
        self.version = self.version + 1 if version is None else version
        self.events.append(("push", self.version, float(sum(v.double().sum() for v in weights.values()))))
        return self.version


def config(run_dir: Path, **over) -> AgentJobConfig:
    base = dict(run_dir=str(run_dir), steps=3, tasks_per_step=1, group_size=2, loss=GRPOConfig(),
                optim=OptimConfig(lr=1e-2, micro_batch_size=2, total_steps=3),
                checkpoint=CheckpointSettings(every_steps=1))
    return AgentJobConfig(**{**base, **over})


def learner(cfg: AgentJobConfig):
    from actors.learner import LearnerGroup

    return LearnerGroup("tiny", cfg.optim, in_process=True, seed=cfg.seed)


def job(cfg: AgentJobConfig, stop_in: int | None = None, lines: list | None = None):
    """The job's loop as ``jobs.train_agent.gateway_steps`` runs it: restore, then ``run_steps``."""
    gw, lrn = Gateway(), learner(cfg)
    checkpoints = job_checkpoints(cfg, say=(lines.append if lines is not None else print))

    def observe(step, traces):
        if step == stop_in:
            raise Stopped(step)

    start = resume_steps(checkpoints, lrn)
    try:
        rows = run_steps(cfg, TASKS, gw, lrn, pad_id=0, observe=observe, checkpoints=checkpoints, start=start)
    except Stopped:
        rows = None
    return gw, lrn, rows


def untimed(rows):
    return [{k: v for k, v in r.items() if "time" not in k and not k.endswith("_per_s")} for r in rows]


def test_a_job_stopped_mid_step_resumes_to_the_weights_of_a_run_never_stopped(tmp_path):
    whole_gw, whole, whole_rows = job(config(tmp_path / "whole"))
    assert [e[1] for e in whole_gw.events if e[0] == "push"] == [1, 2, 3]

    gw, _, rows = job(config(tmp_path / "run"), stop_in=1)  # stopped in step 2 (index 1): its rollouts lost
    assert rows is None
    saved = tmp_path / "run" / "checkpoints"
    assert [p.name for p in saved.iterdir()] == ["step-00000001"]
    state = json.loads((saved / "step-00000001" / "loop_state.json").read_text())
    assert (state["step"], state["cursor"], state["version"], len(state["history"])) == (1, 1, 1, 1)
    assert state["task_ids"] == [t.task_id for t in TASKS] and "api_keys" not in state["config"]

    lines: list[str] = []
    gw, resumed, rows = job(config(tmp_path / "run", resume=True), lines=lines)
    assert any("resuming after step 1" in line for line in lines)
    # before any offer: the restored weights to the new gateway as the version they were (1), then
    # the steps from 2 on, their tasks from the cursor (t0 was step 1's: not offered again)
    first_push = next(e for e in whole_gw.events if e[0] == "push")
    assert gw.events[0] == first_push  # ("push", 1, the sum of step 1's weights)
    offers = [e[1:] for e in gw.events if e[0] == "offer"]
    assert offers == [e[1:] for e in whole_gw.events if e[0] == "offer"][1:]
    assert offers == [("s1/g0", "t1"), ("s2/g0", "t2")]
    assert [e[1] for e in gw.events if e[0] == "push"] == [1, 2, 3]
    # the same weights, bitwise, and the same rows (step 1's from the checkpoint)
    a, b = whole.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert untimed(rows) == untimed(whole_rows) and len(rows) == 3
    assert resumed.version == whole.version == 3
    assert not (saved / "step-00000003").exists()  # none after the last step: the job's final/ follows


def test_a_resume_with_another_config_is_refused_before_anything_is_loaded(tmp_path):
    run_dir = tmp_path / "run"
    job(config(run_dir), stop_in=2)
    loaded = []

    class Learner:
        def load(self, directory):
            loaded.append(directory)

    with pytest.raises(ResumeRefused, match=r"^train_agent: resume=true: .*step-00000002 was made with another "
                                            r"config \(group_size: 2 -> 4\); pass resume=false to start over$"):
        resume_steps(job_checkpoints(config(run_dir, resume=True, group_size=4)), Learner())
    assert loaded == []
    # where the gateway listens, its keys and how long the job waits may change; the checkpoint is kept
    same = config(run_dir, resume=True, port=8123, api_keys=("new-key",), step_timeout_s=60.0,
                  checkpoint=CheckpointSettings(every_steps=2, keep=2))
    assert resume_steps(job_checkpoints(same, say=lambda line: None), Learner()).step == 2
    assert len(loaded) == 1


def test_resume_with_nothing_saved_starts_at_step_0_saying_so_and_a_fresh_run_clears_old_ones(tmp_path):
    lines: list[str] = []
    cfg = config(tmp_path / "run", resume=True)
    assert resume_steps(job_checkpoints(cfg, say=lines.append), NS()) == StepsState()
    assert lines == [f"  train_agent: resume=true, but {tmp_path / 'run' / 'checkpoints'} holds no checkpoint: "
                     "from step 0"]
    job(config(tmp_path / "run"), stop_in=1)
    assert (tmp_path / "run" / "checkpoints").is_dir()
    assert resume_steps(job_checkpoints(config(tmp_path / "run")), NS()) == StepsState()  # resume=false
    assert not (tmp_path / "run" / "checkpoints").exists()  # a fresh run is never resumed from later


def test_a_checkpoint_whose_tasks_are_gone_or_whose_state_is_not_the_jobs_is_refused():
    state = StepsState(1, 2, 1, ({"x": 1},), ("t0", "gone"))
    assert StepsState.from_state(json.loads(json.dumps(state.to_state()))) == state
    with pytest.raises(ResumeRefused, match="1 missing, e.g. 'gone'"):
        state.tasks(TASKS)
    assert [t.task_id for t in dataclasses.replace(state, task_ids=("t3", "t0")).tasks(TASKS)] == ["t3", "t0"]
    with pytest.raises(ResumeRefused, match="not the agent job's"):
        StepsState.from_state({"step": 1, "history": []})


def test_the_checkpoint_keys_load_and_are_checked():
    from sqlrl.config import load_config

    cfg = load_config(AgentJobConfig, "jobs/configs/agent.yaml", ["checkpoint.every_steps=2", "resume=true"])
    assert cfg.checkpoint == CheckpointSettings(every_steps=2) and cfg.resume
    assert load_config(AgentJobConfig, "jobs/configs/agent.yaml").checkpoint.every_steps == 0
    for bad in ("checkpoint.every_steps=-1", "checkpoint.keep=0"):
        with pytest.raises(ValueError, match="checkpoint"):
            load_config(AgentJobConfig, "jobs/configs/agent.yaml", [bad])


def test_a_stages_gateway_trainer_checkpoints_with_the_stage(monkeypatch, tmp_path):
    """``trainer: gateway`` (``jobs.gateway_stage.train_stage``) hands the loop the stage's own
    checkpoints (``<stage_dir>/checkpoints``, the stage's ``checkpoint.*`` / ``resume``, its config's
    refusal): a stage resumes through the gateway as its built-in trainers do."""
    import jobs.gateway_stage
    from curriculum.config import load_stage_config
    from jobs.train import StageCheckpoints

    cfg = load_stage_config(None, ["stage=stage4", "trainer=gateway", f"run_dir={tmp_path}", "resume=true",
                                   "checkpoint.every_steps=2"])
    got = {}

    def gateway_steps(agent_cfg, tasks, catalog, learner, sessions, asks, **kw):
        got.update(kw, agent_cfg=agent_cfg)
        return [], "http://x", 0

    monkeypatch.setattr(jobs.gateway_stage, "gateway_steps", gateway_steps)
    rt = NS(cfg=cfg, data=NS(catalog={}), ray=False, asks=None, session_source=lambda: None,
            learner=lambda model, optim, reference=False: NS())
    jobs.gateway_stage.train_stage(rt, "tiny", [shop_task("t0")], NS(log=lambda step, row: None))
    checkpoints = got["checkpoints"]
    assert isinstance(checkpoints, StageCheckpoints) and checkpoints.root == cfg.stage_dir / "checkpoints"
    assert checkpoints.cfg is cfg and got["agent_cfg"].checkpoint.every_steps == 0  # the stage's, not the job's
