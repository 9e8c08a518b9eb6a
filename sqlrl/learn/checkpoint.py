"""Learner checkpoints: Hugging Face weights + optimizer/scheduler/RNG state, saved atomically.

Layout of a checkpoint folder (``checkpoint_dir(root, step)`` = ``root/step-00000012``):
- ``config.json``, ``model.safetensors``, ``generation_config.json``, tokenizer files: a normal
  Hugging Face checkpoint (``AutoModelForCausalLM.from_pretrained`` / ``load_policy`` load it);
- ``trainer_state.pt``: full (unsharded, FQN-keyed) optimizer state from
  ``get_optimizer_state_dict(full_state_dict=True)``, the ``LambdaLR`` state, the step and every
  rank's RNG states — so a checkpoint written by N ranks resumes on M ranks;
- ``manifest.json`` (written last): format tag, step, world size, mixed precision, the optimizer
  config, the model's shape-defining config fields and the sha256 of every file.

Guarantees:
- ``save_checkpoint(learner, dir)`` is a collective (all ranks call it); rank 0 writes everything
  into ``.<name>.tmp-<pid>`` next to ``dir`` and renames it into place, so ``dir`` either does not
  exist or is complete. An existing ``dir`` is an error unless ``overwrite=True``. No shared file
  system is needed: state is gathered to rank 0.
- ``load_checkpoint(learner, dir)`` restores weights, optimizer, scheduler, step (= ``version``)
  and RNG; training then continues on the same loss curve as an uninterrupted run (same batches,
  same world size; tested to float tolerance). A missing folder, a missing/corrupt manifest, a
  missing or altered file (sha256) or a checkpoint of a different model shape raises
  ``CheckpointError`` on every rank (rank 0 checks, the verdict is shared), before any state changes.
- ``latest_checkpoint(root)`` is the complete checkpoint with the highest step under ``root``
  (temporary folders and folders without a readable manifest are ignored), or None.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

FORMAT = "sqlrl-learner-checkpoint/1"
MANIFEST, TRAINER_STATE = "manifest.json", "trainer_state.pt"
SHAPE_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "tie_word_embeddings")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read (the message says which and why)."""


def checkpoint_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _shape(config: Any) -> dict[str, Any]:
    return {k: getattr(config, k, None) for k in SHAPE_FIELDS}


def _rng_state() -> dict[str, Any]:
    import random

    import numpy as np
    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _agree(learner: Any, message: str | None) -> None:
    """Raise ``CheckpointError`` on every rank if rank 0 (or any rank) reported a problem."""
    problems = [m for m in learner._gather(message) if m]
    if problems:
        raise CheckpointError(problems[0])


def _broadcast(learner: Any, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    return learner._gather(obj)[0]


def _save_hf(learner: Any, state_dict: dict[str, Any], out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(learner.config, dtype=torch.float32)
    plain.load_state_dict(state_dict, assign=True, strict=True)
    if getattr(learner.config, "tie_word_embeddings", False):
        plain.tie_weights()
    plain.generation_config = learner.model.generation_config
    plain.save_pretrained(out)
    learner.tokenizer.save_pretrained(out)


def save_checkpoint(learner: Any, directory: str | os.PathLike, *, overwrite: bool = False) -> Path:
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    out = Path(directory).resolve()
    _agree(learner, None if learner.rank != 0 or overwrite or not out.exists() else
           f"checkpoint folder {out} already exists (pass overwrite=True to replace it)")
    weights = learner.full_state_dict()
    optim_state = get_optimizer_state_dict(
        learner.model, learner.optimizer,
        options=StateDictOptions(full_state_dict=True, cpu_offload=learner.sharded))
    rngs = learner._gather(_rng_state())
    problem = None
    if learner.rank == 0:
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            _save_hf(learner, weights, tmp)
            torch.save({"optimizer": optim_state, "scheduler": learner.scheduler.state_dict(),
                        "step": learner.step_count, "rng": rngs}, tmp / TRAINER_STATE)
            files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
            manifest = {"format": FORMAT, "step": learner.step_count, "world_size": learner.world_size,
                        "mixed_precision": learner.mixed_precision, "optim": asdict(learner.optim),
                        "model": _shape(learner.config), "source": str(learner.path), "files": files}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=list))
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            problem = f"could not write checkpoint {out}: {type(exc).__name__}: {exc}"
    _agree(learner, problem)
    return out


def read_manifest(directory: str | os.PathLike, verify: bool = True) -> dict[str, Any]:
    """The manifest of a complete checkpoint (``CheckpointError`` if missing/corrupt)."""
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint folder at {path}")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a complete learner checkpoint (no {MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"unreadable manifest in {path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path / MANIFEST} is not a {FORMAT} manifest")
    if verify:
        for name, digest in manifest.get("files", {}).items():
            f = path / name
            if not f.is_file():
                raise CheckpointError(f"checkpoint {path} is missing {name}")
            if _sha256(f) != digest:
                raise CheckpointError(f"checkpoint {path}: {name} does not match its sha256 (corrupt or altered)")
    return manifest


def _read_on_rank0(learner: Any, path: Path) -> tuple[dict, dict, str | None]:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        manifest = read_manifest(path)
        if manifest["model"] != _shape(learner.config):
            raise CheckpointError(f"checkpoint {path} is for a different model: {manifest['model']} "
                                  f"vs this learner's {_shape(learner.config)}")
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        weights = model.state_dict()
        state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=False)
        return weights, state, None
    except CheckpointError as exc:
        return {}, {}, str(exc)
    except Exception as exc:
        return {}, {}, f"could not read checkpoint {path}: {type(exc).__name__}: {exc}"


def load_checkpoint(learner: Any, directory: str | os.PathLike) -> int:
    """Restore ``learner`` from ``directory`` (a collective); returns the restored step."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    path = Path(directory).resolve()
    weights, state, problem = _read_on_rank0(learner, path) if learner.rank == 0 else ({}, {}, None)
    _agree(learner, problem)
    learner.load_full_state_dict(weights)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=learner.sharded)
    set_optimizer_state_dict(learner.model, learner.optimizer, state.get("optimizer", {}), options=options)
    small = _broadcast(learner, {k: state.get(k) for k in ("scheduler", "step", "rng")})
    learner.scheduler.load_state_dict(small["scheduler"])
    learner.step_count = int(small["step"])
    rngs = small["rng"] or []
    if learner.rank < len(rngs):
        _set_rng_state(rngs[learner.rank])
    return learner.step_count


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    root = Path(root)
    if not root.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for child in root.iterdir():
        if not child.is_dir() or child.name.startswith("."):
            continue
        try:
            step = int(read_manifest(child, verify=False)["step"])
        except (CheckpointError, KeyError, TypeError, ValueError):
            continue
        if best is None or step > best[0]:
            best = (step, child)
    return best[1] if best else None
