"""``ToolBatcher``: the agent loop's tool calls, off the event loop, coalesced when ready together.

A trajectory coroutine awaits ``run(call, session)``; calls that arrive within ``window_s`` of the
first of them (``0``: in the same event-loop step -- e.g. the trajectories a batch call answered
together) form a group, run as ONE job on the loop's thread pool (sessions are sync):

- with ``execute_many`` (the session source's: the Ray pool's, one round trip per shard), every
  ``execute_sql`` of the group goes out in one ``execute_many([(session, sql), ...])``; each call's
  ``tool_ms`` is that call's wall time. An exception from it, or the wrong number of results,
  fails every ``execute_sql`` of the group (the exception is their result);
- every other call (``submit_solution``; all of them without ``execute_many``) runs one by one on
  its own session through ``sqlrl.tools.run_tool`` (one observation format), timed on its own.

Sessions leased per rollout (``lease``: ``AgentLoop(leases=...)``) are coalesced the same way:
rollouts that ask in the same step share one ``open_many``; a refused one is retried session by
session, so only the refused rollout gets the exception.

The results of a group are delivered in one event-loop step, so the trajectories of a group go on
together (and their next generations arrive at the engine together). Nothing waits for a round:
a group is only what became ready within the window.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from typing import Any, Callable, Protocol, Sequence

from sqlrl.tools import ToolCall, ToolOutcome, run_tool

ExecuteMany = Callable[[Sequence[tuple[Any, str]]], Sequence[Any]]  # [(session, sql)] -> results
Result = tuple["ToolOutcome | BaseException", float]  # (outcome or the exception, tool_ms)
log = logging.getLogger(__name__)


class Leases(Protocol):
    """Sessions opened per rollout as it starts (``AgentLoop(leases=...)``): ``open_many(indexes)``
    the sessions of those rollouts, in order, all or nothing (raises when one is refused);
    ``close(index, session)`` when a rollout ends."""

    def open_many(self, indexes: Sequence[int]) -> list[Any]: ...

    def close(self, index: int, session: Any) -> None: ...


class _Answered:
    """A session whose one ``execute`` was already run in the group's ``execute_many``."""

    def __init__(self, result: Any) -> None:
        self.result = result

    def execute(self, sql: str) -> Any:
        return self.result


class ToolBatcher:
    def __init__(self, executor: Executor, execute_many: ExecuteMany | None, window_s: float,
                 clock: Callable[[], float]) -> None:
        self.executor, self.execute_many, self.window_s, self.clock = executor, execute_many, window_s, clock
        self.batches: list[int] = []  # execute_sql calls per execute_many call, in order
        self._group: list[tuple[ToolCall, Any, asyncio.Future]] | None = None
        self._leasing: list[tuple[int, asyncio.Future]] | None = None

    async def lease(self, leases: Leases, index: int) -> Any:
        """Rollout ``index``'s session. Rollouts that ask in the same event-loop step share ONE
        ``open_many`` (the pool: one round trip per shard); when it is refused, each of them is
        opened on its own, so only the refused one raises."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        if self._leasing is None:
            self._leasing = []
            loop.call_soon(self._flush_leases, loop, leases)
        self._leasing.append((index, fut))
        return await fut

    def _flush_leases(self, loop: asyncio.AbstractEventLoop, leases: Leases) -> None:
        group, self._leasing = self._leasing or [], None
        job = loop.run_in_executor(self.executor, _open_group, leases, [i for i, _ in group])
        job.add_done_callback(lambda j: _deliver_leases(group, j))

    async def close(self, leases: Leases, state: Any) -> None:
        """Close a rollout's leased session; a failing close is logged (the rollout's result stands)."""
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, leases.close, state.index, state.session)
        except Exception as exc:  # the source reclaims it (a pool lease expires); say so
            log.warning("closing the session of rollout %s failed: %s: %s", state.index, type(exc).__name__, exc)
        state.session = None

    async def run(self, call: ToolCall, session: Any) -> Result:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        if self._group is None:
            self._group = []
            if self.window_s > 0:
                loop.call_later(self.window_s, self._flush, loop)
            else:
                loop.call_soon(self._flush, loop)
        self._group.append((call, session, fut))
        return await fut

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        group, self._group = self._group or [], None
        job = loop.run_in_executor(self.executor, self._run_group, [(c, s) for c, s, _ in group])
        job.add_done_callback(lambda j: _deliver(group, j))

    def _run_group(self, calls: list[tuple[ToolCall, Any]]) -> list[Result]:
        results: list[Result | None] = [None] * len(calls)
        sql = [k for k, (c, _) in enumerate(calls) if c.name == "execute_sql"] if self.execute_many else []
        if sql:
            assert self.execute_many is not None
            self.batches.append(len(sql))
            t0 = self.clock()
            try:
                answers = list(self.execute_many([(calls[k][1], calls[k][0].arguments["sql"]) for k in sql]))
                if len(answers) != len(sql):
                    raise RuntimeError(f"execute_many returned {len(answers)} results for {len(sql)} calls")
            except Exception as exc:
                ms = (self.clock() - t0) * 1000.0
                for k in sql:
                    results[k] = (exc, ms)
            else:
                ms = (self.clock() - t0) * 1000.0
                for k, answer in zip(sql, answers):
                    results[k] = _outcome(calls[k][0], _Answered(answer), self.clock, ms)
        for k, (call, session) in enumerate(calls):
            if results[k] is None:
                results[k] = _outcome(call, session, self.clock)
        return results  # type: ignore[return-value]


def _outcome(call: ToolCall, session: Any, clock: Callable[[], float], ms: float | None = None) -> Result:
    t0 = clock()
    try:
        outcome: ToolOutcome | BaseException = run_tool(call, session)
    except Exception as exc:
        outcome = exc
    return outcome, ms if ms is not None else (clock() - t0) * 1000.0


def _open_group(leases: Leases, indexes: list[int]) -> list[Any]:
    """The sessions of ``indexes`` (one ``open_many``), or, when it is refused, each on its own: an
    exception in the place of each one that cannot be opened."""
    try:
        return list(leases.open_many(indexes))
    except Exception as exc:
        if len(indexes) == 1:
            return [exc]
    out: list[Any] = []
    for i in indexes:
        try:
            out.append(leases.open_many([i])[0])
        except Exception as exc:
            out.append(exc)
    return out


def _deliver_leases(group: list[tuple[int, asyncio.Future]], job: asyncio.Future) -> None:
    if job.cancelled() or job.exception() is not None:
        results: list[Any] = [job.exception() or asyncio.CancelledError("the lease job was cancelled")] * len(group)
    else:
        results = job.result()
    for (_, fut), res in zip(group, results):
        if fut.done():
            continue
        if isinstance(res, BaseException):
            fut.set_exception(res)
        else:
            fut.set_result(res)


def _deliver(group: list[tuple[ToolCall, Any, asyncio.Future]], job: asyncio.Future) -> None:
    """Every result of a group in one step (a failed job fails every call in it)."""
    if job.cancelled():
        results: list[Any] = [(asyncio.CancelledError("the tool job was cancelled"), 0.0)] * len(group)
    elif job.exception() is not None:
        results = [(job.exception(), 0.0)] * len(group)
    else:
        results = job.result()
    for (_, _, fut), res in zip(group, results):
        if not fut.done():
            fut.set_result(res)
