"""Does it learn? Train the LangGraph example agent through the gateway and score it before / after.

    python bench/gateway_learn.py                       # the stage-2 checkpoint, the full run (coordinator)
    python bench/gateway_learn.py --model tiny --quick  # a few minutes: the wiring, not a result

1. **Held-out tasks**: ``--eval-tasks`` (default 64) tasks of the embedded data's ``test`` split
   (``sqlrl.synth``, every domain, generated once into ``<--data-dir>/n<tasks a domain>``, sized so
   the test split holds them); training uses the ``train`` split of the same generation, so no
   held-out task is trained on.
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

The agent's options: ``--max-tokens``, ``--max-turns``, ``--eval-temperature`` (before / after;
default 0: greedy, as the main job's held-out table), ``--train-temperature`` (default: none sent,
the server's 1.0) and ``--call-timeout-s`` (its client timeout per call, ``run_clients
--timeout-s``: on a loaded CPU a call past it is retried, and retries can pile up). ``--reward``
is the training job's reward (checked before anything runs; success is ``solved`` either way).
``--before-from DIR`` reads "before" from an earlier run's finished ``eval_before`` / ``eval_after``
of the same ``--model`` (a run continued from its checkpoint; ``earlier_before`` checks that run's
report and the task ids) instead of running it.

``--from-run`` runs nothing: it rebuilds the report of the run in ``--out`` from the gateway
journals of its three phases (``<out>/{eval_before,train,eval_after}/gateway_journal.jsonl``: every
ended rollout's whole trace), so a run stopped after its "after" phase began still reports the
rollouts that ended (the paired difference over the tasks scored in both; give the run's own
``--model`` / ``--quick`` so the tokenizer and the labels match).

The exactness part also says where each follow-up call's prompt leaves the earlier call of its
rollout it shares the longest prefix with (``divergences``: the two calls' tags and the message the
first differing token is in) and how many prompts hold an earlier reply's ids at all.

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
    # the test split is 10 % of each (domain, difficulty) stratum, rounded: ~7 % of the tasks at 44 a
    # domain (18 of 264), so plan on 7 %. The generation lives in a folder named by its size: a cached
    # smaller generation is never reused for a larger --eval-tasks.
    n = max(args.n_per_domain, math.ceil(args.eval_tasks / 0.07 / len(domains)) + 4)
    return DataSpec(synth_dir=str(args.data_dir / f"n{n}"), domains=domains, n_per_domain=n, split=split, seed=0,
                    size=size)


def _job_config(args: argparse.Namespace, model: str, run_dir: Path, key: str, **kw: Any) -> Any:
    from sqlrl.gateway.job import AgentJobConfig
    from sqlrl.learn.config import GRPOConfig
    from sqlrl.policy.spec import PolicySpec

    base = dict(run_dir=str(run_dir), policy=PolicySpec(model, backend=args.backend), api_keys=(key,), api_keys_env="",
                rollout_deadline_s=args.deadline_s, train_tags=("write", "rewrite"), seed=args.seed,
                loss=GRPOConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="token-mean"))
    return AgentJobConfig(**{**base, **kw})


def _agent_args(args: argparse.Namespace, temperature: float | None) -> list[str]:
    """The agent clients' options; ``temperature`` None: the agent sends none (the server's default, 1.0)."""
    temp = [] if temperature is None else ["--temperature", str(temperature)]
    return ["--max-tokens", str(args.max_tokens), "--max-turns", str(args.max_turns),
            "--timeout-s", str(args.call_timeout_s), *temp]


def evaluate(args: argparse.Namespace, model: str, run_dir: Path, traces_out: list) -> dict[str, int]:
    """Each held-out task to one rollout of the agent; ``{task_id: 0/1}`` (module docstring, step 2)."""
    from jobs.train_agent import gateway_steps, load_tasks, start_clients, stop_clients
    from sqlrl.db.source import LocalSessions

    tasks, catalog, _ = load_tasks(_data(args, "test", args.eval_tasks))
    if len(tasks) < args.eval_tasks:
        raise SystemExit(f"gateway_learn: only {len(tasks)} held-out tasks, asked for {args.eval_tasks}")
    key = secrets.token_urlsafe(18)
    cfg = _job_config(args, model, run_dir, key, steps=1, tasks_per_step=len(tasks), group_size=1, min_group_size=2)
    clients: list[Any] = []
    seen: list[Any] = []
    try:
        gateway_steps(cfg, tasks, catalog, None, LocalSessions(catalog), None, log=lambda s, m: None,
                      on_url=lambda url: clients.append(start_clients(url, key, AGENT, args.clients,
                                                                           _agent_args(args, args.eval_temperature))),
                      observe=lambda step, traces: seen.extend(traces),
                      after_steps=lambda: stop_clients(clients, args.deadline_s))
    finally:
        stop_clients(clients, args.deadline_s)
    traces_out.extend(seen)
    wanted = {t.task_id for t in tasks}
    return outcomes([t for t in seen if t.task_id in wanted])


def earlier_before(a: argparse.Namespace, traces_out: list) -> dict[str, int]:
    """``--before-from DIR``: the "before" outcomes read from an earlier run's finished evaluation
    of ``--model`` instead of run again -- ``DIR`` is that run's ``eval_before`` (its report's
    ``model``) or ``eval_after`` (its report's ``checkpoint``), and must hold one ended rollout for
    each of this run's held-out tasks, scored with the same agent options. Refused (``SystemExit``,
    naming what differs) otherwise: a report that is missing or names another model or other agent
    options, or other tasks."""
    d = Path(a.before_from)
    rep_path = d.parent / "report.json"
    if d.name not in ("eval_before", "eval_after") or not rep_path.is_file():
        raise SystemExit(f"gateway_learn: --before-from {d}: not the eval_before / eval_after folder of a "
                         f"finished run (no {rep_path})")
    rep = json.loads(rep_path.read_text())
    scored = rep.get("model") if d.name == "eval_before" else rep.get("checkpoint")
    if scored != a.model:
        raise SystemExit(f"gateway_learn: --before-from {d} scored {scored!r}, not --model {a.model!r}")
    differ = [k for k in ("max_tokens", "max_turns", "eval_temperature") if rep.get(k) != getattr(a, k)]
    if differ:
        raise SystemExit(f"gateway_learn: --before-from {d} ran with other agent options: "
                         + ", ".join(f"{k} {rep.get(k)!r} (here {getattr(a, k)!r})" for k in differ))
    from jobs.train_agent import load_tasks

    wanted = {t.task_id for t in load_tasks(_data(a, "test", a.eval_tasks))[0]}
    seen = [t for t in journal_traces(d) if t.task_id in wanted]
    got = outcomes(seen)
    if set(got) != wanted:
        raise SystemExit(f"gateway_learn: --before-from {d} has {len(got)} of this run's {len(wanted)} held-out "
                         f"tasks")
    traces_out.extend(seen)
    return got


def outcomes(traces: list[Any]) -> dict[str, int]:
    """``{task_id: 0/1}``: 1 when the task's (last) rollout completed and ``solved`` holds on its parts."""
    from sqlrl.rl.outcome import solved

    by_task = {t.task_id: t for t in traces}
    return {tid: int(t.status == "completed" and solved(_Parts(dict(t.reward_parts)))) for tid, t in by_task.items()}


