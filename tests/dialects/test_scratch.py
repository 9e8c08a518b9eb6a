"""sqlrl.db.provisioning.scratch on the real servers: clones prepared ahead, bounded, forgotten, and never leaked.

Behaviour, not time: a take served from the ready queue is counted as a ``ready_hit`` (no clone on
the lease path); the ready queue never exceeds its bounds; a process killed with clones in hand
leaves orphans that the next sweep drops (their liveness locks died with it); a process that exits
drops its ready clones.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from sqlrl.db import open_session
from sqlrl.db.provisioning import provision
from sqlrl.db.provisioning.scratch import SCRATCH
from tests.conftest import scratch_names

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["postgresql", "mysql"])
def bases(request, pg_admin_url, mysql_admin_url):
    """Three small sealed bases on one server: (admin URL, [session URLs])."""
    admin = pg_admin_url if request.param == "postgresql" else mysql_admin_url
    names = [f"sqlrl_sc_{uuid.uuid4().hex[:6]}_{i}" for i in range(3)]
    provision.prepare_server(admin)  # a fresh server has no owner role yet (any test order)
    for name in names:
        provision.create_database(admin, name, replace=True)
        provision.seal_database(admin, name)
    yield admin, [provision.session_url(admin, name) for name in names]
    for name in names:
        provision.drop_database(admin, name)


@pytest.fixture
def small_queue():
    previous = (SCRATCH.prefill, SCRATCH.max_ready)
    SCRATCH.configure(prefill=2, max_ready=3)
    yield
    SCRATCH.configure(*previous)


def test_clones_are_prepared_ahead_once_a_base_is_reused(bases, small_queue):
    admin, urls = bases
    url = urls[0]
    baseline = scratch_names(admin)  # other processes' clones, if any
    open_session(url).close()
    assert SCRATCH.settle()
    assert not (scratch_names(admin) - baseline - SCRATCH.held_names())  # dropped after close
    ready_before = SCRATCH.stats().ready
    open_session(url).close()  # the second take of this base: clones ahead from now on
    assert SCRATCH.settle()
    assert SCRATCH.stats().ready == ready_before + 2
    before = SCRATCH.stats()
    with open_session(url) as s:  # served from the ready queue: no clone on the lease path
        assert s.execute("SELECT 1").rows == ((1,),)
    after = SCRATCH.stats()
    assert after.ready_hits == before.ready_hits + 1 and after.misses == before.misses
    assert SCRATCH.settle() and SCRATCH.stats().ready == ready_before + 2  # refilled


def test_the_ready_queue_is_bounded_and_forgotten_with_its_base(bases, small_queue):
    admin, urls = bases
    for url in urls:  # three bases, each taken twice: they compete for max_ready = 3
        for _ in range(2):
            open_session(url).close()
        assert SCRATCH.settle()
        assert SCRATCH.stats().ready <= 3
    held = SCRATCH.held_names()
    assert len(held) == SCRATCH.stats().ready <= 3  # the oldest base's clones were given up
    assert held <= scratch_names(admin)
    from sqlrl.db.url import parse_url
    for url in urls:
        SCRATCH.forget(url, parse_url(url).database)
    assert SCRATCH.settle()
    assert not (SCRATCH.held_names() & held)
    assert not (held & scratch_names(admin))  # dropped on the server too


CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from sqlrl.db import open_session
    from sqlrl.db.provisioning.scratch import SCRATCH
    url = {url!r}
    open_session(url).close(); open_session(url).close()   # clones ahead
    held = open_session(url)                               # and one in use
    SCRATCH.settle()
    print(" ".join(sorted(SCRATCH.held_names())), flush=True)
    if {exit_normally}:
        held.close()
        sys.exit(0)
    time.sleep(600)                                        # killed here
""")


def _child(url: str, exit_normally: bool) -> tuple[subprocess.Popen, set[str]]:
    code = CHILD.format(root=str(ROOT), url=url, exit_normally=exit_normally)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    names = set(proc.stdout.readline().split())
    return proc, names


def test_a_killed_process_leaves_orphans_that_a_sweep_drops(bases):
    admin, urls = bases
    proc, names = _child(urls[0], exit_normally=False)
    try:
        assert len(names) >= 2 and names <= scratch_names(admin)
        SCRATCH.sweep(admin)
        assert names <= scratch_names(admin)  # alive: its liveness locks protect its clones
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # the locks died with the process (its admin connection closed): a sweep drops its clones
    for _ in range(100):  # the server notices the closed connection asynchronously
        SCRATCH.sweep(admin)
        if not (names & scratch_names(admin)):
            break
        time.sleep(0.1)
    assert not (names & scratch_names(admin))


def test_a_process_that_exits_drops_its_clones(bases):
    admin, urls = bases
    proc, names = _child(urls[1], exit_normally=True)
    assert proc.wait(timeout=120) == 0
    assert names and not (names & scratch_names(admin))
