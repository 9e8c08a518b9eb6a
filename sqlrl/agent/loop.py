"""The agent loop: a batch of rollouts driven as explicit state machines, one generation call per round.

Each rollout (``RolloutState``) moves through::

    PROMPTING --> GENERATING --> PARSED --> EXECUTING --> OBSERVED --> GENERATING --> ... --> DONE
                                   |                          ^
                                   +-- malformed turn --------+   (error observation, no tool run)

and may go to DONE from any state. ``AgentLoop.run()`` repeats rounds: every rollout waiting to
generate (PROMPTING or OBSERVED) is collected and ``backend.generate(prompts, sampling)`` is called
ONCE for all of them; then each output is parsed, and the round's tool calls run: every
``execute_sql`` of the round in ONE ``execute_many([(session, sql), ...])`` when the session source
provides it (the Ray pool: one round trip per shard instead of one per trajectory;
``LoopConfig.batch_tools=False`` turns it off), else one by one on each rollout's session
(``sqlrl.tools.run_tool`` either way: one observation format); the observations are appended. A rollout stops on ``submit_solution``
("submitted"; recorded, not executed), after ``max_turns`` turns ("max_turns"), when the next
turn would not fit in ``max_total_tokens`` ("token_budget"), when ``deadline_s`` passes
("timeout"), or on an infrastructure failure ("error"). Mode "single": one generation, no tools,
"single_turn", the SQL from ``sqlrl.rewards.parse.extract_single``.

Guarantees:
- Nothing a model writes raises out of the loop: malformed turns become an error observation
  (the parser's message, in the one observation format), count in ``n_malformed``, and the rollout
  continues. An exception from the backend ends every rollout in that call with "error"; one
  from a session (or a lost session / expired lease) ends that rollout with "error"; the
  message is kept in ``Trajectory.error``. Other rollouts go on.
- Token budget: a generation is only requested when prompt + a full ``max_new_tokens`` turn fits
  in ``max_total_tokens``, so no trajectory ever exceeds it (set it to at most the model context).
  An observation that would leave no room for a full next turn is not appended (the rollout ends
  "token_budget"); likewise the last turn's observation under "max_turns" -- the ids end with
  the last generated token, and ``messages`` matches the ids.
- Ids are exact: ``prompt_ids + gen_1 + continuation_1 + gen_2 + ...`` (see ``chat_format``).
- Timing: a turn's ``gen_ms`` is its batch call's wall time; ``tool_ms`` its own tool call's, or
  the round's ``execute_many`` wall time when batched.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from sqlrl.db.types import ErrorKind
from sqlrl.policy.types import Generation, GenerationBackend, SamplingParams
from sqlrl.rewards.parse import extract_agentic, extract_single
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tasks.types import Task
from sqlrl.tools import ToolCall, format_tool_error, run_tool

from .chat_format import ChatFormat
from .parsers import PARSERS, get_parser
from .prompts import MODES, SCHEMA_STYLES, build_messages, tools_for
from .trajectory import Trajectory, Turn

# Session failures after which no further call can work: the rollout ends with "error".
FATAL_ERROR_KINDS = frozenset({ErrorKind.SESSION_LOST, ErrorKind.LEASE_EXPIRED})


class State(str, enum.Enum):
    PROMPTING = "prompting"
    GENERATING = "generating"
    PARSED = "parsed"
    EXECUTING = "executing"
    OBSERVED = "observed"
    DONE = "done"


_NEXT: dict[State, frozenset[State]] = {
    State.PROMPTING: frozenset({State.GENERATING, State.DONE}),
    State.GENERATING: frozenset({State.PARSED, State.DONE}),
    State.PARSED: frozenset({State.EXECUTING, State.OBSERVED, State.DONE}),
    State.EXECUTING: frozenset({State.OBSERVED, State.DONE}),
    State.OBSERVED: frozenset({State.GENERATING, State.DONE}),
    State.DONE: frozenset(),
}
_WAITING = (State.PROMPTING, State.OBSERVED)  # ready for the next generation round


@dataclass(frozen=True)
class LoopConfig:
    max_turns: int = 8
    max_total_tokens: int = 8192
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=512))
    parser: str = "hermes"
    mode: str = "agentic"
    deadline_s: float | None = None  # wall-clock limit of one run(); None = none
    batch_tools: bool = True  # one execute_many per round (when the session source has one)
    schema_style: str | None = None  # prompts.SCHEMA_STYLES key; None: $SQLRL_SCHEMA_STYLE or the default

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"LoopConfig.mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.parser not in PARSERS:
            raise ValueError(f"LoopConfig.parser {self.parser!r} is not one of {', '.join(PARSERS)}")
        if self.max_turns < 1:
            raise ValueError(f"LoopConfig.max_turns must be >= 1, got {self.max_turns}")
        if self.sampling.n != 1:
            raise ValueError("LoopConfig.sampling.n must be 1: repeat a task to make a GRPO group")
        if self.max_total_tokens <= self.sampling.max_new_tokens:
            raise ValueError(f"LoopConfig.max_total_tokens ({self.max_total_tokens}) must exceed "
                             f"sampling.max_new_tokens ({self.sampling.max_new_tokens})")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"LoopConfig.deadline_s must be > 0, got {self.deadline_s}")
        if self.schema_style is not None and self.schema_style not in SCHEMA_STYLES:
            raise ValueError(f"LoopConfig.schema_style {self.schema_style!r} is not one of {', '.join(SCHEMA_STYLES)}")


class LoopStateError(RuntimeError):
    """An illegal state transition: a bug in the loop, never caused by model output."""


@dataclass(eq=False)
class RolloutState:
    """One rollout in progress (mutable; becomes a frozen ``Trajectory`` at the end)."""

    index: int
    task: Task
    session: Any
    messages: list[dict[str, Any]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    turns: list[Turn] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    n_tool_calls: int = 0
    n_tool_errors: int = 0
    n_malformed: int = 0
    submitted_sql: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    state: State = State.PROMPTING
    history: list[State] = field(default_factory=lambda: [State.PROMPTING])

    def to(self, state: State) -> None:
        if state not in _NEXT[self.state]:
            raise LoopStateError(f"rollout {self.index}: {self.state.value} -> {state.value} "
                                 "is not a legal transition")
        self.state = state
        self.history.append(state)

    def finish(self, reason: str, error: str | None = None) -> None:
        self.stop_reason, self.error = reason, error
        self.to(State.DONE)

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        """Append ids: model-generated (with their logprobs, mask 1) or not (``None``, mask 0)."""
        self.ids.extend(int(i) for i in ids)
        self.mask.extend([0 if logprobs is None else 1] * len(ids))
        self.logprobs.extend([0.0] * len(ids) if logprobs is None else (float(x) for x in logprobs))

    def to_trajectory(self, mode: str, policy_version: int) -> Trajectory:
        return Trajectory(
            task_id=self.task.task_id, mode=mode, messages=tuple(self.messages),
            token_ids=tuple(self.ids), loss_mask=tuple(self.mask), old_logprobs=tuple(self.logprobs),
            prompt_length=self.prompt_length, turns=tuple(self.turns),
            n_tool_calls=self.n_tool_calls, n_tool_errors=self.n_tool_errors,
            n_malformed=self.n_malformed, submitted_sql=self.submitted_sql,
            stop_reason=self.stop_reason or "error", policy_version=policy_version,
            error=self.error if self.stop_reason else "the rollout never finished")


ExecuteMany = Callable[[Sequence[tuple[Any, str]]], Sequence[Any]]  # [(session, sql)] -> results


@dataclass(frozen=True, eq=False)
class _Pending:
    """A parsed tool call waiting for the round's tool phase."""
    s: RolloutState
    call: ToolCall
    gen: Generation
    gen_ms: float
    closed: bool


