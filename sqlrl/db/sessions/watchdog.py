"""Per-call deadlines enforced from outside the session: one watchdog thread per process.

The executor arms a deadline for every ``execute`` call of an engine that can be stopped from
outside (the adapter's ``canceller(conn)`` returns a callable, or None), and disarms it when the
call ends. When a deadline passes (plus ``GRACE_S``, so that the server's own timer normally fires
first) before the call ended, the watchdog thread runs the canceller, which stops whatever the
session's connection is running *whatever the session itself SET*:

- PostgreSQL: libpq's cancel request (``connection.cancel()``, the same SIGINT to the backend that
  ``pg_cancel_backend(pid)`` sends, authenticated by the connection's cancel key: no admin
  connection or privilege is needed);
- MariaDB/MySQL: ``KILL QUERY <connection id>`` sent on a second connection (``KillerConnections``),
  opened lazily with the admin URL registered for the server
  (``sqlrl.db.dialects.mysql_fetch.register_admin_url``, or
  ``SQLRL_MYSQL_ADMIN_URL``) and otherwise with the session's own account (an account may kill
  its own connections' statements).

The executor reports a call during which the watchdog fired as ``ErrorKind.TIMEOUT``, never as a
success. Cost when nothing times out: one ``heappush`` under a lock per call, and at ``disarm`` the
ended calls at the top of the heap are popped, so the heap holds about the calls in flight (not
every call of the last ``timeout_s``: 38,000 entries at 7,000 calls/s before, and a thread
popping them every ``TICK_S``). The thread sleeps until the earliest deadline it knew of when it
went to sleep (or until notified, when none was pending); ``arm`` wakes it only for a deadline
earlier than that, so a stream of calls that each end in time wakes it about once per
``timeout_s``, never once per call. Guarantee kept: a call that has not ended by its deadline
(+ ``GRACE_S``) is stopped within ``TICK_S`` of it.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from typing import Callable

GRACE_S = 0.25  # the watchdog acts this long after the call's deadline
TICK_S = 0.05  # at most this often while deadlines are pending


class Armed:
    """One call's deadline; ``fired`` says whether the watchdog stopped it."""

    __slots__ = ("deadline", "cancel", "done", "fired")

    def __init__(self, deadline: float, cancel: Callable[[], None]) -> None:
        self.deadline, self.cancel = deadline, cancel
        self.done = self.fired = False


class Watchdog:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Armed]] = []
        self._count = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._sleep_until = math.inf  # what the thread waits for (inf: until notified)

    def arm(self, deadline: float, cancel: Callable[[], None]) -> Armed:
        entry = Armed(deadline + GRACE_S, cancel)
        with self._lock:
            heapq.heappush(self._heap, (entry.deadline, next(self._count), entry))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="sqlrl-watchdog",
                                                daemon=True)
                self._thread.start()
            elif entry.deadline < self._sleep_until:  # earlier than the thread's wake-up
                self._wake.notify()
        return entry

    def disarm(self, entry: Armed | None) -> bool:
        """Mark the call ended; True when the watchdog had stopped it (report a timeout)."""
        if entry is None:
            return False
        with self._lock:
            entry.done = True
            heap = self._heap
            while heap and heap[0][2].done:  # ended calls at the top: the heap stays small
                heapq.heappop(heap)
            return entry.fired

    def _loop(self) -> None:
        last = 0.0
        while True:
            due: list[Armed] = []
            with self._lock:
                if not self._heap:
                    self._sleep_until = math.inf
                    self._wake.wait()
                    continue
                now = time.monotonic()
                if now - last < TICK_S:  # coalesce wake-ups (many calls end just before theirs)
                    self._sleep_until = last + TICK_S
                    self._wake.wait(TICK_S - (now - last))
                    now = time.monotonic()
                last = now
                while self._heap and self._heap[0][0] <= now:
                    entry = heapq.heappop(self._heap)[2]
                    if not entry.done:
                        entry.fired = True
                        due.append(entry)
                if not due and self._heap:
                    self._sleep_until = self._heap[0][0]
                    self._wake.wait(self._heap[0][0] - now)
                    continue
                self._sleep_until = now  # awake: arm need not notify
            for entry in due:
                try:
                    entry.cancel()
                except Exception:
                    pass  # the server-side limits still apply


WATCHDOG = Watchdog()
