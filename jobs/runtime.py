"""What the four curriculum jobs share: arguments, data, the actor runtime, training loops, evaluation.

Each ``jobs/stage*.py`` reads top to bottom with these pieces:

- ``parse_stage_args(stage, argv)``: ``--config FILE`` plus ``key=value`` overrides into a
  ``curriculum.config.StageConfig`` (unknown keys are errors); refuses to replace a finished result
  in ``<run_dir>/<stage>`` without ``overwrite=true``, and prints what the job is about to do.
- ``prepare_data(cfg)``: the embedded default data (generated into ``data.synth_dir`` when missing)
  or Spider-derived tasks, mixed by ``data.mixture`` (Zeno; Talon = critic only) into a train and
  a held-out eval list, with the database catalog and schemas.
- ``Runtime(cfg, data)``: the DB-session pool (rollout + reward partitions), the reward group and,
  on demand, rollout and learner groups — Ray actors when ``cluster.ray`` (``ray job submit``
  sets ``RAY_ADDRESS``), in-process otherwise; the same code either way. ``close()`` shuts all down.
  Each actor asks Ray for what ``cluster.placement`` (a profile of ``deploy/placement.yaml``, the
  file the cluster definitions are checked against) says for its kind.
- ``train_sft`` / ``train_grpo``: the update loops; every step's metrics go to ``MetricsLogger``
  (JSONL, TensorBoard, PNG, and Ray gauges for the dashboard when Ray is up).
- ``evaluate``: greedy rollouts of a checkpoint on the eval tasks, scored by the same rewards:
  success rate (result part == 1) overall and per task type.

Output (``jobs.console``): plain lines when stderr is not a terminal, and a heartbeat line at least
every ``SQLRL_HEARTBEAT_S`` (60) seconds during data generation, data builds, training and
evaluation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from curriculum.config import STAGE_TITLES, StageConfig, load_stage_config
from jobs.console import Heartbeat, make_console, quiet_third_party_bars

console = make_console(stderr=True)


# -------------------------------------------------------------------------------------- arguments

def parse_stage_args(stage: str, argv: Sequence[str] | None, doc: str) -> StageConfig:
    """The stage's config, checked before any work: no finished result in ``<run_dir>/<stage>``
    is replaced without ``overwrite=true``, the start checkpoint exists; then the plan is printed."""
    ap = argparse.ArgumentParser(prog=f"python -m jobs.{stage}", description=doc.split("\n")[0])
    ap.add_argument("--config", default=None, help="a YAML file mirroring curriculum.config.StageConfig "
                                                   f"(shipped: jobs/configs/{stage}.yaml; none: built-in defaults)")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. rl.steps=2 overwrite=true")
    a = ap.parse_args(argv)
    from sqlrl.config import ConfigError

    quiet_third_party_bars()
    try:
        cfg = load_stage_config(a.config, [f"stage={stage}", *a.overrides])
        check_overwrite(cfg)
        start = cfg.init_model()  # fail now, not after data preparation, when the start checkpoint is missing
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"{stage}: {exc}") from None
    console.print(describe_stage(cfg, start, a.config), markup=False, highlight=False)
    return cfg


def check_overwrite(cfg: StageConfig) -> None:
    """``SystemExit`` (one line, both ways out) when ``<run_dir>/<stage>`` holds a finished result
    and ``overwrite`` is false."""
    found = cfg.existing_result()
    if found and not cfg.overwrite:
        names = ", ".join(f"{n}/" if n == "final" else n for n in found)
        raise SystemExit(f"{cfg.stage}: {cfg.stage_dir} already holds a result ({names}); not replacing it: "
                         f"pass overwrite=true to replace it, or run_dir=<another folder> to keep it")


def describe_stage(cfg: StageConfig, start: str, config_path: str | None) -> str:
    """What the job is about to do: stage, run_dir, start checkpoint, data, steps, evaluation."""
    d = cfg.data
    source = f"Spider ({d.spider})" if d.spider else f"generated ({d.synth_dir})"
    mixture = ", ".join(f"{k} {v:g}" for k, v in d.mixture.items())
    if cfg.stage in ("stage1", "stage2"):
        s = cfg.sft
        steps = s.epochs * math.ceil(d.train_size / s.batch_size)
        work = (f"up to {steps} SFT step(s): {s.epochs} epoch(s) over the verified examples of "
                f"{d.train_size} tasks, batches of {s.batch_size}; teacher {cfg.teacher.kind}")
    else:
        r = cfg.rl
        work = (f"{r.steps} GRPO step(s) x {r.tasks_per_step} task(s) x {r.group_size} samples "
                f"(reward {reward_name(cfg, cfg.mode)})")
    evals = (f"{d.eval_size} held-out tasks, {', '.join(cfg.eval.modes or (cfg.mode,))}"
             if cfg.eval.enabled and d.eval_size else "off")
    outputs = f"{cfg.stage_dir}" + (" (replacing its result: overwrite=true)" if cfg.existing_result() else "")
    return "\n".join([
        f"{cfg.stage} ({STAGE_TITLES[cfg.stage]}): about to run",
        f"  run_dir:    {cfg.run_dir} -> outputs in {outputs}",
        f"  start from: {start}",
        f"  data:       {source}: {d.train_size} training tasks, mixture {mixture}",
        f"  steps:      {work}",
        f"  evaluation: {evals}",
        f"  config:     {config_path or 'built-in defaults (no --config)'}; "
        f"{'Ray actors' if cfg.cluster.ray else 'in-process'}",
    ])


# -------------------------------------------------------------------------------------------- data

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


def _load_split(root: Path, split: str, kinds: Sequence[str]) -> list[Any]:
    from sqlrl.tasks.loaders import load_jsonl

    sets = []
    for kind in kinds:
        path = root / f"{kind}_{split}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (data.{'train' if 'train' in split else 'eval'}"
                                    f"_split={split!r}; files in {root}: "
                                    f"{', '.join(sorted(p.name for p in root.glob('*.jsonl')))})")
        sets.append(load_jsonl(path, db_root=root / "databases"))
    return sets


def _generated(cfg: StageConfig) -> tuple[list, list, dict, dict, str]:
    from sqlrl.tasks.synth.dataset import build_default_dataset

    root = Path(cfg.data.synth_dir)
    if not (root / "manifest.json").is_file():
        console.print(f"[bold]data[/bold]: generating the embedded default data into {root} "
                      f"({cfg.data.n_per_domain} tasks per domain)")
        kw = {"domains": list(cfg.data.domains)} if cfg.data.domains else {}
        with Heartbeat("data: generating the embedded default data", note=str(root)):
            build_default_dataset(root, seed=cfg.data.seed, n_per_domain=cfg.data.n_per_domain, **kw)
    kinds = [k for k, w in cfg.data.mixture.items() if w > 0]
    train_sets = _load_split(root, cfg.data.train_split, kinds)
    eval_sets = _load_split(root, cfg.data.eval_split, kinds)
    catalog, schemas = {}, {}
    for ts in train_sets + eval_sets:
        catalog.update(ts.catalog)
        schemas.update(ts.schemas)
    train = [t for ts in train_sets for t in ts.tasks if t.db_id in ts.catalog]
    held = [t for ts in eval_sets for t in ts.tasks if t.db_id in ts.catalog]
    return train, held, catalog, schemas, f"generated ({root})"


def _spider(cfg: StageConfig) -> tuple[list, list, dict, dict, str]:
    """Spider train questions for training, dev for evaluation (held-out databases); debugging
    tasks from ``sqlrl.tasks.synth``'s bug injection over the same gold SQL (built on first use)."""
    from sqlrl.tasks.loaders import load_jsonl, load_spider
    from sqlrl.tasks.synth.critic_gen import make_critic_tasks
    from sqlrl.tasks.io import write_tasks

    spider = Path(cfg.data.spider)  # type: ignore[arg-type]
    with Heartbeat("data: loading Spider", note=str(spider)):
        train_set, dev_set = load_spider(spider, "train"), load_spider(spider, "dev")
    catalog = {**train_set.catalog, **dev_set.catalog}
    schemas = {**train_set.schemas, **dev_set.schemas}
    train = [t for t in train_set.tasks if t.db_id in catalog]
    held = [t for t in dev_set.tasks if t.db_id in catalog]
    if cfg.data.mixture.get("critic", 0) > 0:
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
            extra = load_jsonl(path, db_root=None).tasks
            (train if name == "train" else held).extend(extra)
    return train, held, catalog, schemas, f"spider ({spider})"


