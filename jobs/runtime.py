"""The actors of a job: the DB-session pool, reward scorers, rollout workers and learner ranks.

``Runtime(cfg, data)`` wires one stage job's actors; ``session_pool``, ``rollout_group`` and
``connect_ray`` are the pieces it is made of, shared with ``jobs.infer``.

Guarantees:
- With ``cluster.ray`` every group is Ray actors (``ray job submit`` sets ``RAY_ADDRESS``, which
  ``connect_ray`` joins); without, the same groups run in-process (``in_process=True``). Same code either way.
- Each actor asks Ray for what its kind's entry of the placement profile says
  (``cluster.placement``, a profile of ``deploy/placement.yaml``: the file the cluster
  definitions are checked against).
- The pool has a partition per rollout worker and one for the reward scorers; ``Runtime.score``
  never scores a rollout that failed (``sqlrl.rl.outcome.score_rollouts``: an excluded breakdown,
  neither reward nor penalty).
  The scorers score with the stage's ``reward`` section (``RewardConfig``: ``reward.test_suite``
  switches test-suite match on, for the RL steps and the held-out evaluation alike);
  ``prebuild_suites`` distils every task's suite before the first step (the stage calls it), and
  ``close()`` then drops the variant bases the suites loaded on servers (``dropped_variants``).
- Rollout workers generate with ``rollout.policy(model)`` (a ``PolicySpec``: ``rollout.backend``,
  ``rollout.dtype``, ``rollout.device``, ``rollout.engine_options``) and run ``rollout.batch``
  trajectories at once each.
- ONE set of rollout workers (one engine each) per job, started on first use and kept until
  ``close()``: every ``rollout_group(model, mode, ...)`` is a view of it with its own agent loop
  (mode, temperature, seed), and ``release`` of a view keeps the engines running. Asked for
  another checkpoint of the same model family (a stage's ``final`` after its GRPO steps, an
  evaluation after training), the running engines load its weights (``RolloutGroup.
  load_checkpoint``, seconds) instead of starting new ones (tens of seconds each on vLLM's CPU
  build); only a checkpoint of another family (tokenizer, architecture), or another backend,
  dtype, device or engine options, replaces the workers, the old ones shut down first (one set
  of engines alive at a time). The engines' own seed is the first view's sampling seed: requests
  carry their own seeds on every engine except the lock-step ``vllm-batched`` on vLLM's CPU build,
  whose samples come from the engine's generator and so depend on the calls before them. A Ray
  worker that dies and is restarted comes back on the workers' first checkpoint.
- ``close()`` (also on leaving the ``with`` block) shuts down every group it made, the pool last.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from curriculum.config import StageConfig
from jobs.stage_data import StageData


def connect_ray(address: str | None = None, **kw: Any) -> None:
    """Join ``address`` (else ``RAY_ADDRESS``, else a local instance) unless already connected."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True, **kw)


def session_pool(catalog: Mapping[str, Mapping[str, str]], dialects: Sequence[str], *, workers: int,
                 reward: bool, asks: Any) -> Any:
    """A pool with one partition per rollout worker (``workers``: Ray workers, 0 = one in-process) over
    ``dialects``, plus a reward partition when ``reward``."""
    from actors.db_pool import DBPoolConfig, DBPoolGroup
    from sqlrl.db.leases.protocol import Catalog
    from sqlrl.db.leases.shard import ShardConfig

    group = "+".join(sorted(set(dialects)))
    return DBPoolGroup(DBPoolConfig(
        rollout_workers=max(1, workers), per_worker={group: 1}, reward={group: 1} if reward else {},
        in_process=workers == 0, shard=ShardConfig(catalog=Catalog(dict(catalog))),
        num_cpus_per_shard=asks.db_shard.num_cpus, resources=dict(asks.db_shard.resources)))


def rollout_group(pool: Any, schemas: Mapping[str, Any], policy: Any, loop: Any, *,
                  workers: int, asks: Any) -> Any:
    """Rollout workers (0 = one in-process) generating with ``policy`` (a ``PolicySpec``: model,
    engine, dtype, device) in the agent loop ``loop`` on sessions leased from ``pool``."""
    from actors.rollout import RolloutConfig, RolloutGroup

    ask = asks.rollout
    return RolloutGroup(RolloutConfig(policy=policy, loop=loop, in_process=workers == 0,
                                      n_workers=max(1, workers),
                                      num_cpus=ask.num_cpus, num_gpus=ask.num_gpus, resources=dict(ask.resources)),
                        pool, schemas)


def loop_config(mode: str, *, max_turns: int, max_total_tokens: int, max_new_tokens: int,
                temperature: float, top_p: float = 1.0, seed: int = 0, schema_style: str | None = None,
                max_concurrent: int | None = None) -> Any:
    """The agent loop's settings; a single-turn loop has one turn whatever ``max_turns``;
    ``schema_style`` as ``LoopConfig``'s; ``max_concurrent`` (``rollout.batch``): trajectories in
    flight at once per rollout worker (``LoopConfig.max_concurrent_trajectories``)."""
    from sqlrl.agent.loop import LoopConfig
    from sqlrl.policy.types import SamplingParams

    return LoopConfig(mode=mode, max_turns=max_turns if mode == "agentic" else 1, max_total_tokens=max_total_tokens,
                      sampling=SamplingParams(temperature=temperature, top_p=top_p,
                                              max_new_tokens=max_new_tokens, seed=seed),
                      schema_style=schema_style, max_concurrent_trajectories=max_concurrent)