class _Answered:
    """A session whose one ``execute`` was already run in the round's ``execute_many``."""

    def __init__(self, result: Any) -> None:
        self.result = result

    def execute(self, sql: str) -> Any:
        return self.result


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class AgentLoop:
    """Run ``tasks[i]`` on ``sessions[i]`` (anything with ``.execute(sql) -> QueryResult``)."""

    def __init__(self, tasks: Sequence[Task], sessions: Sequence[Any] | None,
                 backend: GenerationBackend, chat_format: ChatFormat,
                 config: LoopConfig = LoopConfig(), *,
                 schemas: Mapping[str, DatabaseSchema] | Sequence[DatabaseSchema | None] | None = None,
                 policy_version: int = 0, clock: Callable[[], float] = time.monotonic,
                 execute_many: ExecuteMany | None = None) -> None:
        tasks = list(tasks)
        sessions = list(sessions) if sessions is not None else [None] * len(tasks)
        if len(sessions) != len(tasks):
            raise ValueError(f"{len(tasks)} tasks but {len(sessions)} sessions")
        if config.mode == "agentic" and any(s is None for s in sessions):
            raise ValueError("agentic mode needs a session for every task")
        if isinstance(schemas, Sequence) and len(schemas) != len(tasks):
            raise ValueError(f"{len(tasks)} tasks but {len(schemas)} schemas")
        self.backend, self.chat_format, self.config = backend, chat_format, config
        self.policy_version, self.clock = policy_version, clock
        self.parser = get_parser(config.parser)
        self.tools = tools_for(config.mode)
        self.states = [RolloutState(i, t, s) for i, (t, s) in enumerate(zip(tasks, sessions))]
        self._schemas = schemas
        self.execute_many = execute_many if config.batch_tools else None
        self.batch_sizes: list[int] = []  # prompts per backend.generate call, in order
        self.tool_batches: list[int] = []  # execute_sql calls per execute_many call, in order
        self._turn_handlers: dict[str, Callable[[RolloutState, Generation, str, float], Any]] = {
            "agentic": self._agentic_turn, "single": self._single_turn}

    # -- driver ----------------------------------------------------------------------------------

    def run(self) -> list[Trajectory]:
        start = self.clock()
        for s in self.states:
            if s.state is State.PROMPTING and not s.ids:
                self._prompt(s)
        while True:
            waiting = [s for s in self.states if s.state in _WAITING]
            if not waiting:
                break
            if self.config.deadline_s is not None and self.clock() - start > self.config.deadline_s:
                for s in waiting:
                    s.finish("timeout", f"the run's deadline of {self.config.deadline_s} s passed")
                break
            batch = [s for s in waiting if self._fits_a_turn(s)]
            if batch:
                self._round(batch)
        return [s.to_trajectory(self.config.mode, self.policy_version) for s in self.states]

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

    def _round(self, batch: list[RolloutState]) -> None:
        for s in batch:
            s.to(State.GENERATING)
        self.batch_sizes.append(len(batch))
        t0 = self.clock()
        try:
            gens = list(self.backend.generate([list(s.ids) for s in batch], self.config.sampling))
            if len(gens) != len(batch):
                raise RuntimeError(f"the backend returned {len(gens)} generations for "
                                   f"{len(batch)} prompts (n=1)")
        except Exception as exc:
            for s in batch:
                s.finish("error", f"generation failed: {_describe(exc)}")
            return
        gen_ms = (self.clock() - t0) * 1000.0
        pending: list[_Pending] = []
        for s, gen in zip(batch, gens):
            try:
                p = self._take(s, gen, gen_ms)
                if p is not None:
                    pending.append(p)
            except Exception as exc:  # the backend's output or a session broke a contract
                if s.state is not State.DONE:
                    s.finish("error", _describe(exc))
        if pending:
            self._run_tools(pending)

    def _run_tools(self, pending: list[_Pending]) -> None:
        """The round's tool calls: every ``execute_sql`` in one ``execute_many`` when the session
        source has one (each turn's ``tool_ms`` is then that call's wall time), else one by one."""
        answered: dict[int, tuple[Any, float]] = {}
        sql = [p for p in pending if p.call.name == "execute_sql"] if self.execute_many else []
        if sql:
            self.tool_batches.append(len(sql))
            t0 = self.clock()
            try:
                results = list(self.execute_many([(p.s.session, p.call.arguments["sql"]) for p in sql]))
                if len(results) != len(sql):
                    raise RuntimeError(f"execute_many returned {len(results)} results for {len(sql)} calls")
            except Exception as exc:
                ms = (self.clock() - t0) * 1000.0
                for p in sql:
                    self._tool_failed(p, exc, ms)
                sql = []
            else:
                ms = (self.clock() - t0) * 1000.0
                answered = {id(p): (r, ms) for p, r in zip(sql, results)}
        for p in pending:
            if p.s.state is not State.EXECUTING:
                continue
            t0 = self.clock()
            try:
                if id(p) in answered:
                    result, ms = answered[id(p)]
                    outcome = run_tool(p.call, _Answered(result))
                else:
                    outcome = run_tool(p.call, p.s.session)
                    ms = (self.clock() - t0) * 1000.0
            except Exception as exc:
                self._tool_failed(p, exc, (self.clock() - t0) * 1000.0)
                continue
            try:
                self._tool_done(p, outcome, ms)
            except Exception as exc:  # a template problem building the continuation
                if p.s.state is not State.DONE:
                    p.s.finish("error", _describe(exc))

    def _take(self, s: RolloutState, gen: Generation, gen_ms: float) -> _Pending | None:
        ids, lps = tuple(gen.token_ids), tuple(gen.logprobs)
        if len(lps) != len(ids):
            raise RuntimeError(f"the backend returned {len(ids)} token ids but {len(lps)} logprobs")
        if len(ids) > self.config.sampling.max_new_tokens:
            raise RuntimeError(f"the backend returned {len(ids)} tokens, more than max_new_tokens="
                               f"{self.config.sampling.max_new_tokens}")
        s.add(ids, lps)
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
