"""Benchmark agentic rollouts: the async engines (continuous batching, one coroutine per trajectory)
against the lock-step adapter over the batch backends (one ``generate`` call per round of waiting
requests), side by side.

    python bench/rollout.py engines [--model smollm2-135m | --model runs/main/stage2/final]
                                    [--pairs vllm:vllm-batched,hf:hf-batched] [--rounds 3]
                                    [--trajectories 32] [--max-turns 4] [--quick] [--out FILE]

Workload: ``--trajectories`` agentic rollouts (``--group`` samples of each of
``trajectories / group`` text-to-SQL tasks of the embedded default data: ``sqlrl.synth`` domains
built in a temporary folder, as jobs/stage_data.py makes them), up to ``--max-turns`` turns of
``--max-new-tokens``, temperature 1.0, unseeded (fresh draws on both sides: the lock-step adapter
makes one call per distinct seed on a seeded HF backend, which would measure no batching at all),
tools on fresh SQLite sessions (``LocalSessions``), all through the real ``AgentLoop.arun``. With a
trained checkpoint (``--model`` a folder, e.g. the main job's stage-2 ``final``) turn lengths vary
naturally; SmolLM2 as shipped mostly writes one long turn.

Engines: the registry's (``vllm``, ``vllm-batched``, ``hf``, ``hf-batched``) and ``vllm-uni``,
``VLLMEngine`` with the model worker inside vLLM's engine-core process (``UniProcExecutor``; the
default is vLLM's CPU layout, a third process for the worker) -- e.g. ``--pairs
vllm:vllm-batched,vllm-uni:vllm-batched`` measures both layouts against the same lock-step runs (a
lock-step engine shared by pairs runs once a round).

Each engine is built (``sqlrl.policy.backends.make_engine``), used for one rollout and closed, so at
most one vLLM engine is alive at a time; start-up is timed apart and not counted. Every round runs
both engines of every pair, the order reversed on odd rounds. Reported per engine: trajectories/s
(trajectories / rollout wall time), generated tokens/s, turns, and the **mean running batch size
over time** -- the sequences the engine was decoding, sampled every 20 ms by a thread for the
whole rollout (``RUNNING``: ``HFEngine``'s running rows, vLLM's reported running requests, the
adapter's current call size; a thread, because the vLLM adapter's calls block the event loop on
CPU) -- and its mean while busy (samples > 0). **Paired per-round ratios**: async trajectories/s
divided by lock-step trajectories/s in the same round; the median over rounds and every round's
value (target from issue 43: >= 1.5x on vLLM). Machine load (``os.getloadavg``) before and after
each mode and the run's estimated full duration are printed and saved. Markdown table + JSON in
``bench/results/rollout-engines-<timestamp>.json`` (or ``--out``).

**Decode-throughput ceiling** (``--curve 1,4,8,16,32``, on by default; ``--curve ""`` skips it;
``bench/decode_ceiling.py``): after its rollout, each engine decodes for b sequences at once, and
the best throughput bounds the async / lock-step ratio any schedule could reach here.

``--quick``: 8 trajectories x 2 turns of 32 tokens, 1 round -- a check that everything runs, not
a measurement; it prints the estimated duration of the default full run from its own timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_ceiling import ceilings, decode_curve  # noqa: E402

# engine name -> the sequences it is decoding now (read from a sampler thread)
RUNNING: dict[str, Callable[[Any], int]] = {
    "hf": lambda e: len(e._scheduler.rows),
    "vllm": lambda e: int(e.counters()["running"]),
    "vllm-uni": lambda e: int(e.counters()["running"]),
    "hf-batched": lambda e: len(e._running),
    "vllm-batched": lambda e: len(e._running),
}
DEFAULT_THREADS = 0  # torch's own default, read in main()
ENGINE_OPTIONS: dict[str, dict[str, Any]] = {
    "vllm": {"max_model_len": 4096, "kv_cache_gb": 2},
    "vllm-batched": {"max_model_len": 4096, "kv_cache_gb": 2},
    # VLLMEngine with the model worker inside vLLM's engine-core process (UniProcExecutor, named by
    # its class: vLLM's CPU platform rewrites "uni" to "mp"); the default is vLLM's CPU layout, a
    # separate worker process busy-polled by the engine core (docs/benchmarks.md: measured slower)
    "vllm-uni": {"max_model_len": 4096, "kv_cache_gb": 2, "distributed_executor_backend": "uniproc"},
    "hf": {"max_batch": 64},
    "hf-batched": {},
}


ENGINE_OF = {"vllm-uni": "vllm"}  # bench variants of a registered engine (other options)


def engine_options(name: str) -> dict[str, Any]:
    """``ENGINE_OPTIONS[name]`` with ``"uniproc"`` as vLLM's ``UniProcExecutor`` class."""
    options = dict(ENGINE_OPTIONS[name])
    if options.get("distributed_executor_backend") == "uniproc":
        from vllm.v1.executor.uniproc_executor import UniProcExecutor

        options["distributed_executor_backend"] = UniProcExecutor
    return options