def journal_traces(run_dir: Path) -> list[Any]:
    """The traces of every rollout that ended in ``run_dir``'s gateway journal (``end`` records), in
    the order they ended; [] when there is no journal (the phase never started)."""
    from sqlrl.gateway.journal import JOURNAL_FILE
    from sqlrl.gateway.trace import RolloutTrace

    path = run_dir / JOURNAL_FILE
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [RolloutTrace.from_dict(r["trace"]) for r in records if r.get("kind") == "end"]


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
            "statuses": dict(Counter(t.status for t in traces)), **divergences(traces, turn_end_ids)}


def _message_index(ids: tuple[int, ...], pos: int, turn_end_ids: tuple[int, ...]) -> int:
    """How many whole messages (``turn_end_ids`` occurrences) lie before position ``pos``."""
    k, n = 0, len(turn_end_ids)
    for i in range(max(0, min(pos, len(ids)) - n + 1)):
        if n and tuple(ids[i:i + n]) == turn_end_ids:
            k += 1
    return k


def _contains(hay: tuple[int, ...], needle: tuple[int, ...]) -> bool:
    n = len(needle)
    return bool(n) and any(hay[i:i + n] == needle for i in range(len(hay) - n + 1))


def divergences(traces: list[Any], turn_end_ids: tuple[int, ...]) -> dict[str, Any]:
    """Where each follow-up call's prompt leaves the earlier call (prompt + response) of its rollout
    that it shares the longest prefix with: ``"<earlier tag> > <later tag> @ message <k>"`` -> calls
    (``k``: the 0-based message the first differing token is in, by ``turn_end_ids``; ``k`` = the
    earlier prompt's message count means it left at the earlier response; ``extends it`` when it
    does not leave it: a call that can merge), and how many follow-up
    prompts hold an earlier call's response ids anywhere (an agent that sends its replies back as
    assistant turns: what a merge needs)."""
    where: Counter[str] = Counter()
    reply_back = 0
    for t in traces:
        for k, call in enumerate(t.calls[1:], 1):
            prompt = tuple(call.prompt_ids)
            best: tuple[int, int] = (-1, 0)
            for j in range(k):
                prev = tuple(t.calls[j].prompt_ids) + tuple(t.calls[j].response_ids)
                shared = next((i for i, (a, b) in enumerate(zip(prev, prompt)) if a != b), min(len(prev), len(prompt)))
                best = max(best, (shared, j))
            shared, j = best
            prev = tuple(t.calls[j].prompt_ids) + tuple(t.calls[j].response_ids)
            at = "extends it" if shared == len(prev) else f"@ message {_message_index(prev, shared, turn_end_ids)}"
            where[f"{t.calls[j].tag} > {call.tag} {at}"] += 1
            reply_back += any(_contains(prompt, tuple(t.calls[i].response_ids)) for i in range(k))
    return {"where": dict(where.most_common()), "earlier_reply_in_prompt": reply_back}


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
             f"mismatches {x['mismatches'] or 'none'}; re-tokenised {x['retokenised']}; rollouts {x['statuses']}.", "",
             f"Where follow-up calls leave the earlier call they share most with: {x['where'] or 'none'}; "
             f"prompts holding an earlier reply's ids: {x['earlier_reply_in_prompt']}."]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options with their defaults filled in (``--quick``'s where given)."""
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
    ap.add_argument("--eval-temperature", type=float, default=0.0,
                    help="the agent's temperature in the before / after phases (default 0: greedy, as the main "
                         "job's held-out table)")
    ap.add_argument("--train-temperature", type=float, default=None,
                    help="the agent's temperature in training (default: none sent, the server's 1.0)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--reward", default="hybrid_agentic",
                    help="the reward training scores rollouts with (the job's ``reward``; e.g. "
                         "hybrid_agentic_shaped: 0.1 for SQL that ran); success is ``solved`` either way")
    ap.add_argument("--backend", default="hf", help="the gateway's engine: hf | vllm | auto")
    ap.add_argument("--deadline-s", type=float, default=600.0, help="per-rollout deadline")
    ap.add_argument("--call-timeout-s", type=float, default=300.0,
                    help="the agent's client timeout per LLM call (run_clients --timeout-s): on a loaded CPU "
                         "a call past it is abandoned and retried, and retries can pile up")
    ap.add_argument("--n-per-domain", type=int, default=24)
    ap.add_argument("--data-dir", type=Path, default=Path("runs/data/gateway_learn"))
    ap.add_argument("--out", type=Path, default=Path("runs/bench/gateway_learn"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--before-from", type=Path, default=None,
                    help="read 'before' from an earlier run's eval_before / eval_after folder that scored "
                         "--model on the same tasks (a run continued from its checkpoint) instead of running it")
    ap.add_argument("--from-run", action="store_true",
                    help="run nothing: rebuild the report of the run in --out from its gateway journals")
    a = ap.parse_args(argv)
    from sqlrl.rewards.registry import REWARDS

    if a.reward not in REWARDS:  # refused before the "before" phase, not when training starts after it
        ap.error(f"--reward {a.reward!r} is not a registered reward ({', '.join(REWARDS)})")
    if not a.call_timeout_s > 0:
        ap.error("--call-timeout-s must be > 0")
    if a.eval_temperature < 0 or (a.train_temperature is not None and a.train_temperature < 0):
        ap.error("--eval-temperature / --train-temperature must be >= 0")
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
    return a


def train_config(a: argparse.Namespace, key: str) -> Any:
    """The training phase's job config (module docstring, step 3): ``--reward``, ``--lr``, the train split."""
    from sqlrl.learn.optim import OptimConfig

    return _job_config(a, a.model, a.out / "train", key, steps=a.steps, tasks_per_step=a.tasks_per_step,
                       group_size=a.group_size, sampling_rounds=a.sampling_rounds,
                       optim=OptimConfig(lr=a.lr, micro_batch_size=1), data=_data(a, "train"), reward=a.reward)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.from_run:
        return report_from_run(a)
    from jobs.train_agent import run, start_clients, stop_clients

    t0 = time.perf_counter()
    a.out.mkdir(parents=True, exist_ok=True)
    traces: list[Any] = []
    if a.before_from:
        print(f"gateway_learn: before -- {a.model}: read from {a.before_from}", flush=True)
        before = earlier_before(a, traces)
    else:
        print(f"gateway_learn: before -- {a.model} on {a.eval_tasks} held-out tasks", flush=True)
        before = evaluate(a, a.model, a.out / "eval_before", traces)

    key = secrets.token_urlsafe(18)
    train_cfg = train_config(a, key)
    print(f"gateway_learn: train -- {a.steps} step(s) x {a.tasks_per_step} x {a.group_size}", flush=True)
    clients: list[Any] = []
    try:
        summary = run(train_cfg, on_url=lambda url: clients.append(start_clients(url, key, AGENT, a.clients,
                                                                                   _agent_args(a, a.train_temperature))),
                      observe=lambda step, ts: traces.extend(ts),
                      after_steps=lambda: stop_clients(clients, a.deadline_s))
    finally:
        stop_clients(clients, a.deadline_s)
    trained = summary["checkpoint"]
    print(f"gateway_learn: after -- {trained}", flush=True)
    after = evaluate(a, trained, a.out / "eval_after", traces)
    rep = build_report(a, before, after, traces, checkpoint=trained, train_steps=summary["steps"],
                       db_active_leases=summary["db_active_leases"], seconds=time.perf_counter() - t0)
    return write_report(a.out, rep)


def build_report(a: argparse.Namespace, before: dict[str, int], after: dict[str, int], traces: list[Any],
                 **extra: Any) -> dict[str, Any]:
    """The report (module docstring, step 5); the paired difference is over the tasks scored in both."""
    from sqlrl.agent.chat_format import HFChatFormat
    from sqlrl.eval.stats import paired_difference, success_rate
    from sqlrl.policy.load import load_tokenizer

    tokenizer, _ = load_tokenizer(a.model)
    return {"model": a.model, "quick": a.quick, "steps": a.steps, "tasks_per_step": a.tasks_per_step,
            "group_size": a.group_size, "eval_tasks": len(before), "max_tokens": a.max_tokens,
            "max_turns": a.max_turns, "eval_temperature": a.eval_temperature,
            "train_temperature": a.train_temperature, "sampling_rounds": a.sampling_rounds, "lr": a.lr,
            "reward": a.reward, "backend": a.backend,
            "before_from": str(a.before_from) if a.before_from else None, "before": success_rate(list(before.values())).to_dict(),
            "after": success_rate(list(after.values())).to_dict(),
            "paired": paired_difference(before, after, seed=a.seed).to_dict(),
            "exactness": exactness(traces, HFChatFormat(tokenizer).turn_end_ids), **extra}


def write_report(out: Path, rep: dict[str, Any]) -> int:
    (out / "report.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    print(report_md(rep), flush=True)
    took = f"{rep['seconds'] / 60:.1f} min, " if rep.get("seconds") else ""
    print(f"gateway_learn: report in {out / 'report.json'} ({took}not a measurement on a shared machine)", flush=True)
    return 0


def report_from_run(a: argparse.Namespace) -> int:
    """``--from-run``: the report of a run in ``--out`` rebuilt from its three gateway journals
    (``eval_before``, ``train``, ``eval_after``): what a stopped run had finished. Outcomes and
    exactness count the rollouts that ended; the paired difference is over the tasks scored in both
    evaluations (``paired.only_before`` / ``only_after`` name the others)."""
    phases = {p: journal_traces(a.out / p) for p in ("eval_before", "train", "eval_after")}
    if not phases["eval_before"] or not phases["eval_after"]:
        raise SystemExit(f"gateway_learn: {a.out} has no ended rollout in eval_before and eval_after to compare "
                         f"({', '.join(f'{p}: {len(t)}' for p, t in phases.items())})")
    traces = [t for ts in phases.values() for t in ts]
    rep = build_report(a, outcomes(phases["eval_before"]), outcomes(phases["eval_after"]), traces,
                       from_run=True, rollouts_ended={p: len(t) for p, t in phases.items()})
    return write_report(a.out, rep)


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # kill <pid> unwinds: the vLLM engine core and sessions are closed
    raise SystemExit(main())
