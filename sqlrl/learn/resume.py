"""Mid-stage checkpoints: a learner checkpoint (``sqlrl.learn.checkpoint``) plus the training
loop's own state, so a stopped stage continues where it was.

Layout: ``<root>/step-<N>/`` is a complete learner checkpoint (weights, optimizer, scheduler, step,
every rank's RNG: ``save_checkpoint``) holding ``loop_state.json``: what the loop needs to go on
from step ``N`` (its position in the data, dynamic-sampling and probe state, the metrics rows so
far, the config it ran with) -- a JSON object with an integer ``step`` (the loop steps done: the
order of the checkpoints), the rest the loop's to define.

Guarantees:
- ``save(learner, root, step, state, keep=k)`` writes the checkpoint (atomically, by
  ``save_checkpoint``), then the loop state (atomically: a temporary file renamed into place), and
  only then deletes all but the newest ``k`` resumable checkpoints: at any moment the newest
  resumable checkpoint on disk is complete.
- ``latest(root)`` is ``(path, state)`` of the complete checkpoint (manifest readable) holding a
  readable loop state with the highest ``step``, or None; a checkpoint interrupted before its loop
  state was written is skipped (the one before it is used).
- ``restore(learner, root)`` loads ``latest``'s checkpoint into ``learner`` (``load_checkpoint``:
  a corrupt file is a ``CheckpointError``) and returns its state, or None when there is none.

``Checkpoints`` is one training run's use of them (the stage jobs' ``jobs.train.StageCheckpoints``
and the agent job's, ``sqlrl.gateway.job``): ``after(learner, steps_done, total, state)`` saves
every ``CheckpointSettings.every_steps`` steps (never after the last: the job's ``final/``
follows) with the run's config recorded; ``restore(learner)`` -- with ``resume`` -- loads the newest
and returns its state, refusing (``ResumeRefused``, one line naming the changed keys, before
anything is loaded) one made with another config, and saying so when there is none (the run
starts at step 0); without ``resume`` it deletes stale ones (a fresh run is never resumed from
later). ``clear()`` deletes them (once ``final/`` is saved).
No torch or ray at import.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .checkpoint import CheckpointError, checkpoint_dir, read_manifest

__all__ = ["LOOP_STATE", "CheckpointSettings", "Checkpoints", "ResumeRefused", "latest", "restore", "save"]

LOOP_STATE = "loop_state.json"


def _state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((path / LOOP_STATE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _resumable(root: Path) -> list[tuple[int, Path, dict[str, Any]]]:
    """Every complete checkpoint under ``root`` with a loop state, oldest first."""
    found = []
    for child in sorted(root.iterdir()) if root.is_dir() else ():
        if not child.is_dir() or child.name.startswith("."):
            continue
        try:
            step = int(read_manifest(child, verify=False)["step"])  # the learner's updates
        except (CheckpointError, KeyError, TypeError, ValueError):
            continue
        state = _state(child)
        if state is not None and isinstance(state.get("step"), int):
            found.append((state["step"], step, child, state))
    return [(s, path, state) for s, _, path, state in sorted(found, key=lambda x: x[:2])]


def latest(root: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    found = _resumable(Path(root))
    return (found[-1][1], found[-1][2]) if found else None


def save(learner: Any, root: str | os.PathLike, step: int, state: Mapping[str, Any], *, keep: int = 1) -> Path:
    """Checkpoint ``learner`` and the loop ``state`` as ``<root>/step-<step>`` (module doc)."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    out = checkpoint_dir(root, step)
    learner.save(out, overwrite=True)
    tmp = out / f".{LOOP_STATE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({**state, "step": step}, default=str))
    os.replace(tmp, out / LOOP_STATE)
    for _, old, _ in _resumable(Path(root))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return out


def restore(learner: Any, root: str | os.PathLike) -> dict[str, Any] | None:
    found = latest(root)
    if found is None:
        return None
    path, state = found
    learner.load(path)
    return state


@dataclass(frozen=True)
class CheckpointSettings:
    # Every this many steps the run saves its full trainer state (weights, optimizer, scheduler,
    # RNG; the loop's position, dynamic-sampling state and metrics so far) to
    # <its dir>/checkpoints/step-<N>; resume=true continues from the newest. 0 = final/ only.
    every_steps: int = 0
    keep: int = 1  # how many of the newest such checkpoints stay (older ones go once a newer one is complete)

    def __post_init__(self) -> None:
        for name, low in (("every_steps", 0), ("keep", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"checkpoint.{name} must be an integer >= {low}, got {v!r}")


class ResumeRefused(RuntimeError):
    """``resume`` asked for, and the newest checkpoint was made with another config (one line)."""


def _without(record: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``record`` (a config's ``to_dict``) without the dotted ``keys``."""
    out = dict(record)
    for key in keys:
        head, _, rest = key.partition(".")
        if rest and isinstance(out.get(head), Mapping):
            out[head] = _without(out[head], [rest])
            if not out[head]:
                del out[head]
        elif not rest:
            out.pop(head, None)
    return out


class Checkpoints:
    """One run's mid-run checkpoints in ``root`` (module docstring). ``config``: the run's config
    dataclass (recorded in each checkpoint; ``ignore``: its dotted keys that may change on a resume,
    not recorded -- secrets among them); ``name`` starts every line; ``fresh_hint`` ends the refusal
    (how to start over instead); ``say`` prints a line."""

    def __init__(self, root: str | os.PathLike, settings: CheckpointSettings, *, resume: bool, config: Any,
                 name: str, ignore: Sequence[str] = (), fresh_hint: str = "pass resume=false to start over",
                 say: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        self.root, self.settings, self.resume = Path(root), settings, resume
        self.config, self.name, self.ignore, self.fresh_hint, self.say = config, name, tuple(ignore), fresh_hint, say

    def restore(self, learner: Any) -> dict[str, Any] | None:
        from sqlrl.config import config_changes

        if not self.resume:
            shutil.rmtree(self.root, ignore_errors=True)  # a fresh run: never resumed from later
            return None
        found = latest(self.root)
        if found is None:
            self.say(f"  {self.name}: resume=true, but {self.root} holds no checkpoint: from step 0")
            return None
        path, state = found
        changes = config_changes(state.get("config") or {}, self.config, ignore=self.ignore)
        if changes:
            raise ResumeRefused(f"{self.name}: resume=true: {path} was made with another config "
                                f"({'; '.join(changes[:8])}); {self.fresh_hint}")
        restore(learner, self.root)
        self.say(f"  {self.name}: resuming after step {state['step']} from {path}")
        return state

    def after(self, learner: Any, steps_done: int, total: int, state: Mapping[str, Any]) -> None:
        from sqlrl.config import to_dict

        every = self.settings.every_steps
        if every and steps_done % every == 0 and steps_done < total:
            save(learner, self.root, steps_done, {**state, "config": _without(to_dict(self.config), self.ignore)},
                 keep=self.settings.keep)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
