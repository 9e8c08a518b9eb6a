"""The RL training loop, Ray-free: the GRPO step with dynamic sampling, probe selection and group
filtering over plain callables, and the one definition of a solved task.

- ``sqlrl.rl.outcome``: ``solved(breakdown)`` (THE definition of success: the reward's ``result``
  part is full marks) and the step metrics and stage signal built on it;
- ``sqlrl.rl.grpo``: ``probe(...)`` and ``grpo_steps(...)`` over ``rollout_fn`` / ``score_fn`` /
  ``update_fn`` / ``sync_fn``, returning frozen ``ProbeResult`` / ``StepResult`` values.

Nothing here imports ray, torch or the jobs layer: ``jobs.train`` wires the callables to its
actors, and tests/unit/test_rl_loop.py drives the loop with fakes.
"""
