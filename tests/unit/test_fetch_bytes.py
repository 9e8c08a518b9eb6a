"""The executor's byte-sized fetching and per-call deadline, and the watchdog, with a fake engine
(no server): batch sizes follow the observed row width, the rest of a capped result is abandoned,
and a call the watchdog stopped is a timeout whatever the driver returned."""

from __future__ import annotations

import threading
import time

from sqlrl.db import ErrorKind, Limits
from sqlrl.db.sessions import executor
from sqlrl.db.statements import Statement, split
from sqlrl.db.sessions.watchdog import Watchdog


class _Cursor:
    def __init__(self, width: int, total: int, delay_s: float = 0.0, log=None) -> None:
        self.description = (("v",),)
        self.width, self.left, self.delay_s = width, total, delay_s
        self.sizes = [] if log is None else log
        self.closed = False

    def fetchmany(self, size: int):
        self.sizes.append(size)
        if self.delay_s:
            time.sleep(self.delay_s)
        n = min(size, self.left)
        self.left -= n
        return [("x" * self.width,)] * n

    def close(self) -> None:
        self.closed = True


class _Adapter:
    """A whole adapter (``contract.DialectAdapter``) whose statements return scripted cursors,
    with the ``ExactLexer``, ``Abandoning`` and ``Cancellable`` capabilities."""

    name = "fake"
    sqlglot_dialect = "sqlite"
    isolation = "none"

    def __init__(self, cursor_factory, cancel=None) -> None:
        self.cursor_factory, self.cancel = cursor_factory, cancel
        self.abandoned = 0
        self.deadlines: list[float] = []

    def connect(self, url, limits):
        return None

    def begin(self, conn, url):
        return None

    def end(self, conn, state):
        return False

    def ping(self, conn):
        return True

    def close(self, conn):
        pass

    def lex(self, conn, sql) -> list[Statement]:
        return split(sql, "sqlite")

    def denied(self, statement):
        return None

    def run(self, conn, state, statement, deadline):
        self.deadlines.append(deadline)
        return self.cursor_factory()

    def classify(self, exc):
        return ErrorKind.RUNTIME

    def abandon(self, conn, cursor):
        self.abandoned += 1

    def canceller(self, conn):
        return self.cancel


def test_batches_are_sized_by_bytes_and_the_rest_is_abandoned():
    log: list[int] = []
    adapter = _Adapter(lambda: _Cursor(1000, 10_000, log=log))
    r = executor.run_call(adapter, None, None, "SELECT v FROM t", Limits(max_bytes=400_000))
    assert r.ok and r.truncated and 300 <= r.row_count <= 400
    assert log[0] == executor.FIRST_BATCH_ROWS
    assert all(size <= 110 for size in log[1:]), log  # ~max_bytes/4 of ~1 KB rows
    assert adapter.abandoned == 1


def test_narrow_rows_take_few_batches_and_are_not_abandoned():
    log: list[int] = []
    adapter = _Adapter(lambda: _Cursor(5, 5000, log=log))
    r = executor.run_call(adapter, None, None, "SELECT v FROM t", Limits())
    assert r.ok and not r.truncated and r.row_count == 5000
    assert len(log) == 2 and adapter.abandoned == 0


def test_the_row_cap_reads_one_row_more_at_most():
    log: list[int] = []
    adapter = _Adapter(lambda: _Cursor(5, 10**9, log=log))
    r = executor.run_call(adapter, None, None, "SELECT v FROM t", Limits(max_rows=100))
    assert r.truncated and r.row_count == 100 and sum(log) <= 101


def test_one_deadline_for_all_statements_and_fetches():
    adapter = _Adapter(lambda: _Cursor(5, 10**9, delay_s=0.05))
    t0 = time.monotonic()
    r = executor.run_call(adapter, None, None, "SELECT 1; SELECT 2",
                          Limits(timeout_s=0.3, max_rows=10**6, max_bytes=10**9))
    assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT
    # unstopped, the fetch would take minutes; the bound only stops a hang (the single deadline
    # itself is checked below, by value)
    assert time.monotonic() - t0 < 30
    adapter2 = _Adapter(lambda: _Cursor(5, 1))
    executor.run_call(adapter2, None, None, "SELECT 1; SELECT 2; SELECT 3", Limits(timeout_s=5))
    assert len(set(adapter2.deadlines)) == 1  # the same deadline for every statement


