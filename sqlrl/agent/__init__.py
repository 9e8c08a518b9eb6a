"""The agent loop (Ray-free, torch-free): prompts, tool-call parsing, exact token ids, trajectories.

- ``prompts``: ``build_messages(task, schema, mode, dialect)``, ``tools_for(mode)``.
- ``parsers``: ``PARSERS`` registry (``"hermes"``); ``parse(text) -> ParsedTurn`` never raises.
- ``chat_format``: ``ChatFormat`` Protocol, ``HFChatFormat(tokenizer)``: prompt ids and the exact
  continuation ids after a generated turn.
- ``trajectory``: frozen ``Trajectory`` / ``Turn`` (ids, loss mask, behaviour logprobs, timings).
- ``loop``: ``AgentLoop(tasks, sessions, engine_or_backend, chat_format, config).run()`` (or
  ``await .arun()``) -- one coroutine per rollout, each an explicit state machine (``state``) on
  an async engine; tool calls off the event loop, coalesced when ready together (``toolrun``).
- ``request``: unlabelled ``GenerateRequest`` / ``DebugRequest`` (no gold answer needed).
- ``agent``: ``Agent`` -- policy + backend + chat format + loop + ``SessionSource`` in one place
  (what rollout workers and the serve app both wrap).
"""

from .chat_format import ChatFormat, ChatFormatError, HFChatFormat
from .loop import FATAL_ERROR_KINDS, AgentLoop, LoopConfig, LoopStateError, RolloutState, State
from .parsers import PARSERS, HermesParser, ParsedTurn, get_parser
from .prompts import MODES, build_messages, tools_for
from .trajectory import STOP_REASONS, Trajectory, Turn
from .request import AgentRequest, DebugRequest, GenerateRequest, request_from_task
from .agent import Agent, AgentConfig, LocalSessions, SessionSource, error_trajectories

__all__ = ["Agent", "AgentConfig", "AgentRequest", "DebugRequest", "GenerateRequest",
           "LocalSessions", "SessionSource", "error_trajectories", "request_from_task", "AgentLoop", "ChatFormat", "ChatFormatError", "FATAL_ERROR_KINDS",
           "HFChatFormat", "HermesParser", "LoopConfig", "LoopStateError", "MODES", "PARSERS",
           "ParsedTurn", "RolloutState", "STOP_REASONS", "State", "Trajectory", "Turn",
           "build_messages", "get_parser", "tools_for"]
