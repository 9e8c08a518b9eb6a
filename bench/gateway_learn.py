"""Does it learn? Train the LangGraph example agent through the gateway and score it before / after.

    python bench/gateway_learn.py                       # the stage-2 checkpoint, the full run (coordinator)
    python bench/gateway_learn.py --model tiny --quick  # a few minutes: the wiring, not a result

1. **Held-out tasks**: ``--eval-tasks`` (default 64) tasks of the embedded data's ``test`` split
   (``sqlrl.synth``, every domain, generated once into ``--data-dir``); training uses the ``train``
   split of the same generation, so no held-out task is trained on.
2. **Before**: the start model (``--model``, default ``/work/mainjob/runs/main/stage2/final``) behind
   the gateway, each held-out task handed to ONE rollout of the unchanged LangGraph agent
   (``examples.run_clients --agent langgraph``, ``--clients`` processes); the outcome of a task is
   ``sqlrl.rl.outcome.solved`` on the Judge's reward parts of its final SQL (expired / failed: 0,
   counted). Nothing is trained (groups of one carry no GRPO signal: ``min_group_size: 2``).
3. **Train**: ``jobs.train_agent.run`` for ``--steps`` GRPO steps (``--tasks-per-step`` x
   ``--group-size``, ``--sampling-rounds``, ``train_tags: [write, rewrite]`` -- the seed's setting),
   the same agent as clients.
4. **After**: step 2 on the trained checkpoint (``<out>/train/final``), the same tasks.
5. **Report** (``<out>/report.json`` + a markdown table on stdout): success before / after with
   Wilson intervals, the paired difference (``sqlrl.eval.stats.paired_difference``: paired
   bootstrap over the same tasks, 95 %) with tasks gained / lost, and trace exactness over every
   traced call of the three phases: calls captured whole vs incomplete, the share merged into
   sequences, mismatches by cause (``sqlrl.gateway.sequences``), and 0 re-tokenised (the gateway
   records the engine's ids; nothing is decoded and re-encoded anywhere on this path).

``--quick``: the tiny model (unless ``--model`` is given), 1 step x 2 tasks x 2 rollouts, 8 held-out
tasks, small data, 32 tokens per call and one query per rollout (the agent's ``--max-tokens`` /
``--max-turns``): it checks the script end to end; its numbers mean nothing. Timings are not
measurements on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_MODEL = "/work/mainjob/runs/main/stage2/final"
AGENT = "langgraph"


@dataclass(frozen=True)
class _Parts:
    parts: dict[str, float]  # what ``solved`` reads


def _data(args: argparse.Namespace, split: str, size: int = 0) -> Any:
    from sqlrl.gateway.job import DataSpec
    from sqlrl.synth.domains import DOMAINS

    domains = tuple(DOMAINS)
    # the test split is ~10 % of each domain's tasks: enough of them for --eval-tasks
    n = max(args.n_per_domain, math.ceil(args.eval_tasks / 0.1 / len(domains)) + 4)
    return DataSpec(synth_dir=str(args.data_dir), domains=domains, n_per_domain=n, split=split, seed=0, size=size)


def _job_config(args: argparse.Namespace, model: str, run_dir: Path, key: str, **kw: Any) -> Any:
    from sqlrl.gateway.job import AgentJobConfig
    from sqlrl.learn.config import GRPOConfig
    from sqlrl.policy.spec import PolicySpec

    base = dict(run_dir=str(run_dir), policy=PolicySpec(model, backend=args.backend), api_keys=(key,), api_keys_env="",
                rollout_deadline_s=args.deadline_s, train_tags=("write", "rewrite"), seed=args.seed,
                loss=GRPOConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="token-mean"))
    return AgentJobConfig(**{**base, **kw})


def _agent_args(args: argparse.Namespace) -> list[str]:
    return ["--max-tokens", str(args.max_tokens), "--max-turns", str(args.max_turns)]


def evaluate(args: argparse.Namespace, model: str, run_dir: Path, traces_out: list) -> dict[str, int]:
    """Each held-out task to one rollout of the agent; ``{task_id: 0/1}`` (module docstring, step 2)."""
    from jobs.train_agent import gateway_steps, load_tasks, start_clients, stop_clients
    from sqlrl.db.source import LocalSessions
    from sqlrl.rl.outcome import solved

    tasks, catalog, _ = load_tasks(_data(args, "test", args.eval_tasks))
    if len(tasks) < args.eval_tasks:
        raise SystemExit(f"gateway_learn: only {len(tasks)} held-out tasks, asked for {args.eval_tasks}")
    key = secrets.token_urlsafe(18)
    cfg = _job_config(args, model, run_dir, key, steps=1, tasks_per_step=len(tasks), group_size=1, min_group_size=2)
    clients: list[Any] = []
    seen: list[Any] = []
    try:
        gateway_steps(cfg, tasks, catalog, None, LocalSessions(catalog), None, log=lambda s, m: None,
                      on_url=lambda url: clients.append(start_clients(url, key, AGENT, args.clients, _agent_args(args))),
                      observe=lambda step, traces: seen.extend(traces),
                      after_steps=lambda: stop_clients(clients, args.deadline_s))
    finally:
        stop_clients(clients, args.deadline_s)
    traces_out.extend(seen)
    by_task = {t.task_id: t for t in seen}
    return {t.task_id: int(by_task[t.task_id].status == "completed"
                           and solved(_Parts(dict(by_task[t.task_id].reward_parts))))
            for t in tasks if t.task_id in by_task}


def exactness(traces: list[Any], turn_end_ids: tuple[int, ...]) -> dict[str, Any]:
    """Trace exactness over ``traces`` (module docstring, step 5)."""
    from sqlrl.gateway.sequences import SequenceConfig, training_rows
    from sqlrl.learn.config import GRPOConfig

    rows = training_rows(traces, SequenceConfig(turn_end_ids=turn_end_ids, max_length=None), GRPOConfig())
    causes: Counter[str] = Counter()
    for r in rows.rollouts:
        causes.update(r.mismatches)
    followers = sum(max(0, r.n_calls - 1) for r in rows.rollouts)
    calls = sum(len(t.calls) for t in traces)
    incomplete = sum(t.n_incomplete for t in traces)
    return {"rollouts": len(traces), "calls_captured": calls, "calls_incomplete": incomplete,
            "captured_share": calls / (calls + incomplete) if calls + incomplete else 1.0,
            "merged": sum(r.n_merged for r in rows.rollouts), "could_merge": followers,
            "merged_share": sum(r.n_merged for r in rows.rollouts) / followers if followers else 1.0,
            "mismatches": dict(sorted(causes.items())), "retokenised": 0,
            "statuses": dict(Counter(t.status for t in traces))}


def report_md(rep: dict[str, Any]) -> str:
    b, a, d, x = rep["before"], rep["after"], rep["paired"], rep["exactness"]
    lines = [f"Held-out success of the LangGraph agent ({rep['eval_tasks']} tasks of the embedded test split), "
             f"model {rep['model']}, {rep['steps']} GRPO step(s) through the gateway:", "",
             "| | success | 95 % interval |", "|---|---:|---:|",
             f"| before | {b['rate']:.3f} ({b['successes']}/{b['n']}) | {b['ci95'][0]:.3f}-{b['ci95'][1]:.3f} |",
             f"| after | {a['rate']:.3f} ({a['successes']}/{a['n']}) | {a['ci95'][0]:.3f}-{a['ci95'][1]:.3f} |",
             f"| change (paired) | {d['diff']:+.3f} (gained {d['gained']}, lost {d['lost']}) | "
             f"{d['ci95'][0]:+.3f}-{d['ci95'][1]:+.3f} |", "",
             f"Trace exactness: {x['calls_captured']} calls captured whole, {x['calls_incomplete']} incomplete "
             f"({x['captured_share']:.3f}); merged {x['merged']}/{x['could_merge']} ({x['merged_share']:.3f}); "
             f"mismatches {x['mismatches'] or 'none'}; re-tokenised {x['retokenised']}; rollouts {x['statuses']}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/gateway_learn.py", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help=f"start checkpoint (default {DEFAULT_MODEL}; --quick: tiny)")
    ap.add_argument("--quick", action="store_true", help="a few minutes on the tiny model: the wiring, not a result")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--tasks-per-step", type=int, default=None)
    ap.add_argument("--group-size", type=int, default=None)
    ap.add_argument("--sampling-rounds", type=int, default=1)
    ap.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks (default 64; --quick 8)")
    ap.add_argument("--clients", type=int, default=4, help="agent client processes")
    ap.add_argument("--max-tokens", type=int, default=None, help="per LLM call (default 512; --quick 32)")
    ap.add_argument("--max-turns", type=int, default=None, help="the agent's queries (default 3; --quick 1)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--backend", default="hf", help="the gateway's engine: hf | vllm | auto")
    ap.add_argument("--deadline-s", type=float, default=600.0, help="per-rollout deadline")
    ap.add_argument("--n-per-domain", type=int, default=24)
    ap.add_argument("--data-dir", type=Path, default=Path("runs/data/gateway_learn"))
    ap.add_argument("--out", type=Path, default=Path("runs/bench/gateway_learn"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    quick = a.quick
    a.model = a.model or ("tiny" if quick else DEFAULT_MODEL)
    a.steps = a.steps or (1 if quick else 8)
    a.tasks_per_step = a.tasks_per_step or (2 if quick else 8)
    a.group_size = a.group_size or (2 if quick else 4)
    a.eval_tasks = a.eval_tasks or (8 if quick else 64)
    a.max_tokens = a.max_tokens or (32 if quick else 512)
    a.max_turns = a.max_turns or (1 if quick else 3)
    if quick:
        a.clients = min(a.clients, 2)
        a.n_per_domain = max(a.n_per_domain, 8)

    from jobs.train_agent import run, start_clients, stop_clients
    from sqlrl.agent.chat_format import HFChatFormat
    from sqlrl.eval.stats import paired_difference, success_rate
    from sqlrl.learn.optim import OptimConfig
    from sqlrl.policy.load import load_tokenizer

    t0 = time.perf_counter()
    a.out.mkdir(parents=True, exist_ok=True)
    traces: list[Any] = []
    print(f"gateway_learn: before -- {a.model} on {a.eval_tasks} held-out tasks", flush=True)
    before = evaluate(a, a.model, a.out / "eval_before", traces)

    key = secrets.token_urlsafe(18)
    train_cfg = _job_config(a, a.model, a.out / "train", key, steps=a.steps, tasks_per_step=a.tasks_per_step,
                            group_size=a.group_size, sampling_rounds=a.sampling_rounds,
                            optim=OptimConfig(lr=a.lr, micro_batch_size=1), data=_data(a, "train"))
    print(f"gateway_learn: train -- {a.steps} step(s) x {a.tasks_per_step} x {a.group_size}", flush=True)
    clients: list[Any] = []
    try:
        summary = run(train_cfg, on_url=lambda url: clients.append(start_clients(url, key, AGENT, a.clients,
                                                                                   _agent_args(a))),
                      observe=lambda step, ts: traces.extend(ts),
                      after_steps=lambda: stop_clients(clients, a.deadline_s))
    finally:
        stop_clients(clients, a.deadline_s)
    trained = summary["checkpoint"]
    print(f"gateway_learn: after -- {trained}", flush=True)
    after = evaluate(a, trained, a.out / "eval_after", traces)

    tokenizer, _ = load_tokenizer(a.model)
    paired = paired_difference(before, after, seed=a.seed)
    rep = {"model": a.model, "quick": quick, "steps": a.steps, "tasks_per_step": a.tasks_per_step,
           "group_size": a.group_size, "eval_tasks": len(before), "checkpoint": trained,
           "before": success_rate(list(before.values())).to_dict(),
           "after": success_rate(list(after.values())).to_dict(),
           "paired": paired.to_dict(), "exactness": exactness(traces, HFChatFormat(tokenizer).turn_end_ids),
           "train_steps": summary["steps"], "db_active_leases": summary["db_active_leases"],
           "seconds": time.perf_counter() - t0}
    (a.out / "report.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    print(report_md(rep), flush=True)
    print(f"gateway_learn: report in {a.out / 'report.json'} ({rep['seconds'] / 60:.1f} min, not a measurement "
          f"on a shared machine)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
