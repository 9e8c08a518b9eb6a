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
No torch or ray at import.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

from .checkpoint import CheckpointError, checkpoint_dir, read_manifest

__all__ = ["LOOP_STATE", "latest", "restore", "save"]

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
