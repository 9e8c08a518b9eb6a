"""Stage 3 or 4 on verl's own trainer: sqlrl writes the data, verl trains (docs/verl.md).

    python -m jobs.verl_stage --stage 3|4 --data-dir DIR [--model PATH] [--out DIR]
                              [--set KEY=VALUE ...] [--dry-run] [verl hydra overrides ...]

1. The stage's tasks: sqlrl's stage config (``jobs/configs/stage{3,4}.yaml``) with
   ``data.synth_dir=DIR`` (a folder written by ``python -m sqlrl.synth``), GPU-scale sizes
   (``DATA_DEFAULTS``) and ``--set`` changes of any other key, read and mixed by
   ``jobs.stage_data.prepare_data`` -- the train split and the held-out split of sqlrl's own stage job.
2. The data: ``curriculum.builders.build_rl_data`` in the stage's mode (what sqlrl's stage job
   runs), writing ``OUT/train.parquet`` and ``OUT/val.parquet`` (tasks whose reference fails are
   dropped; stage-4 rows name ``agent_name: sqlrl_agent``), and ``OUT/catalog.json``.
3. The command: ``python -m verl.trainer.main_ppo --config-path jobs/configs/verl --config-name
   stage{3,4}`` with the data files, the model, the reward's catalog, what the stage's mode needs
   (``VERL_MODES``, by ``StageSpec.mode``: agentic = the tool and agent-loop config paths), the checkpoint folder (``OUT/checkpoints``), the Ray workers'
   environment, then the given overrides (they win).
   It is always printed; ``--dry-run`` stops there, otherwise this process becomes verl's trainer.

Guarantees:
- Every path in the command is absolute; the Ray workers get ``SQLRL_ROOT``, ``SQLRL_VERL_CATALOG``
  and ``PYTHONPATH`` (the repository root, for ``actors.verl``) through ``ray_kwargs``, and the
  printed line sets them too, so it can be re-run as it is.
- The command's config is composed with hydra (verl's ``ppo_trainer`` under the stage's YAML)
  before the data build: a bad override is an error here in seconds, not in verl's trainer.
- A wrong argument, a missing data folder, a data build that keeps nothing, or a machine where
  verl's trainer cannot run (no CUDA GPU -- these CPU machines -- or no verl) exits with status 2
  and one line saying why. ``--dry-run`` needs neither a GPU nor a model.
- UNVERIFIED: no training run on verl has been made in this project (no GPU with verl's stack).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "jobs" / "configs" / "verl"
# the stages verl can train: those with a config of their own here (jobs/configs/verl/stage<N>.yaml)
VERL_STAGES = tuple(sorted(int(p.stem[len("stage"):]) for p in CONFIG_DIR.glob("stage*.yaml")
                           if p.stem[len("stage"):].isdigit()))
# sqlrl's stage YAMLs hold CPU micro sizes; a verl run trains on more (later --set wins)
DATA_DEFAULTS = ("data.train_size=256", "data.eval_size=64")


class StageError(Exception):
    """Why this command cannot go on (one line; exit status 2)."""


@dataclass(frozen=True)
class VerlMode:
    """What verl's trainer needs for a stage's rollout mode (``StageSpec.mode``)."""

    agent_loop: bool  # the rows name sqlrl's agent loop (``agent_name: sqlrl_agent``); else verl's single turn
    config_files: tuple[tuple[str, str], ...] = ()  # (verl key, file in CONFIG_DIR) the command sets


VERL_MODES: dict[str, VerlMode] = {
    "single": VerlMode(agent_loop=False),
    "agentic": VerlMode(agent_loop=True, config_files=(
        ("actor_rollout_ref.rollout.multi_turn.tool_config_path", "tools.yaml"),
        ("actor_rollout_ref.rollout.agent.agent_loop_config_path", "agent_loop.yaml"))),
}


def verl_mode(stage: int) -> VerlMode:
    """The ``VerlMode`` of stage ``<stage>``'s mode in the stage registry (``curriculum.stages``)."""
    from curriculum.stages import stage_spec

    return VERL_MODES[stage_spec(f"stage{stage}").mode]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m jobs.verl_stage", description=__doc__.split("\n")[0])
    ap.add_argument("--stage", type=int, choices=VERL_STAGES, required=True)
    ap.add_argument("--data-dir", required=True, help="sqlrl task data (python -m sqlrl.synth --out DIR)")
    ap.add_argument("--model", help="an HF model folder or id (default: the previous stage's "
                                    "checkpoint of sqlrl's curriculum, <run_dir>/stage{N-1}/final)")
    ap.add_argument("--out", help="where the parquet and catalog go (default: runs/verl/stage<N>)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a key of sqlrl's stage config, e.g. data.train_size=2000 (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="write the data, print the command, stop")
    ap.add_argument("overrides", nargs="*", help="verl hydra overrides, e.g. trainer.n_gpus_per_node=8")
    return ap.parse_intermixed_args(argv)


def stage_config(stage: int, data_dir: Path, sets: Sequence[str]) -> Any:
    """sqlrl's own config of the stage, reading tasks from ``data_dir``."""
    from curriculum.config import load_stage_config

    if not data_dir.is_dir():
        raise StageError(f"--data-dir {data_dir} does not exist (make it: python -m sqlrl.synth --out {data_dir})")
    if not (data_dir / "manifest.json").is_file():
        raise StageError(f"--data-dir {data_dir} holds no manifest.json: not sqlrl task data "
                         f"(python -m sqlrl.synth --out DIR writes it)")
    try:
        return load_stage_config(ROOT / "jobs" / "configs" / f"stage{stage}.yaml",
                                 [*DATA_DEFAULTS, f"data.synth_dir={data_dir}", *sets])
    except (ValueError, TypeError, KeyError) as exc:
        raise StageError(f"--set: {exc}") from None


def data_files(out: Path) -> dict[str, Path]:
    return {"train": out / "train.parquet", "val": out / "val.parquet", "catalog": out / "catalog.json",
            "checkpoints": out / "checkpoints"}


def write_data(cfg: Any, out: Path) -> dict[str, Path]:
    """The stage's verl parquet (train, val) and database catalog (``data_files``), by sqlrl's builders."""
    from curriculum.builders import build_rl_data
    from jobs.stage_data import prepare_data
    from sqlrl.rewards import Judge
    from sqlrl.tasks.loaders.verl import AGENT_NAME

    try:
        data = prepare_data(cfg)
    except (FileNotFoundError, ValueError) as exc:  # a missing split file, a bad mixture
        raise StageError(f"reading the tasks: {exc}") from None
    judge = Judge(data.catalog)
    agent = AGENT_NAME if VERL_MODES[cfg.mode].agent_loop else None  # single: verl's single_turn_agent
    splits = (("train", data.train, cfg.data.train_split), ("val", data.eval, cfg.data.eval_split))
    for name, tasks, split in splits:
        kept, report = build_rl_data(tasks, out, name, mode=cfg.mode, schemas=data.schemas, judge=judge,
                                     split=split, agent_name=agent, schema_style=cfg.model.schema_style)
        print(f"{cfg.stage} {report.summary()}", file=sys.stderr)
        if not kept:
            raise StageError(f"the {name} data kept no task ({report.summary()}; {report.files['report']})")
    files = data_files(out)
    files["catalog"].write_text(json.dumps({k: dict(v) for k, v in data.catalog.items()}, indent=1,
                                           sort_keys=True))
    return files


def worker_env(catalog: Path) -> dict[str, str]:
    """What verl's Ray workers need in their environment to load sqlrl's modules and databases."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {"SQLRL_ROOT": str(ROOT), "SQLRL_VERL_CATALOG": str(catalog), "PYTHONPATH": path}


def verl_command(stage: int, files: dict[str, Path], model: str, overrides: Sequence[str] = (),
                 n_gpus: int = 0) -> list[str]:
    """``python -m verl.trainer.main_ppo`` with the stage's config and every key it needs."""
    sets = [f"data.train_files={files['train']}", f"data.val_files={files['val']}",
            f"actor_rollout_ref.model.path={model}",
            f"reward.custom_reward_function.reward_kwargs.catalog={files['catalog']}",
            f"trainer.default_local_dir={files['checkpoints']}"]
    sets += [f"{key}={CONFIG_DIR / name}" for key, name in verl_mode(stage).config_files]  # agentic: tools, agent loop
    sets += [f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}={v}"
             for k, v in worker_env(files["catalog"]).items()]
    if n_gpus:
        sets.append(f"trainer.n_gpus_per_node={n_gpus}")
    return [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", str(CONFIG_DIR),
            "--config-name", f"stage{stage}", *sets, *overrides]


