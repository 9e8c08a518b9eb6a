"""Batch inference: a model and tasks in, predictions in the evaluators' formats out.

    python -m jobs.infer --model tiny --tasks data/synth/text2sql_test.jsonl --db-root data/synth/databases
    python -m jobs.infer --model smollm2-135m --spider ../shared/data/spider --split dev --limit 50 \\
                         --mode single --k 8 --temperature 0.8
    ray job submit --working-dir . -- python -m jobs.infer ... --workers 2

Each task is rolled out ``--k`` times (``--k 1 --temperature 0``: greedy) through the agent loop
(``--mode agentic``: tools on a leased session; ``single``: ``<thought>/<solution>``). With k > 1 the
answer is chosen by **self-consistency** (SQL-R1): the candidates are executed on fresh sessions and
the largest group of equal results wins (tie-break: the higher mean token log-probability, then the
earlier sample; ``sqlrl.eval.vote``). Writes to ``--out``:

- text-to-SQL: ``pred.sql`` + ``gold.sql`` (Spider format) and ``predict.json`` + ``gold_bird.sql``
  (BIRD format), so ``python -m jobs.evaluate spider --gold OUT/gold.sql --pred OUT/pred.sql --db DB``
  scores them;
- debugging: ``pred_critic.jsonl`` (BIRD-CRITIC ``pred_sqls``) and ``tasks_critic.jsonl``;
- ``trajectories.jsonl`` (every rollout) and ``summary.json``; the evaluate commands are printed.
Path options (``--tasks``, ``--db-root``, ``--spider``, ``--model`` when it is a folder) are checked
before anything runs; all missing ones are named at once (exit 2). In a terminal a progress bar,
otherwise a heartbeat line at least every ``SQLRL_HEARTBEAT_S`` (60) seconds.
Reads top to bottom: check → load → roll out → vote → write.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from jobs.console import Heartbeat, check_paths, make_console, quiet_third_party_bars

console = make_console(stderr=True)


def load_tasks(a: argparse.Namespace) -> Any:
    from sqlrl.tasks.loaders import load_jsonl, load_spider

    if a.spider:
        return load_spider(a.spider, a.split)
    if not a.tasks:
        raise SystemExit("give --tasks FILE.jsonl (with --db-root) or --spider PATH")
    return load_jsonl(a.tasks, db_root=a.db_root)


def path_problems(a: argparse.Namespace) -> list[str]:
    """Every path option that does not exist (or is the wrong kind), named; ``--model`` only when it
    is not a named model."""
    from sqlrl.policy.load import MODELS

    problems = check_paths([("--tasks", a.tasks, "file"), ("--db-root", a.db_root, "dir"),
                            ("--spider", a.spider, "dir"),
                            ("--model", None if a.model in MODELS else a.model, "dir")])
    return [p + (f" (and not a named model: {', '.join(sorted(MODELS))})" if p.startswith("--model") else "")
            for p in problems]


def mean_logprob(t: Any) -> float | None:
    n = t.n_generated
    return sum(t.old_logprobs) / n if n else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.infer", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="a named model (tiny, smollm2-135m) or a checkpoint folder")
    ap.add_argument("--tasks", help="tasks JSONL (sqlrl format)")
    ap.add_argument("--db-root", help="SQLite databases for --tasks: <db_id>/<db_id>.sqlite")
    ap.add_argument("--spider", help="a Spider folder (instead of --tasks)")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--limit", type=int, default=None, help="first N tasks only")
    ap.add_argument("--mode", default="agentic", choices=["agentic", "single"])
    ap.add_argument("--k", type=int, default=1, help="candidates per task (self-consistency when > 1)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--max-total-tokens", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=16, help="trajectories per rollout call")
    ap.add_argument("--workers", type=int, default=0, help="Ray rollout workers (0: in-process)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.k < 1:
        raise SystemExit("--k must be >= 1")
    problems = path_problems(a)
    if problems:
        for problem in problems:
            console.print(f"infer: {problem}", style="red", markup=False, highlight=False)
        return 2
    quiet_third_party_bars()
    out = Path(a.out or f"runs/infer/{time.strftime('%Y%m%d-%H%M%S')}")

    # -- load
    from actors.db_pool import DBPoolConfig, DBPoolGroup
    from actors.rollout import RolloutConfig, RolloutGroup
    from sqlrl.agent.loop import LoopConfig
    from sqlrl.db import open_session
    from sqlrl.db.lease import Catalog
    from sqlrl.db.shard import ShardConfig
    from sqlrl.eval.vote import vote
    from sqlrl.eval.writers import write_bird, write_critic, write_spider
    from sqlrl.policy.types import SamplingParams
    from sqlrl.tasks.io import write_tasks

    try:
        taskset = load_tasks(a)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"infer: {exc}", style="red", markup=False, highlight=False)
        return 2
    tasks = [t for t in taskset.tasks if t.db_id in taskset.catalog][: a.limit]
    if not tasks:
        why = "the file holds no tasks" if not taskset.tasks else "no task has a database (check --db-root)"
        console.print(f"infer: {why}", style="red", markup=False, highlight=False)
        return 2
    dialects = sorted({t.dialect for t in tasks})
    ray_mode = a.workers > 0
    if ray_mode:
        import ray

        ray.init(ignore_reinit_error=True)
    pool = DBPoolGroup(DBPoolConfig(
        rollout_workers=max(1, a.workers), per_worker={"+".join(dialects): 1}, reward={},
        in_process=not ray_mode, shard=ShardConfig(catalog=Catalog(taskset.catalog))))
    sampling = SamplingParams(temperature=a.temperature, top_p=a.top_p,
                              max_new_tokens=a.max_new_tokens, seed=a.seed)
    loop = LoopConfig(mode=a.mode, max_turns=a.max_turns, max_total_tokens=a.max_total_tokens,
                      sampling=sampling)
    group = RolloutGroup(RolloutConfig(model=a.model, loop=loop, n_workers=a.workers), pool,
                         taskset.schemas)

    # -- roll out (each task k times, in batches)
    from rich.progress import Progress

    repeated = [t for t in tasks for _ in range(a.k)]
    trajectories: list[Any] = []
    t0 = time.perf_counter()
    label = f"rollouts ({a.model}, k={a.k})"
    try:
        if console.is_terminal:
            with Progress(console=console, transient=True) as bar:
                job = bar.add_task(label, total=len(repeated))
                for start in range(0, len(repeated), a.batch):
                    trajectories += group.rollout(repeated[start:start + a.batch])
                    bar.update(job, completed=len(trajectories))
        else:
            with Heartbeat(f"infer: {label}", total=len(repeated), unit="trajectories") as beat:
                for start in range(0, len(repeated), a.batch):
                    trajectories += group.rollout(repeated[start:start + a.batch])
                    beat.update(len(trajectories))
    finally:
        group.shutdown()
        pool.shutdown()
    rollout_s = time.perf_counter() - t0

    # -- vote (self-consistency when k > 1)
    answers: list[str | None] = []
    for i, task in enumerate(tasks):
        group_t = trajectories[i * a.k:(i + 1) * a.k]
        candidates = [t.submitted_sql for t in group_t]
        if a.k == 1:
            answers.append(candidates[0])
            continue
        url = taskset.catalog[task.db_id][task.dialect]

        def execute(sql: str, url: str = url, pre: tuple = tuple(getattr(task, "preprocess_sql", ()))):
            with open_session(url, preprocess_sql=list(pre)) as s:
                return s.execute(sql)
        answers.append(vote(candidates, execute, logprobs=[mean_logprob(t) for t in group_t]).sql)

    # -- write
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "trajectories.jsonl", "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
    t2s = [(t, s) for t, s in zip(tasks, answers) if t.kind == "text2sql"]
    critic = [(t, s) for t, s in zip(tasks, answers) if t.kind == "critic"]
    commands = []
    if t2s:
        write_spider(out / "pred.sql", [s for _, s in t2s])
        (out / "gold.sql").write_text("".join(f"{' '.join(t.gold_sql.split())}\t{t.db_id}\n" for t, _ in t2s))
        write_bird(out / "predict.json", [s for _, s in t2s], [t.db_id for t, _ in t2s])
        (out / "gold_bird.sql").write_text((out / "gold.sql").read_text())
        db = a.db_root or (Path(a.spider) / "database" if a.spider else "DB")
        commands.append(f"python -m jobs.evaluate spider --gold {out}/gold.sql --pred {out}/pred.sql --db {db}")
    if critic:
        write_critic(out / "pred_critic.jsonl", [(t.instance_id, [s] if s else []) for t, s in critic])
        write_tasks(out / "tasks_critic.jsonl", [t for t, _ in critic])
        commands.append(f"python -m jobs.evaluate critic --tasks {out}/tasks_critic.jsonl "
                        f"--pred {out}/pred_critic.jsonl --db-root {a.db_root}")
    stops: dict[str, int] = {}
    for t in trajectories:
        stops[t.stop_reason] = stops.get(t.stop_reason, 0) + 1
    summary = {"model": a.model, "mode": a.mode, "k": a.k, "tasks": len(tasks),
               "trajectories": len(trajectories), "rollout_s": rollout_s,
               "answered": sum(s is not None for s in answers), "stop_reasons": stops,
               "generated_tokens": sum(t.n_generated for t in trajectories),
               "evaluate": commands}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(json.dumps(summary, indent=1), markup=False, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
