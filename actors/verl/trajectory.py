"""One trajectory's tool calls inside verl's asyncio agent loop, on the trajectory's one session.

``TrajectoryTools.open(source, request)`` opens exactly one session (from a
``sqlrl.db.source.SessionSource``: leases on the DB-session pool, or local ``open_session``) and
every tool call of the trajectory runs on it; ``close()`` gives it back.

Guarantees:
- One session per trajectory: every call (``execute_sql``, ``submit_solution``, an invalid call)
  goes through ``call``, which runs ``sqlrl.tools.run_raw`` on that session -- so a TEMP table made
  in call 1 is there in call 3, and every observation is in sqlrl's one format
  (``sqlrl.tools.observation``), validation messages included.
- Calls run one at a time, in the order they were made (an ``asyncio.Lock``; verl gathers a turn's
  calls concurrently), off the event loop (the session's ``execute`` blocks; its own statement
  timeout stops the SQL, not this module).
- ``close()`` is idempotent, never raises, and waits for a call still running on the session
  before closing it (a deadline never closes a session under a running statement).
- ``submitted_sql`` is the SQL of the last valid ``submit_solution``; ``calls`` lists every valid
  call as ``{"name", "arguments"}`` (what ``sqlrl.rewards.extract_agentic`` reads).

Not guaranteed here: a bound on the whole trajectory (the agent loop's deadline does that).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from sqlrl.db.source import SessionRequest, SessionSource
from sqlrl.tools import ToolOutcome, run_raw

# Blocking session work of every trajectory in this process (a session call holds one thread).
_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="sqlrl-verl-session")


class TrajectoryTools:
    """The tool calls of one trajectory: the session they run on (an object with ``execute``,
    from a ``SessionSource``) and what they produced. Not a session itself."""

    def __init__(self, source: SessionSource, session: Any) -> None:
        self.source = source
        self.session = session
        self.calls: list[dict[str, Any]] = []
        self.submitted_sql: str | None = None
        self.closed = False
        self._lock = asyncio.Lock()
        self._running: concurrent.futures.Future | None = None  # the call on the session now

    @classmethod
    async def open(cls, source: SessionSource, request: SessionRequest) -> "TrajectoryTools":
        """Open the trajectory's one session (in a worker thread); raises what the source raises."""
        (session,) = await asyncio.wrap_future(_THREADS.submit(source.open_many, [request]))
        return cls(source, session)

    async def call(self, name: Any, arguments: Any) -> ToolOutcome:
        """Validate and run one tool call on the session (never raises for model output)."""
        async with self._lock:
            if self.closed:
                raise RuntimeError("the trajectory's session is closed")
            self._running = _THREADS.submit(run_raw, name, arguments, self.session)
            # A cancelled caller (the deadline) stops waiting here; the statement itself runs on
            # until the session's timeout stops it, and close() waits for it.
            outcome = await asyncio.wrap_future(self._running)
        if outcome.call is not None:
            self.calls.append({"name": outcome.call.name, "arguments": dict(outcome.call.arguments)})
        if outcome.submitted_sql is not None:
            self.submitted_sql = outcome.submitted_sql
        return outcome

    async def close(self) -> None:
        """Give the session back (after a call still running on it); idempotent, never raises."""
        if self.closed:
            return
        self.closed = True
        try:
            await asyncio.wrap_future(_THREADS.submit(_close_after, self._running, self.source,
                                                      self.session))
        except Exception:  # close_many is best effort by contract; never mask the caller's error
            pass


def _close_after(running: concurrent.futures.Future | None, source: SessionSource, session: Any) -> None:
    if running is not None:
        concurrent.futures.wait([running])
    source.close_many([session])