def compose(command: Sequence[str]) -> Any:
    """The config ``command`` (from ``verl_command``) gives verl's trainer, composed by hydra."""
    from hydra import compose as hydra_compose, initialize_config_dir

    args = list(command[command.index("verl.trainer.main_ppo") + 1:])
    assert args[0] == "--config-path" and args[2] == "--config-name", args[:4]  # verl_command's order
    with initialize_config_dir(config_dir=args[1], version_base=None):
        return hydra_compose(args[3], overrides=args[4:])


def trainer_unavailable() -> str | None:
    """Why verl's trainer cannot run on this machine (``None``: it can try)."""
    if importlib.util.find_spec("verl") is None:
        return "verl is not installed: install the GPU lock first (docs/verl.md)"
    import torch

    if not torch.cuda.is_available():
        return ("verl's trainer (verl.trainer.main_ppo) needs NVIDIA GPUs with CUDA and this machine has "
                "none; --dry-run writes the data and prints the command without one")
    return None


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def default_model(cfg: Any, dry_run: bool) -> str:
    """The previous stage's checkpoint of sqlrl's curriculum in ``run_dir`` (``model.init: previous``)."""
    from curriculum.stages import previous_stage

    path = Path(cfg.run_dir).resolve() / str(previous_stage(cfg.stage)) / "final"
    if not dry_run and not (path / "config.json").is_file():
        raise StageError(f"no checkpoint in {path} (run sqlrl's {previous_stage(cfg.stage)} first) -- "
                         "or pass --model PATH")
    return str(path)