def _sample(tasks: Sequence[Any], n: int, seed: int) -> list[Any]:
    import random

    tasks = list(tasks)
    random.Random(seed).shuffle(tasks)
    return tasks[:n]


def prepare_data(cfg: StageConfig) -> StageData:
    from curriculum.mixing import MixtureConfig, mix, pools_by_kind

    train, held, catalog, schemas, source = (_spider if cfg.data.spider else _generated)(cfg)
    if cfg.data.difficulties:
        wanted = set(cfg.data.difficulties)
        train = [t for t in train if getattr(t, "difficulty", None) in wanted]
        held = [t for t in held if getattr(t, "difficulty", None) in wanted]
    train_mix = mix(pools_by_kind(train), MixtureConfig(cfg.data.mixture, cfg.data.train_size, cfg.data.seed))
    eval_mix = mix(pools_by_kind(held), MixtureConfig(cfg.data.mixture, cfg.data.eval_size, cfg.data.seed + 1))
    return StageData(tuple(train_mix), tuple(eval_mix), catalog, schemas, source)


# ----------------------------------------------------------------------------------------- runtime

def reward_name(cfg: StageConfig, mode: str) -> str:
    return cfg.rl.reward or f"hybrid_{mode}"


class Runtime:
    """The pool and reward group of one job; rollout and learner groups are made on demand."""

    def __init__(self, cfg: StageConfig, data: StageData) -> None:
        from actors.db_pool import DBPoolConfig, DBPoolGroup
        from actors.reward import RewardGroup, RewardGroupConfig
        from sqlrl.db.lease import Catalog
        from sqlrl.db.shard import ShardConfig

        self.cfg, self.data = cfg, data
        self.ray = cfg.cluster.ray
        if self.ray:
            import ray

            if not ray.is_initialized():
                ray.init(address=cfg.cluster.address or os.environ.get("RAY_ADDRESS"),
                         ignore_reinit_error=True, log_to_driver=False)
        dialects = "+".join(sorted({d for v in data.catalog.values() for d in v}))
        workers = cfg.cluster.rollout_workers if self.ray else 0
        self.asks = cfg.cluster.asks()  # deploy/placement.yaml: what each actor asks Ray for
        shard, reward = self.asks.db_shard, self.asks.reward
        self.pool = DBPoolGroup(DBPoolConfig(
            rollout_workers=max(1, workers), per_worker={dialects: 1}, reward={dialects: 1},
            in_process=not self.ray, shard=ShardConfig(catalog=Catalog(dict(data.catalog))),
            num_cpus_per_shard=shard.num_cpus, resources=dict(shard.resources)))
        self.rewards = RewardGroup(data.catalog, RewardGroupConfig(
            n_actors=cfg.cluster.reward_actors if self.ray else 0, num_cpus_per_actor=reward.num_cpus,
            resources=dict(reward.resources)), self.pool.client(role="reward"))
        self._groups: list[Any] = []

    def rollout_group(self, model: str, mode: str, *, temperature: float, top_p: float = 1.0,
                      seed: int = 0) -> Any:
        from actors.rollout import RolloutConfig, RolloutGroup
        from sqlrl.agent.loop import LoopConfig
        from sqlrl.policy.types import SamplingParams

        r = self.cfg.rollout
        loop = LoopConfig(mode=mode, max_turns=r.max_turns if mode == "agentic" else 1,
                          max_total_tokens=r.max_total_tokens,
                          sampling=SamplingParams(temperature=temperature, top_p=top_p,
                                                  max_new_tokens=r.max_new_tokens, seed=seed))
        ask = self.asks.rollout
        group = RolloutGroup(RolloutConfig(model=model, backend=r.backend, loop=loop,
                                           n_workers=self.cfg.cluster.rollout_workers if self.ray else 0,
                                           num_cpus=ask.num_cpus, num_gpus=ask.num_gpus,
                                           resources=dict(ask.resources)),
                             self.pool, self.data.schemas)
        self._groups.append(group)
        return group

    def learner(self, model: str, optim: Any, *, reference: bool = False) -> Any:
        from actors.learner import LearnerGroup

        ask = self.asks.learner
        group = LearnerGroup(model, optim, n=self.cfg.cluster.learner_ranks if self.ray else 0,
                             mixed_precision=self.cfg.model.mixed_precision, reference=reference,
                             seed=self.cfg.data.seed, num_cpus=ask.num_cpus, num_gpus=ask.num_gpus,
                             resources=dict(ask.resources))
        self._groups.append(group)
        return group

    def release(self, group: Any) -> None:
        group.shutdown()
        if group in self._groups:
            self._groups.remove(group)

    def metric_sinks(self) -> list[Any]:
        if not self.ray:
            return []
        from actors.metrics import ray_gauge_sink

        return [ray_gauge_sink()]

    def score(self, trajectories: Sequence[Any], tasks: Sequence[Any], reward: str) -> list[Any]:
        from actors.reward import RewardRequest, failed

        out: list[Any] = [None] * len(tasks)
        requests, where = [], []
        for i, (traj, task) in enumerate(zip(trajectories, tasks)):
            if traj.stop_reason == "error":  # the infrastructure failed: neither reward nor penalty
                out[i] = failed(reward, f"rollout-error: {traj.error}")
            else:
                requests.append(RewardRequest(reward, task, traj.response()))
                where.append(i)
        for i, b in zip(where, self.rewards.score(requests) if requests else []):
            out[i] = b
        return out

    def close(self) -> None:
        for g in list(self._groups):
            try:
                g.shutdown()
            except Exception:
                pass
        self._groups.clear()
        self.rewards.shutdown()
        self.pool.shutdown()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -------------------------------------------------------------------------------------- evaluation

