"""sqlrl's tools as verl ``BaseTool`` classes: ``execute_sql`` and ``submit_solution``.

Declared in a ``native`` tool config (``jobs/configs/verl/tools.yaml``: ``class_name`` +
``config: {type: native}``, no ``tool_schema`` -- the schema comes from ``sqlrl.tools.TOOLS``, the
one source of the tools' names, descriptions and arguments) and loaded by verl's own
``verl.tools.tool_registry.initialize_tools_from_config`` in every agent-loop worker.

Guarantees:
- A tool never opens a session: ``execute`` runs on the trajectory's ``TrajectoryTools`` that
  ``actors.verl.agent_loop.SqlrlAgentLoop`` passes in (``trajectory=``), so all calls of a
  trajectory share one session. Called without one (verl's own ``tool_agent`` loop, which creates
  and releases a tool instance per call) it answers with an error observation naming the agent
  loop to use, and runs nothing.
- ``create``/``release`` hold no state (verl's lifecycle is per call; the session's is per
  trajectory and belongs to the agent loop).
- The observation is ``sqlrl.tools``' format, validation errors included; ``execute`` never raises
  for model output.
"""

from __future__ import annotations

from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from sqlrl.tasks.loaders.verl import AGENT_NAME  # the agent loop these tools need
from sqlrl.tools import TOOLS, format_tool_error


class SqlrlTool(BaseTool):
    """One of ``sqlrl.tools.TOOLS``, named by the subclass's ``tool_name``."""

    tool_name: str = ""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        if tool_schema is None:
            tool_schema = OpenAIFunctionToolSchema.model_validate(TOOLS[self.tool_name].schema())
        elif tool_schema.function.name != self.tool_name:
            raise ValueError(f"{type(self).__name__} is the {self.tool_name!r} tool; the tool config "
                             f"names it {tool_schema.function.name!r}")
        super().__init__(config, tool_schema)

    async def execute(self, instance_id: str, parameters: Any, trajectory: Any = None,
                      **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        """Run the call on ``trajectory``'s session; the observation, no step reward, metrics."""
        if trajectory is None:
            text = format_tool_error(f"{self.name} needs sqlrl's agent loop (agent_name: "
                                     f"{AGENT_NAME}), which keeps one database session per "
                                     "trajectory; no session was given")
            return ToolResponse(text=text), 0.0, {"error": True}
        outcome = await trajectory.call(self.name, parameters)
        return ToolResponse(text=outcome.observation), 0.0, {"error": outcome.is_error,
                                                             "final": outcome.is_final}


class ExecuteSqlTool(SqlrlTool):
    tool_name = "execute_sql"


class SubmitSolutionTool(SqlrlTool):
    tool_name = "submit_solution"
