"""Benchmark the learner: update-step time and tokens/s per model, ranks and precision; weight sync.

    python bench/learner.py [--models tiny,smollm2-135m] [--modes local,fsdp-1,fsdp-2]
                            [--precisions fp32,bf16] [--rows 8] [--micro 4] [--steps 3] [--quick] [--out FILE]

Workload: ``--rows`` SFT chat examples (a CREATE TABLE schema in the system prompt, a question, a
SQL answer; ~150-200 tokens a row), one identical batch per step, ``--micro`` rows per micro-batch
(per rank). Modes: ``local`` = one unsharded ``Learner`` in this process (``LearnerGroup(in_process=True)``;
bf16 = autocast), ``fsdp-N`` = N FSDP2 rank actors over gloo (bf16 = FSDP2 ``MixedPrecisionPolicy``).
Every mode gets the whole machine: the local learner uses all torch threads, each of N ranks
``cpus // N`` (Ray sets its OMP threads), so the rows compare how the same cores are used.

Reported per row (median over ``--steps`` after one warm-up step): driver wall time of
``group.step`` (sharding the batch, Ray round trip and metric reduction included), the engine's own
step time (slowest rank), trained tokens/s and input tokens/s (padding excluded) over the wall time.
Weight sync (fp32 rows only): ``sync_to`` a ``RolloutGroup`` with ``in_process=True`` in this process (gather to
rank 0 -> object store -> driver -> ``load_state_dict``), median over ``--syncs`` updates; with
``--ray-rollout`` also to one Ray rollout worker (``RolloutGroup.update_weights`` puts the dict
in the object store again). Prints a table and writes JSON (``--out``, default
bench/results/learner-<timestamp>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.learner import LearnerGroup  # noqa: E402
from actors.rollout import PolicySpec, RolloutConfig, RolloutGroup  # noqa: E402
from sqlrl.agent.chat_format import HFChatFormat  # noqa: E402
from sqlrl.learn.batch import SFTExample, sft_batch  # noqa: E402
from sqlrl.learn.config import SFTConfig  # noqa: E402
from sqlrl.learn.optim import OptimConfig  # noqa: E402
from sqlrl.policy.load import load_policy, resolve_path  # noqa: E402

SCHEMA = ("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, joined DATE);\n"
          "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), "
          "total REAL, placed DATE);\n"
          "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, price REAL, category TEXT);\n"
          "CREATE TABLE order_items (order_id INTEGER, product_id INTEGER, quantity INTEGER);")
PAIRS = [("How many customers joined in {y}?", "SELECT COUNT(*) FROM customers WHERE strftime('%Y', joined) = '{y}'"),
         ("What is the total revenue of orders placed in {y}?",
          "SELECT SUM(total) FROM orders WHERE strftime('%Y', placed) = '{y}'"),
         ("List the names of customers from the city with most orders in {y}.",
          "SELECT c.name FROM customers c JOIN orders o ON o.customer_id = c.id WHERE strftime('%Y', o.placed) = "
          "'{y}' GROUP BY c.city ORDER BY COUNT(*) DESC LIMIT 1"),
         ("Which product category sold the most units in {y}?",
          "SELECT p.category FROM products p JOIN order_items i ON i.product_id = p.id JOIN orders o ON "
          "o.id = i.order_id WHERE strftime('%Y', o.placed) = '{y}' GROUP BY p.category ORDER BY SUM(i.quantity) "
          "DESC LIMIT 1")]


def make_batch(model: str, rows: int):
    policy = load_policy(model)
    examples = [SFTExample(messages=(
        {"role": "system", "content": f"You write SQLite queries for this schema:\n{SCHEMA}"},
        {"role": "user", "content": PAIRS[i % len(PAIRS)][0].format(y=2000 + i)},
        {"role": "assistant", "content": PAIRS[i % len(PAIRS)][1].format(y=2000 + i)})) for i in range(rows)]
    return sft_batch(examples, HFChatFormat(policy.tokenizer), max_length=2048, pad_id=policy.pad_token_id)


def run_mode(model: str, mode: str, precision: str, batch, args) -> dict:
    n = 0 if mode == "local" else int(mode.split("-")[1])
    optim = OptimConfig(lr=1e-5, warmup_steps=0, total_steps=1000, micro_batch_size=args.micro)
    t0 = time.perf_counter()
    group = LearnerGroup(model, optim, n=max(1, n), in_process=n == 0, mixed_precision=precision, num_cpus=max(1, args.cpus // max(1, n)),
                         timeout_s=3600)
    start_s = time.perf_counter() - t0
    row = {"model": model, "mode": mode, "precision": precision, "ranks": n, "start_s": start_s,
           "threads_per_rank": [i["threads"] for i in group.info]}
    try:
        group.step(batch, "sft", SFTConfig())  # warm-up
        walls, engine, losses = [], [], []
        for _ in range(args.steps):
            t = time.perf_counter()
            m = group.step(batch, "sft", SFTConfig())
            walls.append(time.perf_counter() - t)
            engine.append(m["step_time_s"])
            losses.append(m["loss"])
        wall = statistics.median(walls)
        input_tokens = float(batch.attention_mask.sum())
        row.update(step_s=wall, engine_step_s=statistics.median(engine), trained_tokens=batch.n_tokens,
                   input_tokens=input_tokens, trained_tok_s=batch.n_tokens / wall, input_tok_s=input_tokens / wall,
                   losses=losses, walls=walls)
        if precision == "fp32" and args.syncs:
            rollout = RolloutGroup(RolloutConfig(PolicySpec(model, backend="hf"), in_process=True))
            syncs = []
            for _ in range(args.syncs):
                group.step(batch, "sft", SFTConfig())
                version, seconds = group.sync_to(rollout)
                assert rollout.workers[0].get_version() == version
                syncs.append(seconds)
            row["sync_local_s"] = statistics.median(syncs)
            if args.ray_rollout and n:
                remote = RolloutGroup(RolloutConfig(PolicySpec(model, backend="hf"), n_workers=1, num_cpus=1))
                try:
                    ray.get([w.get_version.remote() for w in remote.workers.values()])  # started: time the sync only
                    group.step(batch, "sft", SFTConfig())
                    row["sync_ray_worker_s"] = group.sync_to(remote)[1]
                finally:
                    remote.shutdown()
    finally:
        group.shutdown()
    return row


def fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict]) -> None:
    print(f"\n{'model':<14}{'mode':<8}{'prec':<6}{'step s':>8}{'engine s':>10}{'trained tok/s':>15}"
          f"{'input tok/s':>13}{'sync local s':>14}{'sync ray s':>12}{'start s':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<14}{r['mode']:<8}{r['precision']:<6} error: {r['error']}")
            continue
        print(f"{r['model']:<14}{r['mode']:<8}{r['precision']:<6}{fmt(r['step_s'], '.3f'):>8}"
              f"{fmt(r['engine_step_s'], '.3f'):>10}{fmt(r['trained_tok_s'], '.0f'):>15}{fmt(r['input_tok_s'], '.0f'):>13}"
              f"{fmt(r.get('sync_local_s'), '.3f'):>14}{fmt(r.get('sync_ray_worker_s'), '.3f'):>12}"
              f"{fmt(r['start_s'], '.1f'):>9}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,smollm2-135m")
    ap.add_argument("--modes", default="local,fsdp-1,fsdp-2")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--micro", type=int, default=4, help="rows per micro-batch (per rank)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up)")
    ap.add_argument("--syncs", type=int, default=2, help="timed weight syncs per fp32 row (0: none)")
    ap.add_argument("--ray-rollout", action="store_true", help="also sync to one Ray rollout worker")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="4 rows, 1 timed step, 1 sync")
    ap.add_argument("--out", default=None, help="default: bench/results/learner-<timestamp>.json")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.steps, args.syncs = 4, 1, 1
    out = Path(args.out or ROOT / "bench" / "results" / f"learner-{time.strftime('%Y%m%d-%H%M%S')}.json")
    # one logical CPU more than the ranks take, for the --ray-rollout worker
    ray.init(num_cpus=args.cpus + 1, include_dashboard=False, log_to_driver=False)
    rows, batches = [], {}
    try:
        for model in args.models.split(","):
            batch = batches[model] = make_batch(model, args.rows)
            print(f"{model}: {len(batch)} rows x {batch.input_ids.shape[1]} columns, "
                  f"{batch.n_tokens:.0f} trained / {int(batch.attention_mask.sum())} input tokens", flush=True)
            for mode in args.modes.split(","):
                for precision in args.precisions.split(","):
                    try:
                        row = run_mode(model, mode, precision, batch, args)
                    except Exception as exc:  # report the row, keep measuring the others
                        row = {"model": model, "mode": mode, "precision": precision,
                               "error": f"{type(exc).__name__}: {exc}"}
                    rows.append(row)
                    print_table([row])
    finally:
        ray.shutdown()
    print_table(rows)
    cpu_flags = ""
    try:
        cpu_flags = " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
                             if f" {f}" in Path("/proc/cpuinfo").read_text())
    except OSError:
        pass
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "cpu_flags": cpu_flags,
                          "python": platform.python_version(), "torch": torch.__version__,
                          "cuda": torch.cuda.is_available()},
              "ray": ray.__version__, "config": vars(args),
              "models": {m: str(resolve_path(m)) for m in batches}, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
