"""The agent job's checkpoints and resume (Ray-free): what ``sqlrl.gateway.job.run_steps`` saves
after a step and starts again from (its module docstring, 7 and "Resume").

- ``StepsState``: the loop's state after ``step`` steps -- steps done, task cursor, the task list's
  order (by ``task_id``), the policy version the gateway serves, the metrics rows so far -- as the
  JSON a checkpoint's ``loop_state.json`` holds (``to_state`` / ``from_state``; a state that is not
  one is ``ResumeRefused``).
- ``resume_steps(checkpoints, learner)``: ``checkpoints.restore(learner)`` read as a
  ``StepsState``; step 0 when there is nothing to resume (``Checkpoints`` says so).
- ``job_checkpoints(cfg)``: ``sqlrl.learn.resume.Checkpoints`` in ``<run_dir>/checkpoints`` with
  the job's ``checkpoint.*`` and ``resume``; a resume with another config is refused except for
  the keys of ``RESUME_ANY_WAY`` (where the gateway listens, its keys, how long the job waits),
  which are not recorded either (no API key is written into a checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from sqlrl.learn.resume import Checkpoints, ResumeRefused

__all__ = ["RESUME_ANY_WAY", "StepCheckpoints", "StepsState", "job_checkpoints", "resume_steps"]

# keys that may change when a job resumes (none changes what is trained); the others must be as saved
RESUME_ANY_WAY = ("resume", "checkpoint.every_steps", "checkpoint.keep", "api_keys", "api_keys_env", "host", "port",
                  "step_timeout_s", "gateway_restart_timeout_s")


def job_checkpoints(cfg: Any, say: Callable[[str], None] = lambda line: print(line, flush=True)
                    ) -> Checkpoints:
    """The agent job's checkpoints: ``<run_dir>/checkpoints``, ``cfg.checkpoint``, ``cfg.resume``."""
    return Checkpoints(Path(cfg.run_dir) / "checkpoints", cfg.checkpoint, resume=cfg.resume, config=cfg,
                       name="train_agent", ignore=RESUME_ANY_WAY, say=say)


class StepCheckpoints(Protocol):
    """``sqlrl.learn.resume.Checkpoints`` (``job_checkpoints``) or a stage's ``StageCheckpoints``."""

    def restore(self, learner: Any) -> dict[str, Any] | None: ...

    def after(self, learner: Any, steps_done: int, total: int, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class StepsState:
    """Where the loop stands after ``step`` steps: what a checkpoint records (``sqlrl.gateway.job``, 7)."""

    step: int = 0  # steps done
    cursor: int = 0  # the next task's position in the task list (draws go on from here)
    version: int = 0  # the policy version the gateway serves (0: the start weights, never pushed)
    history: tuple[dict[str, Any], ...] = ()  # the metrics rows of the steps done
    task_ids: tuple[str, ...] | None = None  # the task list's order (None: a fresh start)

    def to_state(self) -> dict[str, Any]:
        return {"step": self.step, "cursor": self.cursor, "version": self.version, "history": list(self.history),
                "task_ids": None if self.task_ids is None else list(self.task_ids)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "StepsState":
        try:
            ids = state["task_ids"]
            return cls(int(state["step"]), int(state["cursor"]), int(state["version"]),
                       tuple(dict(r) for r in state["history"]), None if ids is None else tuple(map(str, ids)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeRefused(f"the checkpoint's loop state is not the agent job's ({type(exc).__name__}: "
                                f"{exc}); pass resume=false to start over") from None

    def tasks(self, tasks: Sequence[Any]) -> list[Any]:
        """``tasks`` in the recorded order (a fresh start: as given); a recorded task missing from
        them is ``ResumeRefused``."""
        if self.task_ids is None:
            return list(tasks)
        by_id = {t.task_id: t for t in tasks}
        missing = [i for i in self.task_ids if i not in by_id]
        if missing:
            raise ResumeRefused(f"the checkpoint's tasks are not all in this job's task list ({len(missing)} "
                                f"missing, e.g. {missing[0]!r}): the data changed; pass resume=false to start over")
        return [by_id[i] for i in self.task_ids]


def resume_steps(checkpoints: StepCheckpoints | None, learner: Any) -> StepsState:
    """``checkpoints.restore(learner)`` (the learner then holds the newest checkpoint's state) read as
    the loop's ``StepsState``; a fresh start (no checkpoints, no ``resume``, none saved): step 0."""
    state = checkpoints.restore(learner) if checkpoints is not None else None
    return StepsState() if state is None else StepsState.from_state(state)
