"""``SqlrlAgentLoop``: verl's tool agent loop with one database session per trajectory.

Registered with verl through ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` pointing at
``jobs/configs/verl/agent_loop.yaml`` (``name: sqlrl_agent``, ``_target_`` this class, and its
keyword arguments); nothing is copied into verl. verl's ``AgentLoopWorker`` instantiates the class
once per trajectory (``hydra.utils.instantiate``), so the instance *is* the trajectory. The YAML is
the only registration: verl's ``@register`` at import would replace the YAML's entry (keyword
arguments and all) when the worker's first trajectory imports this module, and every later
trajectory of that worker would get no ``pool``/``catalog`` (tests/verl/test_agent_loop_registry.py).

What it changes in verl's ``ToolAgentLoop`` (its state machine, chat template, tool parser and
token bookkeeping are used as they are):
- **One session per trajectory**: ``run`` opens it (``TrajectoryTools.open``) from the worker's
  ``SessionSource`` (``actors.verl.sessions``: leases on the DB-session pool's partition of this
  worker, or local ``open_session``) for the row's ``tools_kwargs.*.create_kwargs`` (db_id,
  dialect, preprocess_sql), and closes it in ``finally`` -- after a normal end, an exception, or
  the deadline.
- **Observations are sqlrl's** (``sqlrl.tools.run_raw``: validation messages, results, errors);
  verl's ``max_tool_response_length`` does not cut them again (they cap themselves at 4,000
  characters).
- **The prompt's tool list is sqlrl's** (``sqlrl.tools.TOOLS`` schemas, exactly as sqlrl's own
  rollouts and serving render them).
- **Tool calls share it**: ``_call_tool`` passes the trajectory to ``actors.verl.tools`` (no
  create/release per call, unlike ``ToolAgentLoop._call_tool``); a call to a tool that is not
  registered gets sqlrl's "unknown tool" observation; other verl tools keep verl's behaviour.
- **submit_solution ends the trajectory** (after its turn's calls have run), also on the last
  turn verl allows (verl's turn limit would drop that turn's calls unread).
- **A trajectory deadline** (``deadline_s``): generation and tool phases are awaited at most until
  it; then the trajectory ends with what it has (a cancelled phase never half-updates the token
  state: verl assigns it only between awaits). A deadline before the first generated token leaves
  a one-token response (EOS, masked out) so verl's output stays well-formed.
- **What the reward needs**, in the output's ``extra_fields`` (verl passes them to the reward
  function in ``extra_info``): ``sqlrl_tool_calls`` (valid calls, in order), ``sqlrl_submitted_sql``
  (or ``None``), ``sqlrl_stop_reason`` (``submitted`` / ``deadline`` / ``ended``: verl's own limits
  or a turn without a tool call).

Not guaranteed here: scoring (``actors.verl.reward_fn``); the session's isolation and statement
timeouts (sqlrl.db). A session that cannot be opened raises (verl fails the batch): a pool too
small for ``rollout.n × batch`` is a configuration error, not something to train through.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Mapping

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.tools.schemas import ToolResponse

from sqlrl.db.source import SessionRequest, SessionSource
from sqlrl.tools import TOOLS

from .sessions import worker_sessions
from .tools import SqlrlTool
from .trajectory import TrajectoryTools

STOP_SUBMITTED, STOP_DEADLINE, STOP_ENDED = "submitted", "deadline", "ended"


def session_request(kwargs: Mapping[str, Any], key: str) -> SessionRequest:
    """The session a verl row asks for: its ``tools_kwargs`` (written by
    ``sqlrl.tasks.loaders.verl``), the same for every sqlrl tool."""
    tools_kwargs = kwargs.get("tools_kwargs") or {}
    create = next((v.get("create_kwargs") for v in tools_kwargs.values()
                   if isinstance(v, Mapping) and v.get("create_kwargs")), None)
    if not create or not create.get("db_id"):
        raise ValueError("the row has no tools_kwargs.<tool>.create_kwargs.db_id; write the data with "
                         "sqlrl.tasks.loaders.verl.export_verl (curriculum stage 4)")
    return SessionRequest(str(create["db_id"]), create.get("dialect") or None,
                          tuple(str(s) for s in (create.get("preprocess_sql") or ())), key=key)


class SqlrlAgentLoop(ToolAgentLoop):
    """verl's ``ToolAgentLoop`` whose tools run on one trajectory-scoped sqlrl session.

    Keyword arguments (the agent-loop YAML sets them): ``deadline_s`` (the whole trajectory),
    ``catalog`` (a JSON file or mapping ``{db_id: {dialect: url}}``, for local sessions),
    ``pool`` (the name of a published DB-pool directory: leases from this worker's partition),
    ``sessions`` (a ``SessionSource`` object; for programs and tests, instead of the two above).
    """

    def __init__(self, *args: Any, deadline_s: float = 300.0, catalog: Any = None,
                 pool: str | None = None, sessions: SessionSource | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive, got {deadline_s}")
        self.deadline_s = float(deadline_s)
        # the prompt's tool list is sqlrl's own schemas (verl's pydantic schema drops
        # additionalProperties), so verl rollouts see the prompt sqlrl's rollouts and serving see
        self.tool_schemas = [TOOLS[t.name].schema() if isinstance(t, SqlrlTool) else schema
                             for t, schema in zip(self.tools.values(), self.tool_schemas)]
        self.sessions = sessions if sessions is not None else worker_sessions(catalog=catalog, pool=pool)
        self.trajectory: TrajectoryTools | None = None
        self.stop_reason = STOP_ENDED
        self._deadline = 0.0

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        request = session_request(kwargs, key=f"{kwargs.get('index', '')}-{uuid.uuid4().hex}")
        self._deadline = asyncio.get_running_loop().time() + self.deadline_s
        self.trajectory = await TrajectoryTools.open(self.sessions, request)
        try:
            output = await super().run(sampling_params, **kwargs)
        finally:
            await self.trajectory.close()
        output.extra_fields.update({"sqlrl_tool_calls": list(self.trajectory.calls),
                                    "sqlrl_submitted_sql": self.trajectory.submitted_sql,
                                    "sqlrl_stop_reason": self.stop_reason})
        return output

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any],
                                       ignore_termination: bool = False) -> AgentState:
        state = await self._until_deadline(
            super()._handle_generating_state(agent_data, sampling_params, ignore_termination), agent_data)
        if (state == AgentState.TERMINATED and self.stop_reason != STOP_DEADLINE
                and self.trajectory.submitted_sql is None):
            await self._submit_from_last_turn(agent_data)
        return state

    async def _submit_from_last_turn(self, agent_data: AgentData) -> None:
        """verl stops at its turn (or length) limit before it reads the last turn's tool calls; a
        ``submit_solution`` there still counts (nothing is executed: a submission only records)."""
        active = getattr(agent_data, "_active_tools", self.tools)
        _, calls = await self.tool_parser.extract_tool_calls(
            agent_data.response_ids, [t.tool_schema for t in active.values()])
        for c in calls:
            if c.name == "submit_solution":
                await self.trajectory.call(c.name, c.arguments)
        if self.trajectory.submitted_sql is not None:
            self.stop_reason = STOP_SUBMITTED

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        state = await self._until_deadline(super()._handle_processing_tools_state(agent_data), agent_data)
        if state != AgentState.TERMINATED and self.trajectory.submitted_sql is not None:
            self.stop_reason = STOP_SUBMITTED
            return AgentState.TERMINATED
        return state

    async def _call_tool(self, tool_call: Any, tools_kwargs: dict[str, Any],
                         agent_data: AgentData) -> tuple[ToolResponse, float, dict]:
        active = getattr(agent_data, "_active_tools", self.tools)
        tool = active.get(tool_call.name)
        if isinstance(tool, SqlrlTool):
            return await tool.execute("", tool_call.arguments, trajectory=self.trajectory)
        if tool is not None:  # another verl tool: verl's own lifecycle
            return await super()._call_tool(tool_call, tools_kwargs, agent_data)
        outcome = await self.trajectory.call(tool_call.name, tool_call.arguments)  # unknown tool
        return ToolResponse(text=outcome.observation), 0.0, {"error": True}

    async def _until_deadline(self, phase: Any, agent_data: AgentData) -> AgentState:
        remaining = self._deadline - asyncio.get_running_loop().time()
        try:
            if remaining <= 0:
                raise asyncio.TimeoutError
            return await asyncio.wait_for(phase, remaining)
        except asyncio.TimeoutError:
            if asyncio.iscoroutine(phase):
                phase.close()  # never started (deadline already past)
            self.stop_reason = STOP_DEADLINE
            if not agent_data.response_mask:  # nothing generated yet: one masked EOS token
                agent_data.prompt_ids = list(agent_data.prompt_ids) + [self.tokenizer.eos_token_id]
                agent_data.response_mask = [0]
            return AgentState.TERMINATED
