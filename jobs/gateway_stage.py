"""A curriculum stage's GRPO steps through the training gateway: ``jobs.train.TRAINERS["gateway"]``
(a stage config's ``trainer: gateway``; docs/gateway_training.md).

``stage_job_config(stage_cfg, model, api_key, kinds)`` is the ``AgentJobConfig`` the stage's steps
run with (``jobs.train_agent.gateway_steps``, the standalone job's loop); ``check_settings`` runs it on
the stage's config before any work; ``train_stage`` runs the steps with the stage's learner, DB pool
and agent client processes.

Guarantees:
- The gateway's engine is the stage's rollout policy: ``rollout.policy(model)`` (``curriculum.config.
  RolloutSettings.policy``, the one function that makes the built-in rollout workers' PolicySpec)
  -- ``rollout.backend`` (``auto``, ``hf``, ``vllm``, ``scripted``), ``rollout.dtype``,
  ``rollout.device``, ``rollout.engine_options`` -- with the stage's start checkpoint as its model,
  running ``rollout.batch`` sequences at once (the engine's batch bound, ``max_batch_size``).
- What the gateway cannot honour is refused by ``check_settings`` (the stage job's ``check_trainer``,
  before any work) with the stage's key named, never ignored: a lock-step ``rollout.backend``
  (``hf-batched``, ``vllm-batched``: serving has no engine kind for them) and a batch bound in
  ``rollout.engine_options`` (``max_batch``, ``max_num_seqs``: set ``rollout.batch``); anything
  else the gateway's engine spec refuses (``jobs.train_agent.model_spec``) is refused there too.
- ``rollout.max_turns`` and ``rollout.max_new_tokens`` are the built-in agent loop's: the stage's
  held-out evaluation uses them; through the gateway the client agents decide their turns and ask
  ``gateway.max_tokens`` per call. ``rollout.max_total_tokens`` bounds a trained sequence
  (``max_length``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from jobs.train_agent import gateway_steps, model_spec, start_clients, stop_clients
from sqlrl.gateway.job import AgentJobConfig, DataSpec


def stage_job_config(c: Any, model: str, api_key: str,
                     kinds: Sequence[str] = DataSpec.kinds) -> AgentJobConfig:
    """The ``AgentJobConfig`` of a stage's steps through the gateway (``trainer: gateway``; ``c``: its
    ``StageConfig``): the gateway's engine is ``c.rollout.policy(model)`` -- the stage's
    ``rollout.backend``, ``dtype``, ``device`` and ``engine_options``, the PolicySpec its built-in
    rollout workers get (``jobs.runtime``) -- with ``model`` (the start checkpoint) as its model,
    running ``rollout.batch`` sequences at once (``max_batch_size``); ``rl.*`` gives the steps,
    groups, loss and weight update, ``gateway.*`` the deadline, redraws and tags; ``kinds``: the task
    kinds it hands out. A rollout setting the gateway cannot honour is a ``ValueError`` naming the
    stage's key (``check_settings``)."""
    from jobs.train import rl_seed
    from serve.engines import KINDS, served_names

    r, rl, g = c.rollout, c.rl, c.gateway
    if r.backend not in served_names():
        raise ValueError(f"rollout.backend {r.backend!r}: trainer: gateway serves the stage's policy on a serving "
                         f"engine, and serving cannot run this one; use one of {', '.join(served_names())}")
    bound = sorted({k.batch_option for k in KINDS.values() if k.batch_option} & set(r.engine_options))
    if bound:
        raise ValueError(f"rollout.engine_options.{bound[0]}: with trainer: gateway the engine runs rollout.batch "
                         "sequences at once; set rollout.batch instead")
    cfg = AgentJobConfig(run_dir=str(c.stage_dir / "gateway"), policy=r.policy(model), max_batch_size=r.batch,
                         mixed_precision=c.model.mixed_precision, steps=rl.steps, tasks_per_step=rl.tasks_per_step,
                         group_size=rl.group_size, sampling_rounds=rl.sampling_rounds,
                         updates_per_batch=rl.updates_per_batch, update_policy=rl.weight_update,
                         rollout_deadline_s=g.rollout_deadline_s, redraws=g.redraws, train_tags=g.train_tags,
                         reward=c.reward_name, api_keys=(api_key,), api_keys_env="", ray=c.cluster.ray,
                         seed=rl_seed(c), data=DataSpec(kinds=tuple(kinds)),
                         max_length=r.max_total_tokens, loss=rl.loss, optim=rl.optim)
    model_spec(cfg)  # whatever else the gateway's engine spec refuses
    return cfg


def check_settings(c: Any) -> None:
    """``trainer: gateway``'s check of a stage config before any work (``jobs.train.TRAINERS``):
    ``stage_job_config`` on the stage's start model, unloaded -- its refusals, at config time."""
    stage_job_config(c, c.model.init, api_key="check")


def train_stage(rt: Any, model: str, tasks: Sequence[Any], logger: Any) -> tuple[Any, list[dict[str, Any]]]:
    """A curriculum stage's GRPO steps through the gateway (``jobs.train.TRAINERS["gateway"]``), as
    ``stage_job_config`` configures them: ``gateway.clients`` processes of ``examples.run_clients
    --agent gateway.agent`` (started once the gateway serves, with a key made for this stage) roll
    out. The gateway hands out the kinds ``tasks`` hold (a stage's mixture: text-to-SQL and
    debugging tasks alike). The gateway's engine (the stage's rollout policy) and the stage's
    learner start from ``model``; rollout sessions come from the stage's DB pool; the Judge scores
    with ``StageConfig.reward_name``. The stage's ``checkpoint.every_steps`` / ``resume`` apply
    (``jobs.train.StageCheckpoints``: the loop's state in ``<stage_dir>/checkpoints``,
    ``sqlrl.gateway.job``'s resume). Returns the learner and the steps' metrics rows (each also
    ``logger.log``ged)."""
    import secrets

    from jobs.output import console
    from jobs.train import StageCheckpoints
    from sqlrl.tasks.kinds import kind_of

    c, r, g = rt.cfg, rt.cfg.rl, rt.cfg.gateway
    key = secrets.token_urlsafe(18)
    cfg = stage_job_config(c, model, key, kinds=tuple(dict.fromkeys(kind_of(t).name for t in tasks)))  # the stage's mix
    optim = dataclasses.replace(r.optim, total_steps=max(1, r.steps * r.updates_per_batch))
    learner = rt.learner(model, optim, reference=r.loss.kl_coef > 0)
    clients: list[Any] = []

    def log(step: int, row: dict) -> None:
        logger.log(step, row)
        console.print(f"  {c.stage} step {step + 1}/{r.steps} (gateway): {row['completed']}/{row['rollouts']} "
                      f"completed, {row['setup_failed']} setup-failed, reward {row['reward_mean']:.3f}, pass {row['pass_rate']:.2f}, groups trained "
                      f"{row['groups_trained']}/{row['groups_drawn']}")

    try:
        history, _, _ = gateway_steps(cfg, tasks, rt.data.catalog, learner, rt.session_source(), rt.asks,
                                      log=log, on_url=lambda url: clients.append(start_clients(
                                          url, key, g.agent, g.clients, ["--max-tokens", str(g.max_tokens)])),
                                      after_steps=lambda: stop_clients(clients, cfg.rollout_deadline_s),
                                      checkpoints=StageCheckpoints(c))
    finally:
        stop_clients(clients, cfg.rollout_deadline_s)
    return learner, history
