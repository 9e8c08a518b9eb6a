"""Batch inference: a model and tasks in, predictions in the evaluators' formats out.

    python -m jobs.infer --model tiny --tasks data/synth/text2sql_test.jsonl --db-root data/synth/databases
    python -m jobs.infer --model smollm2-135m --spider ../shared/data/spider --split dev --limit 50 \\
                         --mode single --k 8 --temperature 0.8
    ray job submit --working-dir . -- python -m jobs.infer ... --workers 2
    python -m jobs.infer --config jobs/configs/infer.yaml --k 4 tasks.limit=20

Each task is rolled out ``--k`` times (``--k 1 --temperature 0``: greedy) through the agent loop
(``--mode agentic``: tools on a leased session; ``single``: ``<thought>/<solution>``). With k > 1 the
answer is chosen by **self-consistency** (SQL-R1): the candidates are executed on fresh sessions and
the largest group of equal results wins (tie-break: the higher mean token log-probability, then the
earlier sample; ``sqlrl.eval.vote``). Writes to ``--out``:

- text-to-SQL: ``pred.sql`` + ``gold.sql`` (Spider format) and ``predict.json`` + ``gold_bird.sql``
  (BIRD format), so ``python -m jobs.evaluate spider --gold OUT/gold.sql --pred OUT/pred.sql --db DB``
  scores them;
- debugging: ``pred_critic.jsonl`` (BIRD-CRITIC ``pred_sqls``) and ``tasks_critic.jsonl``;
- every task, of any kind (a kind with no evaluator format above too): ``answers.jsonl``
  (``task_id``, ``kind``, ``sql``; ``write_predictions``);
- ``trajectories.jsonl`` (every rollout) and ``summary.json``; the evaluate commands are printed.
Settings: ``InferConfig`` (typed, strict: ``sqlrl.config``) from ``--config FILE.yaml``, then the
flags above, then ``key=value`` overrides (``tasks.source=bird tasks.path=…``: any task source of
``sqlrl.tasks.loaders.LOADERS``; ``rollout.backend=vllm``). The wiring (pool partitions, rollout
workers, what each asks Ray for: ``placement``) is ``jobs.runtime``'s, the stage jobs' own.
Path options (``--tasks``, ``--db-root``, ``--spider``, ``--model`` when it is a folder, and the
config's ``tasks.path`` / ``tasks.db_root`` / ``model``) are checked before anything runs; all
missing ones are named at once (exit 2). While the rollouts run, a heartbeat line at least every
``SQLRL_HEARTBEAT_S`` (60) seconds.
Reads top to bottom: check → load → roll out → vote → write.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from curriculum.config import RolloutSettings
from jobs.console import Heartbeat, check_paths, make_console, quiet_third_party_bars

console = make_console(stderr=True)


@dataclass(frozen=True)
class TaskSource:
    source: str = "jsonl"  # a name in sqlrl.tasks.loaders.LOADERS (jsonl, spider, bird, critic, verl)
    path: str | None = None  # what that loader reads (a file or a folder)
    split: str | None = None  # for loaders that take one (spider: dev by default)
    db_root: str | None = None  # for loaders that take one (jsonl: <db_root>/<db_id>/<db_id>.sqlite)
    limit: int | None = None  # the first N tasks only

    def __post_init__(self) -> None:
        from sqlrl.tasks.loaders import LOADERS

        if self.source not in LOADERS:
            raise ValueError(f"unknown task source {self.source!r}; known: {', '.join(LOADERS)}")

    def load(self) -> Any:
        """The ``TaskSet`` (``LOADERS[source]``), given ``split`` / ``db_root`` where it takes them."""
        from sqlrl.tasks.loaders import LOADERS, load

        if not self.path:
            raise ValueError("give --tasks FILE.jsonl (with --db-root), --spider PATH, or tasks.path")
        takes = inspect.signature(LOADERS[self.source]).parameters
        kw = {k: v for k, v in (("split", self.split), ("db_root", self.db_root)) if v is not None and k in takes}
        return load(self.source, self.path, **kw)


@dataclass(frozen=True)
class InferConfig:
    model: str = "tiny"  # a named model (tiny, smollm2-135m) or a checkpoint folder
    tasks: TaskSource = field(default_factory=TaskSource)
    mode: Literal["agentic", "single"] = "agentic"
    k: int = 1  # candidates per task (self-consistency when > 1)
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    rollout: RolloutSettings = field(default_factory=lambda: RolloutSettings(max_new_tokens=256,
                                                                             max_total_tokens=8192))
    workers: int = 0  # Ray rollout workers (0: in-process)
    placement: str = "cpu"  # a profile of deploy/placement.yaml: what each actor asks Ray for
    out: str | None = None  # default: runs/infer/<time>

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError("k (--k) must be >= 1")


Answers = list[tuple[Any, "str | None"]]  # (task, its chosen SQL or None), in task order


def write_text2sql(out: Path, pairs: Answers, cfg: InferConfig) -> str:
    """Spider (``pred.sql``, ``gold.sql``) and BIRD (``predict.json``, ``gold_bird.sql``) files."""
    from sqlrl.eval.writers import write_bird, write_spider

    write_spider(out / "pred.sql", [s for _, s in pairs])
    (out / "gold.sql").write_text("".join(f"{' '.join(t.gold_sql.split())}\t{t.db_id}\n" for t, _ in pairs))
    write_bird(out / "predict.json", [s for _, s in pairs], [t.db_id for t, _ in pairs])
    (out / "gold_bird.sql").write_text((out / "gold.sql").read_text())
    spider = cfg.tasks.source == "spider"
    db = cfg.tasks.db_root or (Path(cfg.tasks.path) / "database" if spider else "DB")  # type: ignore[arg-type]
    return f"python -m jobs.evaluate spider --gold {out}/gold.sql --pred {out}/pred.sql --db {db}"


def write_critic_answers(out: Path, pairs: Answers, cfg: InferConfig) -> str:
    """BIRD-CRITIC's ``pred_critic.jsonl`` (``pred_sqls``) and the tasks, ``tasks_critic.jsonl``."""
    from sqlrl.eval.writers import write_critic
    from sqlrl.tasks.io import write_tasks

    write_critic(out / "pred_critic.jsonl", [(t.instance_id, [s] if s else []) for t, s in pairs])
    write_tasks(out / "tasks_critic.jsonl", [t for t, _ in pairs])
    return (f"python -m jobs.evaluate critic --tasks {out}/tasks_critic.jsonl "
            f"--pred {out}/pred_critic.jsonl --db-root {cfg.tasks.db_root}")