def evaluate(rt: Runtime, model: str, tasks: Sequence[Any], mode: str) -> dict[str, Any]:
    """Greedy rollouts of ``model`` on ``tasks`` in ``mode``; success = the reward's result part is 1."""
    t0 = time.perf_counter()
    with Heartbeat(f"eval ({mode}) {Path(model).name}", total=len(tasks), unit="tasks rolled out",
                   note="loading the model") as beat:
        group = rt.rollout_group(model, mode, temperature=rt.cfg.eval.temperature)
        try:
            trajs = []
            for start in range(0, len(tasks), rt.cfg.rollout.batch):
                beat.update(len(trajs), note=f"rollout batch {start // rt.cfg.rollout.batch + 1}"
                                             f"/{math.ceil(len(tasks) / rt.cfg.rollout.batch)}")
                trajs += group.rollout(list(tasks[start:start + rt.cfg.rollout.batch]))
        finally:
            rt.release(group)
        beat.update(len(trajs), note="scoring")
        breakdowns = rt.score(trajs, tasks, f"hybrid_{mode}")
    by_kind: dict[str, list[float]] = {}
    for task, b in zip(tasks, breakdowns):
        if not b.excluded:
            by_kind.setdefault(task.kind, []).append(float(b.parts.get("result", 0.0) >= 1.0))
    ok = [x for v in by_kind.values() for x in v]
    out = {"model": model, "mode": mode, "n": len(tasks), "scored": len(ok),
           "success": sum(ok) / len(ok) if ok else 0.0,
           **{f"success_{k}": sum(v) / len(v) for k, v in sorted(by_kind.items())},
           "format_ok": _mean(b.parts.get("format", 0.0) for b in breakdowns if not b.excluded),
           "mean_turns": _mean(len(t.turns) for t in trajs),
           "stop_reasons": dict(Counter(t.stop_reason for t in trajs)),
           "seconds": round(time.perf_counter() - t0, 1)}
    console.print(f"  eval ({mode}) {Path(model).name}: success {out['success']:.2f}, format "
                  f"{out['format_ok']:.2f} on {out['scored']} tasks in {out['seconds']:.0f} s")
    return out