class Runtime:
    """The pool and reward group of one job; rollout and learner groups are made on demand."""

    def __init__(self, cfg: StageConfig, data: StageData) -> None:
        from actors.reward import RewardGroup, RewardGroupConfig

        self.cfg, self.data = cfg, data
        self.ray = cfg.cluster.ray
        if self.ray:
            connect_ray(cfg.cluster.address, log_to_driver=False)
        self.asks = cfg.cluster.asks()  # deploy/placement.yaml: what each actor asks Ray for
        self.pool = session_pool(data.catalog, [d for v in data.catalog.values() for d in v],
                                 workers=cfg.cluster.rollout_workers if self.ray else 0, reward=True,
                                 asks=self.asks)
        reward = self.asks.reward
        self.rewards = RewardGroup(data.catalog, RewardGroupConfig(
            in_process=not self.ray, n_actors=cfg.cluster.reward_actors, num_cpus_per_actor=reward.num_cpus,
            resources=dict(reward.resources), reward=cfg.reward), self.pool.client(role="reward"))
        self._groups: list[Any] = []
        self.dropped_variants: list[str] = []  # variant bases dropped at close (reward.test_suite)
        self._workers: Any = None  # the job's one RolloutGroup (module doc); views of it are handed out
        self.engine_starts = 0  # how many times rollout workers (engines) were started

    def rollout_group(self, model: str, mode: str, *, temperature: float, top_p: float = 1.0,
                      seed: int = 0) -> Any:
        """A view of the job's rollout workers generating with ``model`` in ``mode`` (module doc)."""
        r = self.cfg.rollout
        loop = loop_config(mode, max_turns=r.max_turns, max_total_tokens=r.max_total_tokens,
                           max_new_tokens=r.max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                           schema_style=self.cfg.model.schema_style, max_concurrent=r.batch)
        return self._serving(r.policy(model), loop).with_loop(loop)  # rollout.dtype too

    def _serving(self, spec: Any, loop: Any) -> Any:
        """The job's rollout workers, serving ``spec`` (module doc: reused, reloaded or replaced)."""
        import dataclasses

        current = self._workers
        if current is not None and current.config.policy == spec:
            return current
        if current is not None and current.config.policy == dataclasses.replace(spec, model=current.config.policy.model):
            try:
                current.load_checkpoint(spec)
                return current
            except ValueError as exc:  # another model family: new engines
                from jobs.output import console

                console.print(f"rollout workers: new engines for {spec.model} ({exc})", markup=False)
        if current is not None:
            self._workers = None
            current.shutdown()
        self._workers = rollout_group(self.pool, self.data.schemas, spec, loop,
                                      workers=self.cfg.cluster.rollout_workers if self.ray else 0, asks=self.asks)
        self.engine_starts += 1
        return self._workers

    def learner(self, model: str, optim: Any, *, reference: bool = False) -> Any:
        from actors.learner import LearnerGroup

        ask = self.asks.learner
        group = LearnerGroup(model, optim, n=self.cfg.cluster.learner_ranks, in_process=not self.ray,
                             mixed_precision=self.cfg.model.mixed_precision, reference=reference,
                             seed=self.cfg.data.seed, num_cpus=ask.num_cpus, num_gpus=ask.num_gpus,
                             resources=dict(ask.resources))
        self._groups.append(group)
        return group

    def session_source(self) -> Any:
        """Real sessions from the pool's reward partition, as ``Judge`` opens them."""
        from sqlrl.db.source import PoolSessions

        return PoolSessions(self.pool.client(role="reward"))

    def prebuild_suites(self, tasks: Sequence[Any]) -> Any:
        """With ``reward.test_suite``: every text-to-SQL task's test suite distilled now, through
        the reward partition's sessions, into ``reward.test_suite_dir`` (where the reward actors
        read them back); a ``sqlrl.rewards.prebuild.PrebuildReport``, None with the option off."""
        if not self.cfg.reward.test_suite:
            return None
        from sqlrl.rewards import Judge
        from sqlrl.rewards.prebuild import prebuild_suites
        from sqlrl.suites.test_suite import TestSuites

        judge = Judge(self.data.catalog, sessions=self.session_source(),
                      suites=TestSuites(self.cfg.reward.test_suite_dir))
        return prebuild_suites(judge, tasks)

    def release(self, group: Any) -> None:
        """Shut ``group`` down -- except a view of the job's rollout workers, which stay running
        for the job's next rollouts (``close()`` shuts them down)."""
        from actors.rollout import RolloutGroup

        if isinstance(group, RolloutGroup) and self._workers is not None and group.workers is self._workers.workers:
            return
        group.shutdown()
        if group in self._groups:
            self._groups.remove(group)

    def score(self, trajectories: Sequence[Any], tasks: Sequence[Any], reward: str) -> list[Any]:
        """``sqlrl.rl.outcome.score_rollouts`` on the job's reward scorers."""
        from actors.reward import RewardRequest
        from sqlrl.rl.outcome import score_rollouts

        return score_rollouts(trajectories, tasks, reward,
                              lambda asked: self.rewards.score([RewardRequest(reward, t, r) for t, r in asked]))

    def close(self) -> None:
        workers, self._workers = self._workers, None
        for g in [*([workers] if workers is not None else []), *self._groups]:
            try:
                g.shutdown()
            except Exception:
                pass
        self._groups.clear()
        self.rewards.shutdown()
        self.pool.shutdown()
        if self.cfg.reward.test_suite:  # no variant base stays on a server after the stage
            from sqlrl.rewards.prebuild import drop_variant_bases

            self.dropped_variants = drop_variant_bases(self.data.catalog, self.cfg.reward.test_suite_dir)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