def test_a_call_the_watchdog_stopped_is_a_timeout_even_if_the_driver_returned_rows():
    cancelled = threading.Event()

    def slow_cursor():
        # the "server" ignores its own timeout: only the watchdog's cancel ends the statement (an
        # event, not a sleep that the watchdog must beat), and the driver returns rows anyway
        assert cancelled.wait(30), "the watchdog never cancelled the call"
        return _Cursor(5, 1)

    adapter = _Adapter(slow_cursor, cancel=cancelled.set)
    r = executor.run_call(adapter, None, None, "SELECT 1", Limits(timeout_s=0.3))
    assert cancelled.is_set()
    assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT and r.rows == ()


def test_the_watchdog_does_not_fire_for_calls_that_ended():
    dog = Watchdog()
    fired = []
    entries = [dog.arm(time.monotonic() + 0.05, lambda: fired.append(1)) for _ in range(100)]
    assert not any(dog.disarm(e) for e in entries)
    late = dog.arm(time.monotonic() + 0.05, lambda: fired.append(2))
    deadline = time.monotonic() + 30  # wait for the event (the late one fired), not a clock:
    while not fired and time.monotonic() < deadline:  # the watchdog acts in deadline order, so
        time.sleep(0.01)  # by then any of the earlier, disarmed calls would have fired too
    assert dog.disarm(late) and fired == [2]


def test_an_earlier_deadline_wakes_the_watchdog():
    dog = Watchdog()
    fired = threading.Event()
    far = dog.arm(time.monotonic() + 60, lambda: None)
    t0 = time.monotonic()
    near = dog.arm(time.monotonic() + 0.05, fired.set)
    # asleep until the far deadline (60 s) it would miss this bound; woken, it fires at once
    assert fired.wait(30) and time.monotonic() - t0 < 30
    assert dog.disarm(near) and not dog.disarm(far)


class _WideningCursor(_Cursor):
    """16 one-byte rows, then rows of ``width`` bytes: a later batch sized from the first is huge."""

    def __init__(self, width: int, total: int, log: list[int]) -> None:
        super().__init__(width, total, log=log)
        self.pos = 0

    def fetchmany(self, size: int):
        self.sizes.append(size)
        n = min(size, self.left)
        rows = [("x" if p < 16 else "x" * self.width,) for p in range(self.pos, self.pos + n)]
        self.pos, self.left = self.pos + n, self.left - n
        return rows


class _BoundedAdapter(_Adapter):
    """The fake engine with ``BatchBound``: one fetch may ask for at most ``bound`` rows."""

    def __init__(self, cursor_factory, bound: int) -> None:
        super().__init__(cursor_factory)
        self.bound = bound

    def batch_rows(self, conn) -> int:
        return self.bound


def test_a_batch_bound_caps_every_fetch_however_narrow_the_first_rows():
    limits = Limits(max_bytes=1_000_000)
    unbounded: list[int] = []
    r = executor.run_call(_Adapter(lambda: _WideningCursor(60_000, 3000, unbounded)), None, None,
                          "SELECT v FROM t", limits)
    assert r.truncated and max(unbounded) > 2000, unbounded  # what the bound is for
    bounded: list[int] = []
    adapter = _BoundedAdapter(lambda: _WideningCursor(60_000, 3000, bounded), bound=7)
    r = executor.run_call(adapter, None, None, "SELECT v FROM t", limits)
    assert r.ok and r.truncated and adapter.abandoned == 1, r
    assert [len(v) for (v,) in r.rows[:16]] == [1] * 16 and len(r.rows) == 16 + 1_000_000 // 60_005
    assert bounded[0] == 7 and max(bounded) == 7, bounded  # the first batch too


def test_a_short_batch_over_the_byte_cap_is_a_truncation_not_the_end():
    """An adapter may stop reading a batch once it holds more than ``max_bytes`` (MariaDB's
    Result): the executor must read that as truncated, not as the last rows of the result."""

    class _StopsEarly(_Cursor):
        def fetchmany(self, size: int):
            self.sizes.append(size)
            return [("x" * 600_000,)] * 2  # fewer than asked, already over the cap

    log: list[int] = []
    adapter = _Adapter(lambda: _StopsEarly(0, 0, log=log))
    r = executor.run_call(adapter, None, None, "SELECT v FROM t", Limits(max_bytes=1_000_000))
    assert r.ok and r.truncated and r.row_count == 1 and adapter.abandoned == 1, r
