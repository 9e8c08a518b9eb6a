"""sqlrl on verl's own trainer: an agent loop, tools and a reward function that verl loads by name.

- ``agent_loop``: ``SqlrlAgentLoop`` (agent name ``sqlrl_agent``), verl's ``ToolAgentLoop`` with one
  trajectory-scoped session per trajectory and a deadline (``jobs/configs/verl/agent_loop.yaml``).
- ``tools``: ``execute_sql`` / ``submit_solution`` as verl ``BaseTool`` classes that run on the
  trajectory's session (``jobs/configs/verl/tools.yaml``).
- ``trajectory``: ``TrajectoryTools``, the session and the calls of one trajectory.
- ``sessions``: where a worker's sessions come from (its DB-pool partition, claimed by index from
  a published ``PoolDirectory``; or local sessions over a catalog).
- ``reward_fn``: ``compute_score`` for ``reward.custom_reward_function`` (``pkg://actors.verl.reward_fn``).

This package imports verl (which imports Ray), so it lives outside the Ray-free ``sqlrl`` core.
Nothing is imported here: verl imports the module each config names. docs/verl.md has the picture.
"""
