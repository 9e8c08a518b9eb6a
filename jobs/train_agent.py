"""python -m jobs.train_agent: train an agent written elsewhere through the OpenAI-compatible gateway.

    python -m jobs.train_agent --config jobs/configs/agent.yaml [key=value ...]
    ray job submit --working-dir . -- python -m jobs.train_agent --config jobs/configs/agent.yaml ray=true
    python -m examples.run_clients --gateway $(jq -r .url runs/agent/gateway.json) --api-key KEY -k 4

Reads top to bottom: config -> tasks -> DB pool -> learner -> engine + gateway (address printed and
written to ``<run_dir>/gateway.json``) -> ``cfg.steps`` steps (``sqlrl.gateway.job.run_steps``:
offer ``group_size`` rollouts per task, wait for every one to complete or expire, drain, build,
one GRPO update, push the weights to the gateway's engine) -> ``<run_dir>/final`` -> summary.

Guarantees:
- The gateway's engine is the policy the learner trains: both start from ``policy.model`` (one
  ``PolicySpec``: the engine is built from it with ``max_batch_size`` as a serving replica's,
  ``model_spec``, in ``policy.dtype``; the learner trains in ``mixed_precision``); after each
  update the learner's weights go to that engine with ``update_policy`` (``drain`` by default).
- Where the gateway and its engine run is ``GATEWAY_HOSTS[cfg.host_kind]``: ``process`` (this
  process, an event-loop thread; the default without Ray, and the tests') or ``actor`` (a Ray
  actor, ``actors.gateway.start_gateway``; the default with ``ray=true``); the job talks to either
  through the same ``StepGateway`` calls, its step wait included. The actor is restarted by Ray
  at most ``cfg.gateway_restarts`` times (``gateway_max_restarts``; default 3 with the actor) and
  the driver goes on across a restart (``actors.gateway_driver.ActorGateway``: the last weights
  restored at their version, calls repeated safely, the lost rollouts reported as expired
  ``gateway-restart``; ``GatewayLost`` once restarts are spent). The learner ranks and the DB pool
  are Ray actors with ``ray=true`` (``ray job submit`` sets ``RAY_ADDRESS``), else in-process. Rollout sessions are leases from the job's DB pool (``PoolSessions``); the Judge
  scores final SQL on sessions of its own.
- Every step's metrics row (``run_steps``) goes to ``<run_dir>/metrics.jsonl``, TensorBoard and
  (on Ray) the dashboard's gauges, like the stage jobs'; the gateway's own ``sqlrl_gateway_*``
  gauges tick meanwhile.
- ``<run_dir>/final`` is the learner's checkpoint in the format the stage jobs save, so
  ``python -m jobs.serve --model NAME=<run_dir>/final`` serves it as is; ``summary.json`` records
  it, the steps' rows and the DB pool's active leases at the end (0 when every session was released).
- Whatever happens, the gateway stops (live rollouts are failed, their sessions released; its
  engine with it), then the learner and the pool.
- With ``checkpoint.every_steps: N`` the whole state goes to ``<run_dir>/checkpoints`` every N
  steps (``sqlrl.gateway.resume``); ``resume=true`` continues a stopped job from the newest: the
  learner restored, a new gateway (a new journal; ``gateway.json`` rewritten: clients re-read it,
  or ``port`` is fixed) given the restored weights at their policy version before any offer, the
  steps from the next one on (a step in flight when the job stopped is redone whole). A resume
  with another config is refused in one line; none saved: from step 0, saying so. They are
  deleted once ``final/`` is saved.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from sqlrl.config import load_config, to_dict
from sqlrl.gateway.job import GATEWAY_HOSTS as HOST_NAMES
from sqlrl.gateway.job import AgentJobConfig, DataSpec, run_steps
from sqlrl.gateway.journal import JOURNAL_FILE
from sqlrl.gateway.resume import StepCheckpoints, job_checkpoints, resume_steps
from sqlrl.learn.resume import ResumeRefused
from sqlrl.gateway.trace import RolloutTrace


def load_tasks(d: DataSpec) -> tuple[list[Any], dict, dict]:
    """The embedded tasks of ``d.kinds`` (``<kind>_<split>.jsonl``, generated into ``d.synth_dir`` on
    first use -- every kind the generator makes -- or again when a kind's file is missing), their
    catalog and schemas."""
    from sqlrl.synth.dataset import build_default_dataset
    from sqlrl.tasks.loaders import load

    root = Path(d.synth_dir)
    files = [root / f"{kind}_{d.split}.jsonl" for kind in d.kinds]
    if not (root / "manifest.json").is_file() or not all(f.is_file() for f in files):
        print(f"data: generating the embedded tasks into {root}", flush=True)
        # every kind the generator makes (text-to-SQL and debugging), whichever d.kinds names, so a
        # later job with other kinds finds its file
        build_default_dataset(root, seed=d.seed, n_per_domain=d.n_per_domain, domains=list(d.domains))
    tasks, catalog, schemas = [], {}, {}
    for f in files:
        if not f.is_file():
            raise ValueError(f"data.kinds: {f} was not generated (sqlrl.synth makes text2sql and critic tasks)")
        ts = load("jsonl", f, db_root=root / "databases")
        tasks += [t for t in ts.tasks if t.db_id in ts.catalog]
        catalog.update(ts.catalog)
        schemas.update(ts.schemas)
    random.Random(d.seed).shuffle(tasks)
    return (tasks[:d.size] if d.size else tasks), catalog, schemas


class GatewayHost:
    """``actors.gateway.GatewayServer`` in this process on an event-loop thread: the job's
    ``StepGateway`` (``sqlrl.gateway.job``) with ``gateway_host: process``."""

    def __init__(self, spec: Any, policy: Any, engine: Any, sessions: Any, *, owns_engine: bool = False) -> None:
        from actors.gateway import GatewayServer

        self.server = GatewayServer(spec, policy=policy, engine=engine, sessions=sessions, owns_engine=owns_engine)
        self.rollouts = self.server.rollouts
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sqlrl-gateway", daemon=True)
        self._thread.start()

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def start(self) -> str:
        return self._run(self.server.start())

    def offer(self, group_id: str, task: Any, n: int) -> None:
        self.rollouts.offer(group_id, task, n)

    def finish(self) -> None:
        self.rollouts.finish()

    def wait_step(self, timeout: float | None) -> bool:
        return self.rollouts.wait_idle(timeout)

    def drain(self) -> list[RolloutTrace]:
        return self.rollouts.drain()

    def stats(self) -> Any:
        return self.rollouts.stats()

    def update_weights(self, weights: Mapping[str, Any], policy: str, version: int | None = None) -> int:
        return self._run(self.server.update_weights(weights, policy, version))

    def close(self) -> int:
        """Stop serving (live rollouts failed, sessions released) and the loop; returns how many failed."""
        try:
            return self._run(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)


def model_spec(cfg: AgentJobConfig) -> Any:
    """The gateway's ``serve.config.ModelSpec``: ``cfg.policy`` with ``cfg.max_batch_size`` (a backend
    serving cannot run, or a batch bound in ``policy.engine_options``, is a ``ValueError`` here)."""
    from serve.config import ModelSpec

    return ModelSpec(cfg.policy, max_batch_size=cfg.max_batch_size,
                     max_ongoing_requests=max(cfg.max_batch_size, ModelSpec.max_ongoing_requests))


def process_gateway(cfg: AgentJobConfig, spec: Any, sessions: Any, asks: Any) -> tuple[Any, str]:
    """The gateway and its engine in this process (``gateway_host: process``): ``(host, url)``."""
    from serve.engines import build_served

    served = build_served(spec.model, seed=cfg.seed)  # as a serving replica builds it
    policy, engine = served.policy, served.engine
    try:
        host = GatewayHost(spec, policy, engine, sessions, owns_engine=True)
    except BaseException:
        asyncio.run(engine.close())
        raise
    try:
        return host, host.start()
    except BaseException:
        host.close()
        raise


def actor_gateway(cfg: AgentJobConfig, spec: Any, sessions: Any, asks: Any) -> tuple[Any, str]:
    """The gateway as a Ray actor building its own engine from ``spec.model``
    (``gateway_host: actor``; the rollout workers' placement ask), restarted by Ray at most
    ``cfg.gateway_restarts`` times, the driver recovering across restarts: ``(ActorGateway, url)``."""
    from actors.gateway import ActorGateway, start_gateway

    ask = asks.rollout
    handle, url = start_gateway(spec, num_cpus=ask.num_cpus, num_gpus=ask.num_gpus, resources=ask.resources,
                                sessions=sessions, max_restarts=cfg.gateway_restarts)
    return ActorGateway(handle, max_restarts=cfg.gateway_restarts,
                        restart_timeout_s=cfg.gateway_restart_timeout_s), url


# Where the gateway runs (``gateway_host``; names: ``sqlrl.gateway.job.GATEWAY_HOSTS``).
GATEWAY_HOSTS: dict[str, Callable[[AgentJobConfig, Any, Any, Any], tuple[Any, str]]] = {
    "process": process_gateway, "actor": actor_gateway}
assert set(GATEWAY_HOSTS) == set(HOST_NAMES)


def gateway_steps(cfg: AgentJobConfig, tasks: Sequence[Any], catalog: Mapping[str, Any], learner: Any,
                  sessions: Any, asks: Any, *, log: Callable[[int, dict], None],
                  rewards: Callable[[list[RolloutTrace]], list[RolloutTrace]] | None = None,
                  on_url: Callable[[str], None] | None = None,
                  observe: Callable[[int, list[RolloutTrace]], None] | None = None,
                  after_steps: Callable[[], Any] | None = None,
                  checkpoints: StepCheckpoints | None = None) -> tuple[list[dict[str, Any]], str, int]:
    """The gateway (``GATEWAY_HOSTS[cfg.host_kind]``, serving ``cfg.policy`` with rollout sessions
    from ``sessions``) and ``run_steps`` with ``learner``; the gateway is stopped whatever happens.
    Returns ``(history, url, rollouts failed at stop)``. ``on_url``: called once it serves;
    ``observe``: ``run_steps``'; ``after_steps``: called after the last step, before the gateway
    stops (the job's own clients exit on its 410 meanwhile: ``stop_clients``); ``checkpoints``:
    restored into ``learner`` before the gateway starts (``resume_steps``; a refusal stops the job
    there), saved to after each step."""
    from actors.gateway import GatewaySpec
    from serve.config import AuthSpec
    from sqlrl.agent.chat_format import HFChatFormat
    from sqlrl.policy.load import load_tokenizer

    tokenizer, pad_id = load_tokenizer(cfg.policy.model)
    start = resume_steps(checkpoints, learner)
    if start.step:
        print(f"train_agent: resuming at step {start.step + 1} of {cfg.steps} (task cursor {start.cursor}, "
              f"policy version {start.version}); rollouts in flight when the job stopped are lost: their step "
              "is offered again; a new gateway (clients: the address in gateway.json)", flush=True)
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    # a new gateway resumes only its own journal (a restart of its actor); a resumed job redoes its step
    (Path(cfg.run_dir) / JOURNAL_FILE).unlink(missing_ok=True)
    spec = GatewaySpec(model=model_spec(cfg),
                       catalog=dict(catalog), gateway=cfg.gateway_config(),
                       auth=AuthSpec(api_keys=cfg.api_keys, api_keys_env=cfg.api_keys_env),
                       host=cfg.host, port=cfg.port, run_dir=cfg.run_dir, tick_s=cfg.tick_s)
    # prints "sqlrl gateway: <url>", writes <run_dir>/gateway.json
    host, url = GATEWAY_HOSTS[cfg.host_kind](cfg, spec, sessions, asks)
    try:
        if on_url is not None:
            on_url(url)
        history = run_steps(cfg, tasks, host, learner, pad_id=pad_id,
                            turn_end_ids=HFChatFormat(tokenizer).turn_end_ids, log=log, rewards=rewards,
                            observe=observe, checkpoints=checkpoints, start=start)
        if after_steps is not None:
            after_steps()
    except BaseException:
        host.close()
        raise
    return history, url, host.close()


def start_clients(url: str, key: str, agent: str, k: int, extra: Sequence[str] = ()) -> Any:
    """``k`` agent client processes (``python -m examples.run_clients``, ``extra``: more of its
    arguments, e.g. ``--max-tokens 64``) against the gateway at ``url``: a ``subprocess.Popen``;
    they exit once the gateway answers 410 (the job finished)."""
    import subprocess
    import sys

    # "--api-key=KEY": a token_urlsafe key may start with "-", which argparse takes for an option
    return subprocess.Popen([sys.executable, "-m", "examples.run_clients", "--gateway", url, f"--api-key={key}",
                             "--agent", agent, "-k", str(k), *extra])


def stop_clients(procs: Sequence[Any], timeout_s: float) -> list[int]:
    """Wait for client processes to exit (after the gateway's 410); one still running after
    ``timeout_s`` is terminated. Returns their exit codes."""
    import subprocess

    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            p.terminate()
            codes.append(p.wait())
    return codes


def run(cfg: AgentJobConfig, *, rewards: Callable[[list[RolloutTrace]], list[RolloutTrace]] | None = None,
        on_url: Callable[[str], None] | None = None,
        observe: Callable[[int, list[RolloutTrace]], None] | None = None,
        after_steps: Callable[[], Any] | None = None) -> dict[str, Any]:
    """The job (module docstring); returns its summary. ``rewards``: tests only (``run_steps``);
    ``on_url``: called with the gateway's address once it serves; ``observe``: ``run_steps``'
    (tests stop a job mid-step from it). A refused resume is ``ResumeRefused``."""
    from actors.learner import LearnerGroup
    from curriculum.placement import load_profile
    from jobs.runtime import connect_ray, session_pool
    from sqlrl.db.source import PoolSessions
    from sqlrl.metrics import MetricsLogger

    # -- setup: tasks, DB pool, learner, engine + gateway
    model_spec(cfg)  # the gateway's engine spec: refused before anything starts
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=1) + "\n")
    tasks, catalog, schemas = load_tasks(cfg.data)
    print(f"train_agent: {cfg.steps} step(s) x {cfg.tasks_per_step} task(s) x {cfg.group_size} rollouts "
          f"of {len(tasks)} embedded {'/'.join(cfg.data.kinds)} tasks; model {cfg.policy.model}; run_dir {run_dir}", flush=True)
    if cfg.ray:
        connect_ray(log_to_driver=False)
    asks = load_profile(cfg.placement)
    pool = session_pool(catalog, [d for v in catalog.values() for d in v], workers=1 if cfg.ray else 0,
                        reward=False, asks=asks)
    closers: list[Callable[[], Any]] = [pool.shutdown]
    try:
        optim = dataclasses.replace(cfg.optim, total_steps=max(1, cfg.steps * cfg.updates_per_batch))
        ask = asks.learner
        learner = LearnerGroup(cfg.policy.model, optim, n=cfg.learner_ranks, in_process=not cfg.ray, seed=cfg.seed,
                               mixed_precision=cfg.mixed_precision,
                               reference=cfg.loss.kl_coef > 0, num_cpus=ask.num_cpus, num_gpus=ask.num_gpus,
                               resources=dict(ask.resources))
        closers.append(learner.shutdown)
        sinks = []
        if cfg.ray:
            from actors.metrics import ray_gauge_sink

            sinks.append(ray_gauge_sink())
        logger = MetricsLogger(run_dir, "agent", sinks=sinks)
        closers.append(logger.close)

        def log(step: int, row: dict) -> None:
            logger.log(step, row)
            print(f"  agent step {step + 1}/{cfg.steps}: {row['completed']}/{row['rollouts']} completed, "
                  f"{row['expired']} expired, {row['redrawn']} redrawn; reward {row['reward_mean']:.3f}; groups "
                  f"trained {row['groups_trained']}/{row['groups_drawn']}; calls {row['calls']}, merged "
                  f"{row['merged_share']:.2f}; updated {row['updated']}", flush=True)

        checkpoints = job_checkpoints(cfg)
        history, url, failed = gateway_steps(cfg, tasks, catalog, learner, PoolSessions(pool.client(worker=0)),
                                             asks, log=log, rewards=rewards, on_url=on_url, observe=observe,
                                             after_steps=after_steps, checkpoints=checkpoints)
        # -- cleanup: the checkpoint (jobs.serve serves it as is), the summary
        final = run_dir / "final"
        learner.save(final, overwrite=True)
        checkpoints.clear()  # mid-run ones: final/ supersedes them
        leases = sum(s.active_leases for s in pool.stats().values() if s is not None)
        summary = {"checkpoint": str(final), "gateway": url, "steps": history, "failed_at_stop": failed,
                   "db_active_leases": leases, "weights_version": learner.version}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
        print(f"train_agent: checkpoint {final}; serve it with: python -m jobs.serve --model agent={final}",
              flush=True)
        return summary
    finally:
        for close in reversed(closers):
            try:
                close()
            except Exception as exc:  # one failing cleanup must not skip the others
                print(f"train_agent: cleanup: {type(exc).__name__}: {exc}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.train_agent", description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="jobs/configs/agent.yaml")
    ap.add_argument("overrides", nargs="*", help="key=value (dotted keys: loss.clip_ratio_low=0.2)")
    a = ap.parse_args(argv)
    try:
        cfg = load_config(AgentJobConfig, a.config, a.overrides)
        model_spec(cfg)  # the gateway's engine spec: refused here, before anything starts
    except (ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"train_agent: {a.config}: {exc}") from None
    try:
        run(cfg)
    except ResumeRefused as exc:
        raise SystemExit(str(exc)) from None
    return 0


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # SIGTERM unwinds through finally: engines and sessions closed
    raise SystemExit(main())
