"""A stage job's tasks: the train and held-out mixtures, with their database catalog and schemas.

``prepare_data(cfg)`` reads the data source the config names -- the embedded default data
(``data.synth_dir``, generated there when missing) or Spider (``data.spider=PATH``) -- through the
task-source registry ``sqlrl.tasks.loaders.LOADERS`` (``jsonl``, ``spider``), filters by
``data.difficulties``, and mixes the train split by ``data.mixture`` (Zeno; Talon = critic only)
and the held-out one by ``data.eval_mixture`` (default: the same), so a Talon run can be scored on
both task kinds.

Guarantees:
- The held-out tasks are the same for every stage of a run (same seed, size, mixture and
  difficulties), drawn with seed ``data.seed + 1`` from the eval split, each task at most once,
  balanced across (kind, difficulty, domain) strata (``held_out_tasks``); training tasks with
  ``data.seed`` (``curriculum.mixing``). A split may name several (``data.eval_split: test+dev``:
  both held-out splits of the generated data); a split named on both sides is refused
  (``DataConfig``).
- Only tasks whose database is in the catalog are kept.
- Generated data: a missing split file is a ``FileNotFoundError`` naming the file and the files
  that are there. Spider: train questions for training, dev for evaluation (held-out databases);
  with critic weight > 0, debugging tasks made by bug injection over the same gold SQL are built on
  first use and cached in ``<run_dir>/data/spider_critic``.
- ``data.unseen``: the training pool loses every task whose origin (``task_origin``) an earlier
  stage of the same ``run_dir`` trained on -- recomputed from those stages' saved
  ``config.yaml`` by this same function, so the exclusion is exactly what they drew. Stages with no
  saved config exclude nothing; the count excluded is printed.
- Long steps (generation, loading Spider, bug injection) print heartbeats (``jobs.console``).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from curriculum.config import StageConfig
from jobs.console import Heartbeat
from jobs.output import console



@dataclass(frozen=True)
class StageData:
    train: tuple[Any, ...]
    eval: tuple[Any, ...]
    catalog: Mapping[str, Mapping[str, str]]
    schemas: Mapping[str, Any]
    source: str

    def counts(self) -> dict[str, dict[str, int]]:
        return {"train": dict(Counter(t.kind for t in self.train)),
                "eval": dict(Counter(t.kind for t in self.eval))}


Split = tuple[list, list, dict, dict, str]  # train, held-out, catalog, schemas, source description


def _load_split(root: Path, split: str, kinds: Sequence[str]) -> list[Any]:
    """Each kind's tasks of ``split``; ``"test+dev"`` names several splits, read one after another."""
    from sqlrl.tasks.loaders import load

    sets = []
    for part in split.split("+"):
        for kind in kinds:
            path = root / f"{kind}_{part}.jsonl"
            if not path.is_file():
                raise FileNotFoundError(f"{path} does not exist (data.{'train' if 'train' in split else 'eval'}"
                                        f"_split={split!r}; files in {root}: "
                                        f"{', '.join(sorted(p.name for p in root.glob('*.jsonl')))})")
            sets.append(load("jsonl", path, db_root=root / "databases"))
    return sets


def generated(cfg: StageConfig) -> Split:
    """The embedded default data, generated into ``data.synth_dir`` on first use."""
    from sqlrl.synth.dataset import build_default_dataset

    root = Path(cfg.data.synth_dir)
    if not (root / "manifest.json").is_file():
        console.print(f"[bold]data[/bold]: generating the embedded default data into {root} "
                      f"({cfg.data.n_per_domain} tasks per domain)")
        kw = {"domains": list(cfg.data.domains)} if cfg.data.domains else {}
        with Heartbeat("data: generating the embedded default data", note=str(root)):
            build_default_dataset(root, seed=cfg.data.seed, n_per_domain=cfg.data.n_per_domain, **kw)
    kinds = [k for k, w in cfg.data.mixture.items() if w > 0]
    eval_kinds = [k for k, w in cfg.data.held_out_mixture.items() if w > 0]
    train_sets = _load_split(root, cfg.data.train_split, kinds)
    eval_sets = _load_split(root, cfg.data.eval_split, eval_kinds)
    catalog, schemas = {}, {}
    for ts in train_sets + eval_sets:
        catalog.update(ts.catalog)
        schemas.update(ts.schemas)
    train = [t for ts in train_sets for t in ts.tasks if t.db_id in ts.catalog]
    held = [t for ts in eval_sets for t in ts.tasks if t.db_id in ts.catalog]
    return train, held, catalog, schemas, f"generated ({root})"