def _mean(xs: Any) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


# ------------------------------------------------------------------------------------------- SFT

def train_sft(rt: Runtime, model: str, examples: Sequence[Any], logger: Any) -> tuple[Any, list[dict]]:
    """``sft.epochs`` passes over ``examples`` in batches of ``sft.batch_size``; returns the learner
    (still holding the trained weights) and the per-step metrics."""
    import random

    from sqlrl.agent.chat_format import HFChatFormat
    from sqlrl.learn.batch import sft_batch
    from sqlrl.policy.load import load_tokenizer

    s = rt.cfg.sft
    steps_per_epoch = math.ceil(len(examples) / s.batch_size)
    optim = dataclasses.replace(s.optim, total_steps=max(1, s.epochs * steps_per_epoch))
    learner = rt.learner(model, optim)
    tokenizer, pad_id = load_tokenizer(model)
    chat = HFChatFormat(tokenizer)
    rng = random.Random(rt.cfg.data.seed)
    history = []
    step = 0
    with Heartbeat(f"{rt.cfg.stage} SFT", total=optim.total_steps, unit="steps done") as beat:
        for epoch in range(s.epochs):
            order = list(examples)
            rng.shuffle(order)
            for start in range(0, len(order), s.batch_size):
                beat.update(step, note=f"epoch {epoch + 1}/{s.epochs}, step {step + 1} running")
                t0 = time.perf_counter()
                batch = sft_batch(order[start:start + s.batch_size], chat, max_length=s.max_length, pad_id=pad_id)
                m = learner.step(batch, "sft", s.loss)
                m = {**m, "epoch": epoch, "update_s": time.perf_counter() - t0}
                logger.log(step, m)
                history.append(m)
                step += 1
                console.print(f"  {rt.cfg.stage} step {step}/{optim.total_steps}: "
                              f"loss {m.get('loss', float('nan')):.4f}")
    return learner, history