def check_style(cfg: Any, model: str) -> None:
    """``StageError`` when ``model`` records another schema rendering than the prompts use."""
    from sqlrl.agent.prompts import check_checkpoint_style

    try:
        check_checkpoint_style(model, cfg.model.schema_style, "pass --set model.schema_style={}")
    except ValueError as exc:
        raise StageError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if not args.dry_run and (why := trainer_unavailable()):
            raise StageError(why)
        cfg = stage_config(args.stage, Path(args.data_dir).resolve(), args.set)
        model = args.model or default_model(cfg, args.dry_run)
        model = str(Path(model).resolve()) if Path(model).exists() else model  # else an HF id
        check_style(cfg, model)
        out = Path(args.out or f"runs/verl/stage{args.stage}").resolve()
        files = data_files(out)
        command = verl_command(args.stage, files, model, args.overrides, 0 if args.dry_run else gpu_count())
        try:  # before the data build: a bad override fails in seconds
            compose(command)
        except Exception as exc:  # hydra's errors: an unknown key, a bad value, a bad override
            raise StageError(f"verl's config does not compose: {str(exc).splitlines()[0]}") from None
        write_data(cfg, out)
    except StageError as exc:
        print(f"jobs.verl_stage: {exc}", file=sys.stderr)
        return 2
    env = worker_env(files["catalog"])
    print(" ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(c) for c in command]),
          flush=True)
    if args.dry_run:
        return 0
    os.execvpe(command[0], command, {**os.environ, **env})  # this process becomes verl's trainer


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # SIGTERM unwinds through finally: engines and sessions closed
    sys.exit(main())
