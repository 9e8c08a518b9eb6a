"""The executor's watchdog (``sqlrl.db.sessions.watchdog``) keeps only the calls in flight, is not
woken by calls that end in time, and still stops every call that runs past its deadline -- also
one armed with an earlier deadline than the one the thread sleeps towards, and one armed after
the entry the thread sleeps towards was dropped. Own ``Watchdog`` instances; events, not clocks.
"""

from __future__ import annotations

import threading
import time

from sqlrl.db.sessions.watchdog import GRACE_S, Watchdog

WAIT_S = 10.0  # how long a test waits for a cancel that must come (it comes within ~1 s)


def test_calls_that_end_in_time_leave_nothing_behind():
    dog = Watchdog()
    cancelled = []
    for _ in range(2000):
        entry = dog.arm(time.monotonic() + 60, lambda: cancelled.append(1))
        assert dog.disarm(entry) is False
    assert len(dog._heap) == 0 and not cancelled
    # calls ending out of order: the ended ones below a running call go once it ends
    first = dog.arm(time.monotonic() + 60, lambda: None)
    later = [dog.arm(time.monotonic() + 61, lambda: None) for _ in range(50)]
    for entry in later:
        dog.disarm(entry)
    assert len(dog._heap) == 51
    dog.disarm(first)
    assert len(dog._heap) == 0


def test_a_call_past_its_deadline_is_stopped():
    dog = Watchdog()
    stopped = threading.Event()
    entry = dog.arm(time.monotonic() - GRACE_S, stopped.set)
    assert stopped.wait(WAIT_S)
    assert dog.disarm(entry) is True


def test_an_earlier_deadline_wakes_the_sleeping_thread():
    dog = Watchdog()
    far = dog.arm(time.monotonic() + 3600, lambda: None)  # the thread sleeps towards this
    time.sleep(0.05)  # let it go to sleep (not a measurement: the test passes either way)
    stopped = threading.Event()
    near = dog.arm(time.monotonic(), stopped.set)
    assert stopped.wait(WAIT_S)
    assert dog.disarm(near) is True and dog.disarm(far) is False


def test_a_call_armed_after_the_awaited_entry_was_dropped_is_stopped():
    dog = Watchdog()
    first = dog.arm(time.monotonic() + 0.3, lambda: None)
    time.sleep(0.05)  # the thread sleeps towards first's deadline
    assert dog.disarm(first) is False  # dropped from the heap; the thread still sleeps towards it
    stopped = threading.Event()
    second = dog.arm(time.monotonic() + 0.4, stopped.set)  # later than that: no notify
    assert stopped.wait(WAIT_S)
    assert dog.disarm(second) is True


def test_many_calls_in_flight_each_stopped_once():
    dog = Watchdog()
    counts = [0] * 20
    done = threading.Event()
    lock = threading.Lock()

    def cancel(i):
        with lock:
            counts[i] += 1
            if all(counts):
                done.set()

    entries = [dog.arm(time.monotonic() + 0.01 * i, lambda i=i: cancel(i)) for i in range(20)]
    ended = [dog.arm(time.monotonic() + 0.01 * i, lambda: counts.append(-1)) for i in range(20)]
    for entry in ended:
        dog.disarm(entry)
    assert done.wait(WAIT_S)
    assert all(dog.disarm(e) for e in entries)
    assert counts[:20] == [1] * 20 and -1 not in counts
