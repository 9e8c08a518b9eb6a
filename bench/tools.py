"""Benchmark the agent loop's tool phase on the Ray pool: one execute_many per round vs one call per trajectory.

    python bench/tools.py [--trajectories 16] [--rounds 5] [--shards 2] [--out FILE]

Workload: ``--trajectories`` agentic rollouts of synthetic text-to-SQL tasks (``bench/rollout.py``'s
workload: seeded domain databases, SQLite), driven by ``bench/rollout.py``'s gold replay (a
scripted policy: explore with ``execute_sql``, run the gold SQL with ``execute_sql``, submit) so
that every trajectory calls its tools in the same rounds and generation costs ~0. The sessions
are leased from a real Ray DB-session pool (shard actors on a private local Ray,
``--shards`` SQLite shards for the one rollout worker); the rollout worker runs in this process,
as an in-process ``RolloutGroup`` runs it, with its pool client talking to the actors.

Variants, interleaved in every round (the order alternates):
- ``batched`` (``LoopConfig.batch_tools=True``, the default): each round's ``execute_sql`` calls
  go to the pool in one ``execute_many`` -- one round trip per shard;
- ``serial`` (``batch_tools=False``, the loop before this change): one blocking pool call per
  trajectory.

Reported: tool time per round (the wall time of the round's tool phase: the shared ``tool_ms`` of
a batched round, the sum of the trajectories' ``tool_ms`` of a serial one), for the two
``execute_sql`` rounds, and the paired per-round ratio serial / batched (median over rounds).
Numbers depend on the machine and its load (the pool's round trips are Ray actor calls on
loopback). Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rollout import REPLAY_MAX_NEW_TOKENS, GoldReplayBackend, build_workload  # noqa: E402

VARIANTS = {"batched": True, "serial": False}


def round_tool_ms(trajectories: list, batched: bool, k: int) -> float:
    """Wall time of round ``k``'s tool phase, from the turns' ``tool_ms``."""
    times = [t.turns[k].tool_ms for t in trajectories]
    return max(times) if batched else sum(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--domains", default="shop,library")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "tools.json"))
    a = ap.parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from actors.db_pool import DBPoolConfig, DBPoolGroup
    from actors.rollout import PolicySpec, RolloutConfig, RolloutWorker
    from sqlrl.agent.loop import LoopConfig
    from sqlrl.db.leases.protocol import Catalog
    from sqlrl.db.leases.shard import ShardConfig
    from sqlrl.policy.types import SamplingParams

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             _temp_dir=f"/tmp/sqlrl-bench-tools-{os.getpid()}")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        domains = [d for d in a.domains.split(",") if d]
        distinct, urls, schemas = build_workload(Path(tmp), domains, -(-a.trajectories // len(domains)), 0)
        tasks = distinct[:a.trajectories]
        catalog = Catalog({db: {"sqlite": url} for db, url in urls.items()})
        pool = DBPoolGroup(DBPoolConfig(rollout_workers=1, per_worker={"sqlite": a.shards}, reward={},
                                        shard=ShardConfig(catalog=catalog)))
        loop = LoopConfig(max_turns=3, max_total_tokens=8192,
                          sampling=SamplingParams(max_new_tokens=REPLAY_MAX_NEW_TOKENS, temperature=0.0))
        worker = RolloutWorker(0, RolloutConfig(PolicySpec("tiny", backend="hf"), loop=loop), pool.client(0), schemas)
        worker.backend = GoldReplayBackend(worker.policy.tokenizer, worker.chat, tasks, schemas, "agentic",
                                           "hermes")
        worker.rollout(tasks)  # warm-up: connections opened, actors hot
        print(f"{len(tasks)} trajectories over {', '.join(urls)}, {a.shards} SQLite shard actors; "
              f"gold replay (explore, gold SQL, submit)", flush=True)
        for r in range(a.rounds):
            for name in (list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))):
                worker.agent.loop = dataclasses.replace(loop, batch_tools=VARIANTS[name])
                t0 = time.perf_counter()
                trajs = worker.rollout(tasks)
                wall = time.perf_counter() - t0
                bad = [t.error for t in trajs if t.stop_reason != "submitted"]
                if bad:
                    raise SystemExit(f"bench: a replayed trajectory did not submit: {bad[0]}")
                per_round = [round_tool_ms(trajs, VARIANTS[name], k) for k in (0, 1)]
                rows.append({"round": r, "variant": name, "tool_ms_per_round": per_round,
                             "rollout_s": wall})
                print(f"round {r} {name:<7}: tool per round {per_round[0]:7.1f} / {per_round[1]:7.1f} ms, "
                      f"rollout {wall:.2f} s", flush=True)
        pool.shutdown()
    ray.shutdown()

    def get(r: int, name: str) -> dict:
        return next(x for x in rows if x["round"] == r and x["variant"] == name)

    ratios = [statistics.mean(get(r, "serial")["tool_ms_per_round"]) /
              statistics.mean(get(r, "batched")["tool_ms_per_round"]) for r in range(a.rounds)]
    summary = {name: {"tool_ms_per_round": statistics.median(
        statistics.mean(get(r, name)["tool_ms_per_round"]) for r in range(a.rounds)),
        "rollout_s": statistics.median(get(r, name)["rollout_s"] for r in range(a.rounds))}
        for name in VARIANTS}
    print(f"\n| variant | tool time per round (ms, median) | rollout (s, median) |\n|---|---|---|")
    for name, v in summary.items():
        print(f"| {name} | {v['tool_ms_per_round']:.1f} | {v['rollout_s']:.2f} |")
    print(f"\npaired per-round ratio serial / batched: median {statistics.median(ratios):.2f}x "
          f"(per round {[round(x, 2) for x in ratios]})")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "summary": summary, "ratios": ratios,
                               "ratio_median": statistics.median(ratios), "trajectories": a.trajectories,
                               "shards": a.shards, "cpus": os.cpu_count(), "load_avg": os.getloadavg()},
                              indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