# ------------------------------------------------------------------------------------------ GRPO

def train_grpo(rt: Runtime, model: str, tasks: Sequence[Any], logger: Any) -> tuple[Any, list[dict]]:
    """``rl.steps`` GRPO steps: roll out ``tasks_per_step`` tasks × ``group_size`` samples with the
    current policy, score them, update, and sync the new weights to the rollout workers."""
    from sqlrl.learn.batch import rl_batch
    from sqlrl.policy.load import load_tokenizer

    r, mode = rt.cfg.rl, rt.cfg.mode
    reward = reward_name(rt.cfg, mode)
    optim = dataclasses.replace(r.optim, total_steps=max(1, r.steps * r.updates_per_batch))
    learner = rt.learner(model, optim, reference=r.loss.kl_coef > 0)
    rollout = rt.rollout_group(model, mode, temperature=r.temperature, top_p=r.top_p, seed=rt.cfg.data.seed)
    _, pad_id = load_tokenizer(model)
    history = []
    cursor = 0
    with Heartbeat(f"{rt.cfg.stage} GRPO", total=r.steps, unit="steps done") as beat:
        for step in range(r.steps):
            chosen = [tasks[(cursor + i) % len(tasks)] for i in range(r.tasks_per_step)]
            cursor += r.tasks_per_step
            group_tasks = [t for t in chosen for _ in range(r.group_size)]
            t0 = time.perf_counter()
            trajs = []
            for start in range(0, len(group_tasks), rt.cfg.rollout.batch):
                beat.update(step, note=f"step {step + 1}: rollout, {len(trajs)}/{len(group_tasks)} trajectories")
                trajs += rollout.rollout(group_tasks[start:start + rt.cfg.rollout.batch])
            t1 = time.perf_counter()
            beat.update(step, note=f"step {step + 1}: reward")
            breakdowns = rt.score(trajs, group_tasks, reward)
            t2 = time.perf_counter()
            keep = _trainable(trajs, breakdowns, group_tasks)
            metrics: dict[str, Any] = _rollout_metrics(trajs, breakdowns, keep)
            if keep:
                beat.update(step, note=f"step {step + 1}: update")
                batch = rl_batch([trajs[i] for i in keep], [breakdowns[i].score for i in keep],
                                 [f"{step}/{group_tasks[i].task_id}" for i in keep], r.loss,
                                 pad_id=pad_id, max_length=rt.cfg.rollout.max_total_tokens)
                for _ in range(r.updates_per_batch):
                    metrics.update(learner.step(batch, "grpo", r.loss))
            t3 = time.perf_counter()
            beat.update(step, note=f"step {step + 1}: weight sync")
            version, sync_s = learner.sync_to(rollout)
            metrics.update({"policy_version": version, "time_rollout_s": t1 - t0, "time_reward_s": t2 - t1,
                            "time_update_s": t3 - t2, "time_sync_s": sync_s,
                            "time_tool_s": sum(t.tool_ms for tr in trajs for t in tr.turns) / 1000.0})
            logger.log(step, metrics)
            history.append(metrics)
            beat.update(step + 1, note="")
            console.print(f"  {rt.cfg.stage} step {step + 1}/{r.steps}: reward {metrics['reward_mean']:.3f}, "
                          f"pass {metrics['pass_rate']:.2f}, rollout {t1 - t0:.0f}s, update {t3 - t2:.0f}s")
    rt.release(rollout)
    return learner, history


def _trainable(trajs: Sequence[Any], breakdowns: Sequence[Any], tasks: Sequence[Any]) -> list[int]:
    """Rows that enter the update: scored (not excluded), not an infrastructure error, and in a
    group that still has at least two such rows (GRPO's advantage of a lone sample would be its raw
    reward, verl's group-of-one convention)."""
    ok = [i for i, (tr, b) in enumerate(zip(trajs, breakdowns))
          if not b.excluded and tr.stop_reason != "error" and tr.n_generated > 0]
    per_task = Counter(tasks[i].task_id for i in ok)
    return [i for i in ok if per_task[tasks[i].task_id] >= 2]


