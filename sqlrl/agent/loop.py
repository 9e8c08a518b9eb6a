"""The agent loop: one coroutine per rollout, each an explicit state machine, on one async engine.

Each rollout (``RolloutState``) moves through::

    PROMPTING --> GENERATING --> PARSED --> EXECUTING --> OBSERVED --> GENERATING --> ... --> DONE
                                   |                          ^
                                   +-- malformed turn --------+   (error observation, no tool run)

and may go to DONE from any state. ``await AgentLoop.arun()`` drives every rollout as its own
coroutine: generate (``await engine.generate(ids, sampling)``: ONE sequence, the engine batches
whatever is in flight) -> parse -> tool -> observe -> generate ..., so a rollout whose turn ended
early runs its tool call and starts its next turn while others are still generating; nobody waits
for a round. ``AgentLoop.run()`` is the synchronous wrapper (``run_sync``). The backend may be an
``AsyncEngine`` (``sqlrl.policy.engine``) or a sync batch ``GenerationBackend``: one that provides
a native engine (``ProvidesEngine``: an ``HFBackend`` gives its ``HFEngine``) runs on it, any other
is wrapped in ``BatchedEngine`` (``sqlrl.policy.batched``, transitional); either is made for the
run and closed after it.

Tool calls run off the event loop (sessions are sync) through ``ToolBatcher``
(``sqlrl.agent.toolrun``): calls ready within ``LoopConfig.tool_window_s`` of each other form one
group, whose ``execute_sql`` calls go out in ONE ``execute_many([(session, sql), ...])`` when the
session source provides it (``LoopConfig.batch_tools=False`` turns that off), the rest one by
one on each rollout's session (``sqlrl.tools.run_tool`` either way: one observation format).
At most ``max_concurrent_trajectories`` rollouts are in progress at once (None: all).

A rollout stops on ``submit_solution`` ("submitted"; recorded, not executed), after ``max_turns``
turns ("max_turns"), when the next turn would not fit in ``max_total_tokens`` ("token_budget"),
when ``deadline_s`` passes ("timeout"), or on an infrastructure failure ("error"). Mode "single":
one generation, no tools, "single_turn", the SQL from ``sqlrl.rewards.parse.extract_single``.

Seeds: turn ``k`` of rollout ``i`` samples with ``turn_seed(sampling.seed, i, k)`` (``row_seed``;
None stays None), one request each, so a rollout's samples do not depend on which others were
generated with it (on an engine with per-request seeds: the native ones, and the adapter over a
seeded backend).

Guarantees:
- Nothing a model writes raises out of the loop: malformed turns become an error observation
  (the parser's message, in the one observation format), count in ``n_malformed``, and the rollout
  continues. A failed generation (``EngineError`` or any exception from the engine; an aborted
  request) ends only the rollout(s) it was generating with "error" -- on the adapter, every
  rollout in that batch call; a session failure (or a lost session / expired lease) ends that
  rollout with "error"; the message is kept in ``Trajectory.error``. Other rollouts go on.
- Token budget: a generation is only requested when prompt + a full ``max_new_tokens`` turn fits
  in ``max_total_tokens``, so no trajectory ever exceeds it (set it to at most the model context).
  An observation that would leave no room for a full next turn is not appended (the rollout ends
  "token_budget"); likewise the last turn's observation under "max_turns" -- the ids end with
  the last generated token, and ``messages`` matches the ids.
- Ids are exact: ``prompt_ids + gen_1 + continuation_1 + gen_2 + ...`` (see ``chat_format``).
- Deadline: a rollout checks it before each turn; a generation still running when it passes is
  aborted in the engine (``abort(request_id)``, its partial turn dropped) and the rollout ends
  "timeout". A running tool call is not interrupted (the check after it ends the rollout).
- Timing: a turn's ``gen_ms`` is its own request's wall time (queueing included); ``tool_ms`` its
  own tool call's, or its group's ``execute_many`` wall time when batched.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from sqlrl.db.types import ErrorKind
from sqlrl.policy.batched import BatchedEngine, as_engine
from sqlrl.policy.engine import AsyncEngine, EngineError, run_sync
from sqlrl.policy.types import Generation, GenerationBackend, row_seed
from sqlrl.rewards.parse import extract_agentic, extract_single
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tasks.types import Task
from sqlrl.tools import ToolCall, format_tool_error

from .chat_format import ChatFormat
from .config import LoopConfig
from .parsers import get_parser
from .prompts import build_messages, tools_for
from .state import _WAITING, LoopStateError, RolloutState, State
from .toolrun import ExecuteMany, Leases, ToolBatcher
from .trajectory import Trajectory, Turn

__all__ = ["FATAL_ERROR_KINDS", "AgentLoop", "LoopConfig", "LoopStateError", "RolloutState", "State", "turn_seed"]

# Session failures after which no further call can work: the rollout ends with "error".
FATAL_ERROR_KINDS = frozenset({ErrorKind.SESSION_LOST, ErrorKind.LEASE_EXPIRED})


def turn_seed(seed: int | None, rollout: int, turn: int) -> int | None:
    """The sampling seed of turn ``turn`` of rollout ``rollout`` in a loop seeded ``seed`` (module
    docstring): ``row_seed(seed, rollout, turn)``; None (fresh draws) stays None."""
    return None if seed is None else row_seed(seed, rollout, turn)


@dataclass(frozen=True, eq=False)
class _Pending:
    """A parsed tool call on its way to the session."""
    s: RolloutState
    call: ToolCall
    gen: Generation
    gen_ms: float
    closed: bool


@dataclass(eq=False)
class _Run:
    """One ``arun``: the engine, the clock's start, the tool batcher, the concurrency bound."""
    engine: AsyncEngine
    start: float
    tools: ToolBatcher
    slots: asyncio.Semaphore
    tag: str


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class AgentLoop:
    """Run ``tasks[i]`` on ``sessions[i]`` (anything with ``.execute(sql) -> QueryResult``).

    ``backend``: an ``AsyncEngine`` or a sync ``GenerationBackend`` (wrapped for the run).
    ``on_finish(state)``: called on the event loop as each rollout reaches DONE.
    ``leases`` (with ``sessions=None``): each rollout opens its session when it starts (inside its
    ``max_concurrent_trajectories`` slot; rollouts starting in the same step share one
    ``leases.open_many``) and closes it when it ends, so at most that many are open; a refused
    open ends that rollout "error". ``seed_indexes[i]`` is the
    index turn seeds use for rollout ``i`` (default ``i``). ``versions`` maps the engine's weight
    versions to the ones trajectories report per token (``Trajectory.token_versions``)."""

    def __init__(self, tasks: Sequence[Task], sessions: Sequence[Any] | None,
                 backend: GenerationBackend | AsyncEngine, chat_format: ChatFormat,
                 config: LoopConfig = LoopConfig(), *,
                 schemas: Mapping[str, DatabaseSchema] | Sequence[DatabaseSchema | None] | None = None,
                 policy_version: int = 0, clock: Callable[[], float] = time.monotonic,
                 execute_many: ExecuteMany | None = None,
                 on_finish: Callable[[RolloutState], None] | None = None,
                 leases: Leases | None = None, seed_indexes: Sequence[int] | None = None,
                 versions: Mapping[int, int] | None = None) -> None:
        tasks = list(tasks)
        sessions = list(sessions) if sessions is not None else [None] * len(tasks)
        if len(sessions) != len(tasks):
            raise ValueError(f"{len(tasks)} tasks but {len(sessions)} sessions")
        if config.mode == "agentic" and leases is None and any(s is None for s in sessions):
            raise ValueError("agentic mode needs a session for every task")
        self._seed_index = list(seed_indexes) if seed_indexes is not None else list(range(len(tasks)))
        if len(self._seed_index) != len(tasks):
            raise ValueError(f"{len(tasks)} tasks but {len(self._seed_index)} seed indexes")
        self.leases = leases if config.mode == "agentic" else None
        self._versions = versions
        self._run_engine = False
        if isinstance(schemas, Sequence) and len(schemas) != len(tasks):
            raise ValueError(f"{len(tasks)} tasks but {len(schemas)} schemas")
        self.backend, self.chat_format, self.config = backend, chat_format, config
        self.policy_version, self.clock = policy_version, clock
        self.parser = get_parser(config.parser)
        self.tools = tools_for(config.mode)
        self.states = [RolloutState(i, t, s) for i, (t, s) in enumerate(zip(tasks, sessions))]
        self._schemas = schemas
        self.execute_many = execute_many if config.batch_tools else None
        self.on_finish = on_finish
        self._adapter: BatchedEngine | None = None
        self._batcher: ToolBatcher | None = None
        self._turn_handlers: dict[str, Callable[[RolloutState, Generation, str, float], Any]] = {
            "agentic": self._agentic_turn, "single": self._single_turn}

    @property
    def batch_sizes(self) -> list[int]:
        """Prompts per ``backend.generate`` call, in order, when generation went through the adapter
        (``BatchedEngine``: a sync batch backend); [] on another engine, which batches inside."""
        return list(self._adapter.batch_sizes) if self._adapter is not None else []

    @property
    def tool_batches(self) -> list[int]:
        """``execute_sql`` calls per ``execute_many`` call, in order."""
        return list(self._batcher.batches) if self._batcher is not None else []

    # -- driver ----------------------------------------------------------------------------------

    def run(self) -> list[Trajectory]:
        """``arun`` from sync code (not inside a running event loop)."""
        return run_sync(self.arun())

    async def arun(self) -> list[Trajectory]:
        engine, owned = as_engine(self.backend)
        self._run_engine = owned  # made for this run: its weight versions mean nothing to the caller
        if isinstance(engine, BatchedEngine):
            self._adapter = engine
        n = max(1, len(self.states))
        limit = self.config.max_concurrent_trajectories or n
        executor = ThreadPoolExecutor(max_workers=min(32, min(limit, n) + 1), thread_name_prefix="sqlrl-tools")
        self._batcher = ToolBatcher(executor, self.execute_many, self.config.tool_window_s, self.clock)
        run = _Run(engine, self.clock(), self._batcher, asyncio.Semaphore(limit), uuid.uuid4().hex[:8])
        try:
            await asyncio.gather(*(self._rollout(s, run) for s in self.states))
        finally:
            executor.shutdown(wait=False)
            if owned:
                await engine.close()
        return [s.to_trajectory(self.config.mode, self.policy_version) for s in self.states]

    async def _rollout(self, s: RolloutState, run: _Run) -> None:
        async with run.slots:
            try:
                if self.leases is not None and s.session is None:
                    try:
                        s.session = await run.tools.lease(self.leases, s.index)
                    except Exception as exc:
                        s.finish("error", f"could not open sessions: {_describe(exc)}")
                        return
                if s.state is State.PROMPTING and not s.ids:
                    self._prompt(s)
                while s.state in _WAITING:
                    if self._remaining(run) == 0.0:
                        s.finish("timeout", self._timeout_message())
                        break
                    if not self._fits_a_turn(s):
                        break
                    got = await self._generate(s, run)
                    if got is None:
                        break
                    pending = self._take(s, *got)
                    if pending is not None:
                        result, ms = await run.tools.run(pending.call, pending.s.session)
                        if isinstance(result, BaseException):
                            self._tool_failed(pending, result, ms)
                        else:
                            self._tool_done(pending, result, ms)
            except Exception as exc:  # the engine's output, a session or a template broke a contract
                if s.state is not State.DONE:
                    s.finish("error", _describe(exc))
            finally:
                if self.leases is not None and s.session is not None:
                    await run.tools.close(self.leases, s)
                if self.on_finish is not None and s.state is State.DONE:
                    self.on_finish(s)

    def _remaining(self, run: _Run) -> float | None:
        """Seconds left before the deadline (0.0 once it passed); None without one."""
        if self.config.deadline_s is None:
            return None
        return max(0.0, self.config.deadline_s - (self.clock() - run.start))

    def _timeout_message(self) -> str:
        return f"the run's deadline of {self.config.deadline_s} s passed"

    async def _generate(self, s: RolloutState, run: _Run) -> tuple[Generation, float] | None:
        """This rollout's next turn from the engine; None when the rollout ended instead."""
        turn = len(s.turns)
        rid = f"{run.tag}/{s.index}/{turn}"
        sampling = replace(self.config.sampling, seed=turn_seed(self.config.sampling.seed, self._seed_index[s.index], turn))
        s.to(State.GENERATING)
        t0 = self.clock()
        request = asyncio.ensure_future(run.engine.generate(list(s.ids), sampling, request_id=rid))
        try:
            done, _ = await asyncio.wait({request}, timeout=self._remaining(run))
        except asyncio.CancelledError:
            request.cancel()
            raise
        if not done:  # the deadline passed mid-generation: stop it in the engine, not just here
            await run.engine.abort(rid)
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
            s.finish("timeout", self._timeout_message())
            return None
        try:
            gen = request.result()
        except EngineError as exc:
            s.finish("error", f"generation failed: {exc}")
            return None
        except Exception as exc:
            s.finish("error", f"generation failed: {_describe(exc)}")
            return None
        if gen.finish_reason == "abort":
            s.finish("error", "generation failed: the engine aborted the request")
            return None
        return gen, (self.clock() - t0) * 1000.0

    def _token_versions(self, gen: Generation) -> list[int]:
        """The policy version of each generated token: the engine's own numbering mapped through
        ``versions`` (engine version -> the caller's, e.g. the learner's), ``policy_version`` when the
        engine reported none."""
        if len(gen.versions) != len(gen.token_ids) or self._run_engine:
            return [self.policy_version] * len(gen.token_ids)
        mapping = self._versions or {}
        return [mapping.get(v, v) for v in gen.versions]

    def _schema(self, s: RolloutState) -> DatabaseSchema | None:
        if self._schemas is None:
            return None
        if isinstance(self._schemas, Mapping):
            return self._schemas.get(s.task.db_id)
        return self._schemas[s.index]

    def _prompt(self, s: RolloutState) -> None:
        try:
            s.messages = build_messages(s.task, self._schema(s), self.config.mode,
                                        parser=self.config.parser, style=self.config.schema_style)
            ids = self.chat_format.prompt_ids(s.messages, self.tools)
        except Exception as exc:  # a template or schema problem: this rollout cannot start
            s.finish("error", f"building the prompt failed: {_describe(exc)}")
            return
        s.add(ids, None)
        s.prompt_length = len(ids)

    def _fits_a_turn(self, s: RolloutState) -> bool:
        if len(s.ids) + self.config.sampling.max_new_tokens <= self.config.max_total_tokens:
            return True
        s.finish("token_budget")
        return False

    def _take(self, s: RolloutState, gen: Generation, gen_ms: float) -> _Pending | None:
        ids, lps = tuple(gen.token_ids), tuple(gen.logprobs)
        if len(lps) != len(ids):
            raise RuntimeError(f"the backend returned {len(ids)} token ids but {len(lps)} logprobs")
        if len(ids) > self.config.sampling.max_new_tokens:
            raise RuntimeError(f"the backend returned {len(ids)} tokens, more than max_new_tokens="
                               f"{self.config.sampling.max_new_tokens}")
        s.add(ids, lps, self._token_versions(gen))
        text = gen.text
        eot = self.chat_format.end_of_turn
        if eot and text.endswith(eot):
            text = text[:-len(eot)]
        s.to(State.PARSED)
        return self._turn_handlers[self.config.mode](s, gen, text, gen_ms)

    # -- turns -----------------------------------------------------------------------------------

    def _single_turn(self, s: RolloutState, gen: Generation, text: str, gen_ms: float) -> None:
        got = extract_single(text)
        s.messages.append({"role": "assistant", "content": text})
        s.turns.append(Turn(gen_ms, 0.0, len(gen.token_ids), None,
                            None if got.format_ok else got.problem, gen.finish_reason))
        s.n_malformed += 0 if got.format_ok else 1
        s.submitted_sql = got.sql
        s.finish("single_turn")

    def _agentic_turn(self, s: RolloutState, gen: Generation, text: str, gen_ms: float) -> _Pending | None:
        n, closed = len(gen.token_ids), self._closed(gen)
        parsed = self.parser.parse(text)
        if not parsed.ok:
            message = "; ".join(parsed.errors) or "the turn holds no tool call"
            s.n_malformed += 1
            s.messages.append({"role": "assistant", "content": text})
            self._observe(s, Turn(gen_ms, 0.0, n, None, message, gen.finish_reason),
                          {"role": "tool", "content": format_tool_error(message)}, closed)
            return None
        call = parsed.calls[0]
        s.calls.append(call)
        s.messages.append({"role": "assistant", "content": parsed.content, "tool_calls": [
            {"type": "function", "function": {"name": call.name, "arguments": dict(call.arguments)}}]})
        s.to(State.EXECUTING)
        return _Pending(s, call, gen, gen_ms, closed)

    def _tool_failed(self, p: _Pending, exc: BaseException, tool_ms: float) -> None:
        message = f"the session failed: {_describe(exc)}"
        p.s.turns.append(Turn(p.gen_ms, tool_ms, len(p.gen.token_ids), p.call.name, message,
                              p.gen.finish_reason))
        p.s.finish("error", message)

    def _tool_done(self, p: _Pending, outcome: Any, tool_ms: float) -> None:
        s, call, gen, n = p.s, p.call, p.gen, len(p.gen.token_ids)
        s.n_tool_calls += 1
        if outcome.is_final:
            s.turns.append(Turn(p.gen_ms, tool_ms, n, call.name, None, gen.finish_reason))
            s.submitted_sql = extract_agentic(s.calls).sql
            s.finish("submitted")
            return
        s.n_tool_errors += int(outcome.is_error)
        turn = Turn(p.gen_ms, tool_ms, n, call.name, outcome.observation if outcome.is_error else None,
                    gen.finish_reason)
        result = outcome.result
        if result is not None and result.error is not None and result.error.kind in FATAL_ERROR_KINDS:
            s.turns.append(turn)
            s.finish("error", f"the session is gone: {outcome.observation}")
            return
        self._observe(s, turn, {"role": "tool", "name": call.name, "content": outcome.observation},
                      p.closed)

    def _closed(self, gen: Generation) -> bool:
        """Did the generated ids end the assistant turn themselves?"""
        end = self.chat_format.turn_end_ids
        return len(gen.token_ids) >= len(end) and tuple(gen.token_ids[-len(end):]) == tuple(end)

    def _observe(self, s: RolloutState, turn: Turn, tool_message: dict[str, Any],
                 closed: bool) -> None:
        s.turns.append(turn)
        if len(s.turns) >= self.config.max_turns:
            s.finish("max_turns")
            return
        cont = self.chat_format.continuation_ids(s.messages, [tool_message], self.tools,
                                                 close_turn=not closed)
        if len(s.ids) + len(cont) + self.config.sampling.max_new_tokens > self.config.max_total_tokens:
            s.finish("token_budget")
            return
        s.add(cont, None)
        s.messages.append(tool_message)
        s.to(State.OBSERVED)