def _evaluator_formats() -> dict[str, Any]:
    """Task kind (``sqlrl.tasks.kinds``) -> the writer of its evaluator's prediction files (returns
    the command that scores them)."""
    from sqlrl.tasks.kinds import CRITIC, TEXT2SQL

    return {TEXT2SQL.name: write_text2sql, CRITIC.name: write_critic_answers}


def write_predictions(out: Path, tasks: list[Any], answers: list["str | None"], cfg: InferConfig) -> list[str]:
    """Every task's answer in ``answers.jsonl`` (task id, kind, SQL: whatever its kind), then, for
    each kind ``_evaluator_formats`` has a writer for (in its order), that evaluator's files;
    returns the evaluate commands. A kind without one loses nothing: its answers are in
    ``answers.jsonl``."""
    with open(out / "answers.jsonl", "w", encoding="utf-8") as f:
        for t, sql in zip(tasks, answers):
            f.write(json.dumps({"task_id": t.task_id, "kind": t.kind, "sql": sql}, ensure_ascii=False) + "\n")
    by_kind: dict[str, Answers] = {}
    for t, sql in zip(tasks, answers):
        by_kind.setdefault(t.kind, []).append((t, sql))
    formats = _evaluator_formats()
    return [write(out, by_kind[kind], cfg) for kind, write in formats.items() if kind in by_kind]