def workload(folder: Path, trajectories: int, group: int, seed: int) -> tuple[list, dict, dict]:
    """(tasks, the LocalSessions catalog, schemas by db id): ``trajectories // group`` tasks
    interleaved over two domains, each repeated ``group`` times."""
    from sqlrl.synth import build_domain_db, generate_text2sql
    from sqlrl.tasks.schema import DatabaseSchema

    distinct = max(1, trajectories // group)
    catalog, schemas, by_domain = {}, {}, []
    for dom in ("shop", "library"):
        path = build_domain_db(dom, str(folder / f"{dom}.sqlite"), seed=seed, scale=0.2)
        tasks = generate_text2sql(dom, path, (distinct + 1) // 2, seed=seed)
        by_domain.append(tasks)
        catalog[tasks[0].db_id] = {"sqlite": f"sqlite:///{os.path.abspath(path)}"}
        schemas[tasks[0].db_id] = DatabaseSchema.from_sqlite(path, db_id=tasks[0].db_id)
    tasks = [t for pair in zip(*by_domain) for t in pair][:distinct]
    return [t for t in tasks for _ in range(group)], catalog, schemas


class Sampler:
    """Samples ``RUNNING[name](engine)`` every ``period`` seconds on a thread until stopped."""

    def __init__(self, name: str, engine: Any, period: float = 0.02) -> None:
        self.read, self.engine, self.period = RUNNING[name], engine, period
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.read(self.engine))
            except Exception:  # a read racing a change: skip this sample
                pass
            self._stop.wait(self.period)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        busy = [s for s in self.samples if s > 0]
        return {"mean_running": statistics.fmean(self.samples) if self.samples else 0.0,
                "mean_running_busy": statistics.fmean(busy) if busy else 0.0, "samples": len(self.samples)}


def run_mode(name: str, policy: Any, tasks: list, catalog: dict, schemas: dict, loop_config: Any,
             threads: int, curve: list[int] = (), curve_tokens: int = 64, curve_context: int = 0) -> dict:
    import torch

    from sqlrl.agent.chat_format import HFChatFormat
    from sqlrl.agent.loop import AgentLoop
    from sqlrl.db.source import LocalSessions, SessionRequest
    from sqlrl.policy.backends import make_engine

    load0 = os.getloadavg()[0]
    # torch threads for the in-process HF engines only: vLLM's in-process CPU engine (the
    # vllm-batched adapter) checks that the calling thread keeps the OpenMP thread count it started with
    torch.set_num_threads(threads if name in ("hf", "hf-batched") else DEFAULT_THREADS)
    t0 = time.perf_counter()
    engine = make_engine(ENGINE_OF.get(name, name), policy, **engine_options(name))
    startup = time.perf_counter() - t0
    source = LocalSessions(catalog)
    sessions = source.open_many([SessionRequest(t.db_id) for t in tasks])
    try:
        loop = AgentLoop(tasks, sessions, engine, HFChatFormat(policy.tokenizer), loop_config, schemas=schemas)
        sampler = Sampler(name, engine)
        t0 = time.perf_counter()
        trajectories = loop.run()
        wall = time.perf_counter() - t0
        running = sampler.stop()
        source.close_many(sessions)
        sessions = []
        if curve_context < 0:  # the rollout's own mean prompt length
            curve_context = round(statistics.fmean(t.prompt_length for t in trajectories))
        measured = decode_curve(engine, policy, list(curve), curve_tokens, curve_context) if curve else {}
    finally:
        source.close_many(sessions)
        asyncio.run(engine.close())
    turns = [t.turns for t in trajectories]
    generated = sum(turn.gen_tokens for t in trajectories for turn in t.turns)
    stops: dict[str, int] = {}
    for t in trajectories:
        stops[t.stop_reason] = stops.get(t.stop_reason, 0) + 1
    errors = [t.error for t in trajectories if t.stop_reason == "error"]
    return {"engine": name, "first_error": errors[0][:300] if errors else None, "startup_s": round(startup, 1), "wall_s": round(wall, 2),
            "traj_per_s": len(trajectories) / wall, "gen_tok_s": generated / wall,
            "turns": sum(len(t) for t in turns), "generated_tokens": generated, "stop_reasons": stops,
            "trajectories": len(trajectories), "curve": {str(b): c for b, c in measured.items()},
            "curve_context": curve_context,
            "turn_tokens": lengths([turn.gen_tokens for t in trajectories for turn in t.turns]),
            "prompt_tokens": lengths([t.prompt_length for t in trajectories]),
            "final_tokens": lengths([len(t.token_ids) for t in trajectories]),
            "tool_s": round(sum(turn.tool_ms for t in trajectories for turn in t.turns) / 1000, 2),
            **running, "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}


def lengths(values: list[int]) -> dict:
    """mean, median, 90th percentile and max of token counts (turns, prompts, whole trajectories)."""
    if not values:
        return {}
    ordered = sorted(values)
    return {"mean": round(statistics.fmean(ordered), 1), "p50": statistics.median(ordered),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "max": ordered[-1]}


def table(rows: dict[str, list[dict]], pairs: list[tuple[str, str]], ratios: dict, ceiling: dict) -> str:
    out = ["| engine | traj/s | gen tok/s | turns | mean running | mean running (busy) | start-up s |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name, runs in rows.items():
        def med(key: str) -> float:
            return statistics.median(r[key] for r in runs)
        out.append(f"| {name} | {med('traj_per_s'):.3f} | {med('gen_tok_s'):.1f} | {med('turns'):.0f} | "
                   f"{med('mean_running'):.1f} | {med('mean_running_busy'):.1f} | {med('startup_s'):.0f} |")
    for a, b in pairs:
        r = ratios[f"{a}/{b}"]
        out.append(f"\n**{a} / {b} trajectories/s, paired per round: median {r['median']:.2f}x** "
                   f"(rounds: {', '.join(f'{x:.2f}' for x in r['rounds'])})")
    sizes = sorted({int(k) for runs in rows.values() for r in runs for k in r.get("curve", {})})
    if sizes:
        out += ["\ndecode throughput, greedy, generated tok/s (median over rounds) at b sequences at once:\n",
                "| engine | " + " | ".join(f"b={b}" for b in sizes) + " |", "|---|" + "---:|" * len(sizes)]
        for name, runs in rows.items():
            cells = [statistics.median(r["curve"][str(b)]["tok_s"] for r in runs) if all(str(b) in r.get("curve", {}) for r in runs)
                     else None for b in sizes]
            out.append(f"| {name} | " + " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |")
    for key, c in ceiling.items():
        bounds = ", ".join(f"{r['ceiling']:.2f}" for r in c["rounds"])
        t_max = ", ".join(f"{r['t_max']:.1f}" for r in c["rounds"])
        at_running = ", ".join(f"{r['ceiling_at_running']:.2f}" for r in c["rounds"])
        out.append(f"\n**{key}: ceiling from the async engine's best decode throughput, median "
                   f"{c['median']:.2f}x** (rounds: {bounds}; T_max {t_max} tok/s); at the batch it kept "
                   f"running (busy mean, read off the curve): {at_running}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a named model or a checkpoint folder")
    ap.add_argument("--pairs", default="vllm:vllm-batched,hf:hf-batched", help="async:lock-step pairs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the in-process HF engines")
    ap.add_argument("--seed", type=int, default=0, help="the data's seed (sampling is unseeded)")
    ap.add_argument("--curve", default="1,4,8,16,32",
                    help="decode-throughput ceiling: batch sizes measured after each rollout ('' skips it)")
    ap.add_argument("--curve-tokens", type=int, default=64)
    ap.add_argument("--curve-context", type=int, default=-1,
                    help="prompt tokens before the curve's decoding (-1: the rollout's mean prompt length; 0: short)")
    ap.add_argument("--quick", action="store_true", help="8 trajectories x 2 turns x 32 tokens, 1 round")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.trajectories, args.max_turns, args.max_new_tokens, args.rounds = 8, 2, 32, 1
    full = {"trajectories": 32, "max_turns": 4, "max_new_tokens": 96, "rounds": 3}

    import torch

    from sqlrl.agent.loop import LoopConfig
    from sqlrl.policy.load import load_policy
    from sqlrl.policy.types import SamplingParams

    global DEFAULT_THREADS
    DEFAULT_THREADS = torch.get_num_threads()
    threads = args.threads if args.threads > 0 else DEFAULT_THREADS
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",") if p]
    try:
        curve = [int(b) for b in args.curve.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--curve: comma-separated batch sizes (got {args.curve!r})")
    if any(b < 1 for b in curve) or args.curve_tokens < 1:
        ap.error("--curve sizes and --curve-tokens must be >= 1")
    names = list(dict.fromkeys(n for pair in pairs for n in pair))  # a lock-step side shared by pairs runs once a round
    unknown = [n for n in names if n not in RUNNING]
    if unknown or any(len(p) != 2 for p in pairs):
        ap.error(f"--pairs: async:lock-step pairs of {', '.join(RUNNING)} (got {args.pairs!r})")
    policy = load_policy(args.model)
    config = LoopConfig(max_turns=args.max_turns, max_total_tokens=4096,
                        sampling=SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens))
    started, load_start = time.perf_counter(), os.getloadavg()
    rows: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="sqlrl-bench-rollout-") as tmp:
        tasks, catalog, schemas = workload(Path(tmp), args.trajectories, args.group, args.seed)
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                res = run_mode(name, policy, tasks, catalog, schemas, config, threads, curve, args.curve_tokens,
                               args.curve_context)
                rows[name].append(res)
                print(f"round {r} {name}: {res['traj_per_s']:.3f} traj/s, {res['gen_tok_s']:.1f} tok/s, "
                      f"mean running {res['mean_running']:.1f} (busy {res['mean_running_busy']:.1f}), "
                      f"start-up {res['startup_s']} s, load {res['load_before']}->{res['load_after']}, "
                      f"stops {res['stop_reasons']}", flush=True)
                print(f"  turn tokens {res['turn_tokens']}, prompt tokens {res['prompt_tokens']}, "
                      f"whole trajectory tokens {res['final_tokens']}, tool time {res['tool_s']} s", flush=True)
                if res["curve"]:
                    print(f"  decode tok/s by batch after {res['curve_context']} prompt tokens: " + ", ".join(f"b={b} {c['tok_s']:.1f}" for b, c in res["curve"].items()), flush=True)
                if res["stop_reasons"].get("error"):
                    print(f"  WARNING: {res['stop_reasons']['error']} trajectories ended with an error "
                          f"(first: {res['first_error']})", flush=True)
    ratios = {}
    for a, b in pairs:
        per_round = [x["traj_per_s"] / y["traj_per_s"] for x, y in zip(rows[a], rows[b])]
        ratios[f"{a}/{b}"] = {"median": statistics.median(per_round), "rounds": per_round}
    ceiling = ceilings(rows, pairs)
    elapsed = time.perf_counter() - started
    # the default full run from this run's timings: rollout time scales with trajectories x turns x
    # tokens, start-ups with engines x rounds
    work = sum(r["wall_s"] for runs in rows.values() for r in runs)
    startups = sum(r["startup_s"] for runs in rows.values() for r in runs)
    scale = (full["trajectories"] * full["max_turns"] * full["max_new_tokens"] * full["rounds"]) / (
        args.trajectories * args.max_turns * args.max_new_tokens * args.rounds)
    estimate = work * scale + startups * full["rounds"] / args.rounds
    print(table(rows, pairs, ratios, ceiling))
    print(f"\nmachine load (1/5/15 min): start {load_start}, end {os.getloadavg()}; this run took {elapsed:.0f} s; "
          f"estimated full run (defaults: {full}): ~{estimate / 60:.0f} min")
    result = {"args": vars(args), "model": str(policy.path), "rows": rows, "ratios": ratios, "ceilings": ceiling,
              "load_start": load_start, "load_end": os.getloadavg(), "elapsed_s": elapsed,
              "estimated_full_run_s": estimate, "quick": args.quick}
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"rollout-engines-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # kill <pid> unwinds: the vLLM engine core and sessions are closed
    raise SystemExit(main())