def spider(cfg: StageConfig) -> Split:
    """Spider train questions for training, dev for evaluation (held-out databases); debugging
    tasks from ``sqlrl.synth``'s bug injection over the same gold SQL (built on first use)."""
    from sqlrl.tasks.io import write_tasks
    from sqlrl.tasks.loaders import load
    from sqlrl.synth.critic_gen import make_critic_tasks

    root = Path(cfg.data.spider)  # type: ignore[arg-type]
    with Heartbeat("data: loading Spider", note=str(root)):
        train_set, dev_set = load("spider", root, split="train"), load("spider", root, split="dev")
    catalog = {**train_set.catalog, **dev_set.catalog}
    schemas = {**train_set.schemas, **dev_set.schemas}
    train = [t for t in train_set.tasks if t.db_id in catalog]
    held = [t for t in dev_set.tasks if t.db_id in catalog]
    if max(cfg.data.mixture.get("critic", 0), cfg.data.held_out_mixture.get("critic", 0)) > 0:
        cache = Path(cfg.run_dir) / "data" / "spider_critic"
        cache.mkdir(parents=True, exist_ok=True)
        for name, tasks in (("train", train), ("dev", held)):
            path = cache / f"critic_{name}.jsonl"
            if not path.is_file():
                pool = _sample(tasks, 8 * max(cfg.data.train_size, cfg.data.eval_size), cfg.data.seed)
                with Heartbeat(f"data: Spider debugging tasks ({name})",
                               note=f"bug injection + verification over {len(pool)} source tasks"):
                    made, _report = make_critic_tasks(pool, {k: dict(v) for k, v in catalog.items()},
                                                      seed=cfg.data.seed)
                write_tasks(path, made)
            tasks.extend(load("jsonl", path).tasks)
    return train, held, catalog, schemas, f"spider ({root})"


# Where a stage's tasks come from: data.spider=PATH picks "spider", otherwise the generated data.
SOURCES: dict[str, Callable[[StageConfig], Split]] = {"generated": generated, "spider": spider}


def _sample(tasks: Sequence[Any], n: int, seed: int) -> list[Any]:
    tasks = list(tasks)
    random.Random(seed).shuffle(tasks)
    return tasks[:n]


def prepare_data(cfg: StageConfig) -> StageData:
    from curriculum.mixing import MixtureConfig, mix, pools_by_kind

    train, held, catalog, schemas, source = SOURCES["spider" if cfg.data.spider else "generated"](cfg)
    if cfg.data.difficulties:
        wanted = set(cfg.data.difficulties)
        train = [t for t in train if getattr(t, "difficulty", None) in wanted]
        held = [t for t in held if getattr(t, "difficulty", None) in wanted]
    if cfg.data.unseen:
        seen, stages = seen_origins(cfg)
        kept = [t for t in train if task_origin(t) not in seen]
        console.print(f"[bold]data[/bold]: data.unseen: {len(train) - len(kept)} of {len(train)} training tasks "
                      f"left out (trained on by {', '.join(stages) or 'no earlier stage in ' + str(cfg.run_dir)})")
        train = kept
    train_mix = mix(pools_by_kind(train), MixtureConfig(cfg.data.mixture, cfg.data.train_size, cfg.data.seed))
    eval_set = held_out_tasks(held, cfg)
    return StageData(tuple(train_mix), tuple(eval_set), catalog, schemas, source)


def task_origin(task: Any) -> str:
    """The question a task comes from: a debugging task made by bug injection names it in
    ``meta["origin_task_id"]``; any other task is its own origin."""
    meta = getattr(task, "meta", None) or {}
    return str(meta.get("origin_task_id") or task.task_id)


def seen_origins(cfg: StageConfig) -> tuple[set[str], list[str]]:
    """The origins of the training tasks of the stages before ``cfg.stage`` (``curriculum.stages``
    order) that saved a config in ``cfg.run_dir``, and those stages' names."""
    from curriculum.config import load_stage_config
    from curriculum.stages import STAGES

    order = list(STAGES)
    seen: set[str] = set()
    stages = []
    for stage in order[:order.index(cfg.stage)]:
        path = Path(cfg.run_dir) / stage / "config.yaml"
        if path.is_file():
            seen |= {task_origin(t) for t in prepare_data(load_stage_config(path)).train}
            stages.append(stage)
    return seen, stages


def spider_held_out(root: str | Path, n: int, seed: int = 0) -> StageData:
    """A fixed subset of ``n`` Spider dev questions (databases never seen in training), balanced
    across (difficulty, database) strata with ``seed``: the same questions for every checkpoint.
    A folder without Spider is a ``FileNotFoundError`` naming what is missing."""
    from sqlrl.eval.strata import stratified_sample
    from sqlrl.tasks.loaders import load

    root = Path(root)
    if not (root / "dev.json").is_file():
        raise FileNotFoundError(f"{root / 'dev.json'} does not exist: give the Spider folder (with dev.json, "
                                f"tables.json and database/)")
    with Heartbeat("data: loading Spider dev", note=str(root)):
        dev = load("spider", root, split="dev")
    tasks = [t for t in dev.tasks if t.db_id in dev.catalog]
    picked = stratified_sample(tasks, n, seed=seed, weights={"text2sql": 1.0})
    return StageData((), tuple(picked), dev.catalog, dev.schemas, f"spider dev ({root}, {len(picked)} questions)")


def held_out_tasks(held: Sequence[Any], cfg: StageConfig) -> list[Any]:
    """``data.eval_size`` distinct held-out tasks, kinds by ``data.eval_mixture`` (else
    ``data.mixture``), balanced across (kind, difficulty, domain) strata (``sqlrl.eval.strata.stratified_sample``, seed ``data.seed + 1``);
    fewer, with a warning, when the eval split has fewer."""
    from sqlrl.eval.strata import stratified_sample

    picked = stratified_sample(held, cfg.data.eval_size, seed=cfg.data.seed + 1, weights=cfg.data.held_out_mixture)
    if len(picked) < cfg.data.eval_size:
        console.print(f"[bold]data[/bold]: the eval split has {len(picked)} usable held-out tasks, fewer "
                      f"than data.eval_size={cfg.data.eval_size}: evaluating on all {len(picked)}")
    return picked