# flag -> config key (flags override --config; key=value overrides override flags)
FLAGS = {"model": "model", "tasks": "tasks.path", "spider": "tasks.path", "db_root": "tasks.db_root",
         "split": "tasks.split", "limit": "tasks.limit", "mode": "mode", "k": "k", "temperature": "temperature",
         "top_p": "top_p", "max_turns": "rollout.max_turns", "max_new_tokens": "rollout.max_new_tokens",
         "max_total_tokens": "rollout.max_total_tokens", "batch": "rollout.batch", "workers": "workers",
         "seed": "seed", "out": "out"}
SOURCE_FLAGS = {"tasks": "jsonl", "spider": "spider"}  # a flag that also names the task source


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The flags, and the config overrides they stand for (in order: --config's file comes first)."""
    ap = argparse.ArgumentParser(prog="python -m jobs.infer", description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=None, help="a YAML file mirroring jobs.infer.InferConfig")
    ap.add_argument("--model", help="a named model (tiny, smollm2-135m) or a checkpoint folder (default tiny)")
    ap.add_argument("--tasks", help="tasks JSONL (sqlrl format)")
    ap.add_argument("--db-root", help="SQLite databases for --tasks: <db_id>/<db_id>.sqlite")
    ap.add_argument("--spider", help="a Spider folder (instead of --tasks)")
    ap.add_argument("--split", help="the Spider split (default dev)")
    ap.add_argument("--limit", type=int, help="first N tasks only")
    ap.add_argument("--mode", choices=["agentic", "single"], help="default agentic")
    ap.add_argument("--k", type=int, help="candidates per task (self-consistency when > 1; default 1)")
    ap.add_argument("--temperature", type=float, help="default 0")
    ap.add_argument("--top-p", type=float, help="default 1")
    ap.add_argument("--max-turns", type=int, help="default 4")
    ap.add_argument("--max-new-tokens", type=int, help="default 256")
    ap.add_argument("--max-total-tokens", type=int, help="default 8192")
    ap.add_argument("--batch", type=int, help="trajectories in flight per rollout worker (default 16)")
    ap.add_argument("--workers", type=int, help="Ray rollout workers (default 0: in-process)")
    ap.add_argument("--seed", type=int, help="default 0")
    ap.add_argument("--out", help="default runs/infer/<time>")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. rollout.backend=vllm")
    a = ap.parse_args(argv)
    overrides = []
    for flag, key in FLAGS.items():
        value = getattr(a, flag)
        if value is not None:
            if flag in SOURCE_FLAGS:
                overrides.append(f"tasks.source={SOURCE_FLAGS[flag]}")
            overrides.append(f"{key}={json.dumps(value)}")  # JSON is YAML: a path stays a string
    return a, overrides + a.overrides


def path_problems(options: list[tuple[str, str | None, str]]) -> list[str]:
    """Every path option that does not exist (or is the wrong kind), named; a model only when it is
    not a named model."""
    from sqlrl.policy.load import MODELS

    problems = check_paths([(o, None if o.endswith("model") and v in MODELS else v, kind) for o, v, kind in options])
    return [p + (f" (and not a named model: {', '.join(sorted(MODELS))})" if p.split(":")[0].endswith("model") else "")
            for p in problems]


def mean_logprob(t: Any) -> float | None:
    n = t.n_generated
    return sum(t.old_logprobs) / n if n else None


def refuse(problems: list[str]) -> int:
    for problem in problems:
        console.print(f"infer: {problem}", style="red", markup=False, highlight=False)
    return 2


def main(argv: list[str] | None = None) -> int:
    # -- check: the flags' paths, then the config, then its paths
    a, overrides = parse_args(argv)
    problems = path_problems([("--tasks", a.tasks, "file"), ("--db-root", a.db_root, "dir"),
                              ("--spider", a.spider, "dir"), ("--model", a.model, "dir")])
    if problems:
        return refuse(problems)
    from sqlrl.config import ConfigError, load_config

    try:
        cfg = load_config(InferConfig, a.config, overrides)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"infer: {exc}") from None
    problems = path_problems([("tasks.path", cfg.tasks.path, "any"), ("tasks.db_root", cfg.tasks.db_root, "dir"),
                              ("model", cfg.model, "dir")])
    if problems:
        return refuse(problems)
    from sqlrl.agent.prompts import checkpoint_schema_style
    try:
        style = checkpoint_schema_style(cfg.model)  # prompt the model the way it was trained
    except ValueError as exc:
        return refuse([str(exc)])
    quiet_third_party_bars()
    out = Path(cfg.out or f"runs/infer/{time.strftime('%Y%m%d-%H%M%S')}")

    # -- load
    from curriculum.placement import load_profile
    from jobs.runtime import connect_ray, loop_config, rollout_group, session_pool
    from sqlrl.db import open_session
    from sqlrl.eval.vote import vote
    from sqlrl.tasks.kinds import kind_of

    try:
        taskset = cfg.tasks.load()
    except (FileNotFoundError, ValueError) as exc:
        return refuse([str(exc)])
    tasks = [t for t in taskset.tasks if t.db_id in taskset.catalog][: cfg.tasks.limit]
    if not tasks:
        return refuse(["the file holds no tasks" if not taskset.tasks else "no task has a database (check --db-root)"])
    if cfg.workers > 0:
        connect_ray()
    asks = load_profile(cfg.placement)
    pool = session_pool(taskset.catalog, [t.dialect for t in tasks], workers=cfg.workers, reward=False, asks=asks)
    r = cfg.rollout
    loop = loop_config(cfg.mode, max_turns=r.max_turns, max_total_tokens=r.max_total_tokens,
                       max_new_tokens=r.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
                       schema_style=style, max_concurrent=r.batch)
    group = rollout_group(pool, taskset.schemas, r.policy(cfg.model), loop, workers=cfg.workers, asks=asks)

    # -- roll out (each task k times, in one call: each worker runs rollout.batch at once)
    repeated = [t for t in tasks for _ in range(cfg.k)]
    t0 = time.perf_counter()
    try:
        with Heartbeat(f"infer: rollouts ({cfg.model}, k={cfg.k})", total=len(repeated), unit="trajectories",
                       enabled=True) as beat:  # one call: a line while it runs, in a terminal too
            trajectories: list[Any] = list(group.rollout(repeated))
            beat.update(len(trajectories))
    finally:
        group.shutdown()
        pool.shutdown()
    rollout_s = time.perf_counter() - t0

    # -- vote (self-consistency when k > 1)
    answers: list[str | None] = []
    for i, task in enumerate(tasks):
        group_t = trajectories[i * cfg.k:(i + 1) * cfg.k]
        candidates = [t.submitted_sql for t in group_t]
        if cfg.k == 1:
            answers.append(candidates[0])
            continue
        url = taskset.catalog[task.db_id][task.dialect]

        def execute(sql: str, url: str = url, pre: tuple = kind_of(task).scene_sql(task)):
            with open_session(url, preprocess_sql=list(pre)) as s:
                return s.execute(sql)
        answers.append(vote(candidates, execute, logprobs=[mean_logprob(t) for t in group_t]).sql)

    # -- write
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "trajectories.jsonl", "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
    commands = write_predictions(out, tasks, answers, cfg)
    stops: dict[str, int] = {}
    for t in trajectories:
        stops[t.stop_reason] = stops.get(t.stop_reason, 0) + 1
    summary = {"model": cfg.model, "mode": cfg.mode, "k": cfg.k, "tasks": len(tasks),
               "trajectories": len(trajectories), "rollout_s": rollout_s,
               "answered": sum(s is not None for s in answers), "stop_reasons": stops,
               "generated_tokens": sum(t.n_generated for t in trajectories),
               "evaluate": commands}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(json.dumps(summary, indent=1), markup=False, highlight=False)
    return 0


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # SIGTERM unwinds through finally: engines and sessions closed
    sys.exit(main())