def _rollout_metrics(trajs: Sequence[Any], breakdowns: Sequence[Any], keep: Sequence[int]) -> dict[str, Any]:
    kept_b = [breakdowns[i] for i in keep]
    parts: dict[str, list[float]] = {}
    for b in kept_b:
        for k, v in b.parts.items():
            parts.setdefault(k, []).append(v)
    return {"reward_mean": _mean(b.score for b in kept_b),
            "pass_rate": _mean(float(b.parts.get("result", 0.0) >= 1.0) for b in kept_b),
            **{f"reward_{k}": _mean(v) for k, v in parts.items()},
            "trajectories": len(trajs), "trained_on": len(keep),
            "excluded": sum(b.excluded for b in breakdowns),
            "turns_mean": _mean(len(t.turns) for t in trajs),
            "tool_calls_mean": _mean(t.n_tool_calls for t in trajs),
            "tool_errors_mean": _mean(t.n_tool_errors for t in trajs),
            "malformed_mean": _mean(t.n_malformed for t in trajs),
            "response_tokens_mean": _mean(t.n_generated for t in trajs)}


# --------------------------------------------------------------------------------------- outputs

def finish_stage(rt: Runtime, learner: Any, history: list[dict], logger: Any,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Save the final checkpoint to ``<stage_dir>/final``, evaluate it, write ``summary.json``."""
    from sqlrl.config import to_dict

    cfg = rt.cfg
    final = cfg.stage_dir / "final"
    with Heartbeat(f"{cfg.stage}: saving the checkpoint", note=str(final)):
        learner.save(final, overwrite=True)
    rt.release(learner)
    curves = logger.close()
    evals = []
    if cfg.eval.enabled and rt.data.eval:
        for mode in cfg.eval.modes or (cfg.mode,):
            evals.append(evaluate(rt, str(final), rt.data.eval, mode))
    summary = {"stage": cfg.stage, "title": STAGE_TITLES[cfg.stage], "checkpoint": str(final),
               "steps": len(history), "data": rt.data.counts(), "source": rt.data.source,
               "last": history[-1] if history else {}, "eval": evals,
               "curves": [str(p) for p in curves], "config": to_dict(cfg), **(extra or {})}
    (cfg.stage_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


# ---------------------------------------------------------------------------------------- teachers

def make_teacher(cfg: StageConfig) -> Any:
    """The SFT stages' teacher: programmatic (default, offline) or an OpenAI-compatible endpoint."""
    t = cfg.teacher
    if t.kind == "programmatic":
        from curriculum.teachers import ProgrammaticTeacher

        return ProgrammaticTeacher(seed=t.seed, brief=t.brief)
    from curriculum.openai_teacher import OpenAIConfig, OpenAITeacher

    if not t.base_url or not t.model:
        raise SystemExit("teacher.kind=openai needs teacher.base_url and teacher.model")
    return OpenAITeacher(OpenAIConfig(
        base_url=t.base_url, model=t.model, api_key=os.environ.get(t.api_key_env),
        rate_per_s=t.rate_per_s, workers=t.workers,
        cache_path=t.cache_path or str(cfg.stage_dir / "teacher_cache.jsonl")))


def stage_logger(rt: Runtime) -> Any:
    from sqlrl.metrics import MetricsLogger

    return MetricsLogger(rt.cfg.run_dir, rt.cfg.stage, sinks=rt.metric_sinks())


def save_config(cfg: StageConfig) -> None:
    """Write the resolved config to ``<stage_dir>/config.yaml``. With ``overwrite=true`` the old
    ``summary.json`` goes first, so a run that fails half-way leaves no stale summary behind (the old
    ``final/`` is replaced when the new checkpoint is saved)."""
    from sqlrl.config import dump_config

    cfg.stage_dir.mkdir(parents=True, exist_ok=True)
    if cfg.overwrite:
        (cfg.stage_dir / "summary.json").unlink(missing_ok=True)
    dump_config(cfg, cfg.stage_dir / "config.yaml")


def build_phase(cfg: StageConfig, what: str, n: int) -> Heartbeat:
    """The heartbeat of a stage's data build (teacher / verification of ``n`` tasks)."""
    return Heartbeat(f"{cfg.stage} data: {what}", total=None, unit="", note=f"{n} tasks")
