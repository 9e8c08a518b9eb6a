"""Per-call deadlines and byte-bounded fetching on the real servers (issue 13, part B).

``Limits.timeout_s`` bounds the whole ``execute`` call — every statement and every fetch — and is
enforced by the server's own timers (set to the time left of the call) and by the process's
watchdog, which stops the statement from outside the session (PostgreSQL cancel request, MariaDB
``KILL QUERY``) whatever the session SET. Each case asserts the call ends within the timeout plus
``SLACK_S`` (a bound far below the statements' own run time), that it is a ``timeout`` error (or
a truncated result for the caps), and that the session is usable afterwards. Rows that widen
after a narrow first batch keep the client's memory bounded (the last part, issue 46)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import agent_database

from sqlrl.db import ErrorKind, Limits, open_session
from sqlrl.db.sessions import executor
from sqlrl.db.dialects import base as dialect_base
from sqlrl.db.dialects import mysql as my_adapter
from sqlrl.db.dialects import postgresql as pg_adapter

TIMEOUT_S = 1.5
# The guarantee is timeout + 1 s, but a test asserts behaviour, not this machine's speed: the
# timed-out statements below would run 30 s or more unstopped, so the bound only has to tell
# "stopped at the deadline" from that, which no machine load blurs (the error kind, the statement
# index and truncation say how a call ended).
SLACK_S = 10.0
NAME = f"sqlrl_deadline_{os.getpid()}"


@pytest.fixture(scope="module")
def pg_url(pg_admin_url):
    yield from agent_database(pg_admin_url, NAME)


@pytest.fixture(scope="module")
def my_url(mysql_admin_url):
    yield from agent_database(mysql_admin_url, NAME)


@pytest.fixture(params=["postgresql", "mysql"])
def engine(request):
    if request.param == "postgresql":
        request.applymarker(pytest.mark.postgres)
        return "postgresql", request.getfixturevalue("pg_url")
    request.applymarker(pytest.mark.mysql)
    return "mysql", request.getfixturevalue("my_url")


def _timed(session, sql):
    t0 = time.monotonic()
    result = session.execute(sql)
    return result, time.monotonic() - t0


def _assert_timeout(session, sql, timeout_s=TIMEOUT_S):
    result, elapsed = _timed(session, sql)
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT, (sql, result)
    assert result.rows == ()
    assert elapsed < timeout_s + SLACK_S, (sql, elapsed)
    _assert_usable(session)
    return elapsed


def _assert_usable(session):
    ok = session.execute("SELECT 1")
    assert ok.error is None and ok.rows == ((1,),), ok


SLOW_ROWS = {
    "postgresql": "SELECT g, CASE WHEN g > 100 THEN pg_sleep(0.05) END FROM generate_series(1, 1000) g",
    "mysql": "SELECT seq, IF(seq > 100, SLEEP(0.05), 0) FROM seq_1_to_1000",
}
HUGE_LIMIT = {
    "postgresql": "SELECT a FROM generate_series(1, 100000) a, generate_series(1, 100000) b "
                  "LIMIT 1000000000",
    "mysql": "SELECT seq FROM seq_1_to_1000000000 LIMIT 1000000000",
}
SLOW_HUGE_LIMIT = {
    "postgresql": "SELECT g, pg_sleep(0.01) FROM generate_series(1, 100000) g LIMIT 1000000000",
    "mysql": "SELECT seq, SLEEP(0.01) FROM seq_1_to_100000 LIMIT 1000000000",
}
SLEEP = {"postgresql": "SELECT pg_sleep(30)", "mysql": "SELECT SLEEP(30)"}
# rows as wide as a row may be (PostgreSQL: a 16th of max_bytes of text, postgresql_wrap.row_bytes)
WIDE_ROW = {"postgresql": 250_000, "mysql": 1_000_000}
WIDE = {
    "postgresql": f"SELECT repeat('x', {WIDE_ROW['postgresql']}) FROM generate_series(1, 600)",
    "mysql": f"SELECT REPEAT('x', {WIDE_ROW['mysql']}) FROM seq_1_to_600",
}


def test_slow_rows_after_a_fast_first_batch_are_one_deadline(engine):
    dialect, url = engine
    with open_session(url, limits=Limits(timeout_s=TIMEOUT_S)) as s:
        _assert_timeout(s, SLOW_ROWS[dialect])


def test_later_statements_of_a_call_share_its_deadline(engine):
    dialect, url = engine
    half = {"postgresql": "SELECT pg_sleep(1.0)", "mysql": "SELECT SLEEP(1.0)"}[dialect]
    with open_session(url, limits=Limits(timeout_s=TIMEOUT_S)) as s:
        result, elapsed = _timed(s, f"{half}; {half}; {half}")
        assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT, result
        assert result.error.statement_index == 1
        assert elapsed < TIMEOUT_S + SLACK_S
        _assert_usable(s)


def test_huge_own_limit_is_truncated_at_the_row_cap_promptly(engine):
    dialect, url = engine
    with open_session(url, limits=Limits(timeout_s=2.0, max_rows=100)) as s:
        result, elapsed = _timed(s, HUGE_LIMIT[dialect])
        assert result.error is None and result.truncated and result.row_count == 100, result
        # no error: the 2 s timeout never fired, so the rows were not drained (it took 4.5-5 s)
        assert elapsed < 2.0 + SLACK_S, elapsed
        _assert_usable(s)


def test_slow_huge_own_limit_ends_at_the_deadline(engine):
    dialect, url = engine
    with open_session(url, limits=Limits(timeout_s=TIMEOUT_S)) as s:
        _assert_timeout(s, SLOW_HUGE_LIMIT[dialect])


def test_wide_rows_stop_at_the_byte_cap(engine):
    dialect, url = engine
    with open_session(url, limits=Limits(timeout_s=10.0, max_bytes=4 * 1024 * 1024)) as s:
        result, elapsed = _timed(s, WIDE[dialect])
        fits = 4 * 1024 * 1024 // WIDE_ROW[dialect]
        assert result.error is None and result.truncated and 1 <= result.row_count <= fits, result
        assert elapsed < 10.0, elapsed  # no error: ended before its timeout
        _assert_usable(s)


_MEMORY_PROBE = textwrap.dedent("""
    import json, resource, sys, time
    from sqlrl.db import Limits, open_session
    from sqlrl.db.sessions.executor import set_text_filter
    url, sql, max_bytes, filter_on = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "on"
    set_text_filter(filter_on)
    with open_session(url, limits=Limits(timeout_s=10.0, max_bytes=max_bytes)) as s:
        s.execute("SELECT 1")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.monotonic()
        r = s.execute(sql)
        elapsed = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        again = s.execute("SELECT 2")
    print(json.dumps({"growth_kib": after - before, "elapsed": elapsed, "rows": r.row_count,
                      "truncated": r.truncated, "widths": sorted({len(row[0]) for row in r.rows}),
                      "error": str(r.error) if r.error else None, "usable": again.rows == ((2,),)}))
""")


def memory_probe(url: str, sql: str, max_bytes: int, text_filter: str = "on") -> dict:
    """``sql`` run in a child process (its peak RSS is its own): what the call grew it by."""
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, url, sql, str(max_bytes),
                          text_filter], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_wide_rows_keep_client_memory_within_a_small_multiple_of_max_bytes(engine):
    dialect, url = engine
    probe = memory_probe(url, WIDE[dialect], 4 * 1024 * 1024)
    assert probe["error"] is None and probe["truncated"] and probe["usable"], probe
    assert probe["growth_kib"] < 64 * 1024, probe  # 16 x max_bytes; 1,000 rows were ~1.4 GB
    assert probe["elapsed"] < 10.0, probe  # before its 10 s timeout (error None says so too)


SET_FROM_INSIDE = {
    "postgresql": ["DO $$BEGIN PERFORM set_config('statement' || '_timeout', '0', false); END$$; "
                   "SELECT pg_sleep(30)",
                   "SELECT set_config('statement' || '_timeout', '0', false); SELECT pg_sleep(30)"],
    "mysql": ["SET max_statement_time = 0; SELECT SLEEP(30)",
              "SET @@max_statement_time = 0; DO SLEEP(30)"],
}


def test_setting_the_timeout_from_inside_does_not_lift_it(engine):
    dialect, url = engine
    with open_session(url, limits=Limits(timeout_s=TIMEOUT_S)) as s:
        for sql in SET_FROM_INSIDE[dialect]:
            result, elapsed = _timed(s, sql)
            assert result.error is not None, (sql, result)
            assert result.error.kind in (ErrorKind.TIMEOUT, ErrorKind.PERMISSION), (sql, result)
            assert elapsed < TIMEOUT_S + SLACK_S
            _assert_usable(s)
            _assert_timeout(s, SLEEP[dialect])  # and a later call is bounded too


@pytest.fixture
def filter_off(monkeypatch):
    """The keyword sandbox switched off: only the server and the watchdog bound the call."""
    monkeypatch.setattr(executor, "common_denial", lambda statement: None)
    monkeypatch.setattr(pg_adapter.PostgreSQLDialect, "denied", lambda self, statement: None)
    monkeypatch.setattr(my_adapter.MySQLDialect, "denied", lambda self, statement: None)


def test_the_watchdog_stops_a_statement_whatever_the_session_set(engine, filter_off, monkeypatch):
    """With the filter off and sqlrl's own re-arming of the server timers switched off too, a
    session that turned its server timeout off is still stopped at the deadline: by the
    watchdog alone, and reported as a timeout."""
    dialect, url = engine
    monkeypatch.setattr(pg_adapter, "_RESET_LIMITS", "")
    monkeypatch.setattr(pg_adapter, "_FULL_BUDGET_MARGIN_MS", 10 ** 9)
    off = {"postgresql": "SET statement_timeout = 0; SET lock_timeout = 0",
           "mysql": "SET max_statement_time = 0"}[dialect]
    with open_session(url, limits=Limits(timeout_s=TIMEOUT_S)) as s:
        r = s.execute(off)
        assert r.error is None, r
        for sql in (SLEEP[dialect], SLOW_ROWS[dialect]) + (
                ("DO SLEEP(30)",) if dialect == "mysql" else ()):
            elapsed = _assert_timeout(s, sql)
            assert elapsed >= TIMEOUT_S - 0.05
            s.execute(off)  # (the usability check's own call may have re-armed nothing; again)


def test_filter_off_set_and_sleep_in_one_call(engine, filter_off):
    dialect, url = engine
    sql = {"postgresql": "SET statement_timeout = 0; SELECT pg_sleep(30)",
           "mysql": "SET max_statement_time = 0; SELECT SLEEP(30)"}[dialect]
    with open_session(url, limits=Limits(timeout_s=TIMEOUT_S)) as s:
        _assert_timeout(s, sql)
        _assert_timeout(s, SLEEP[dialect])


# --- rows that widen after the first batch (issue 46, case 4's many-row form) -------------------
# The executor sizes a later batch from the width of the rows seen so far, so 16 narrow rows
# followed by wide ones asked for thousands of wide rows at once: with max_bytes at 4 MiB, 16
# one-byte rows and then 1 MB rows grew the client by 2.3 GB on PostgreSQL (one FETCH arrives
# whole) and 1.1 GB on MariaDB (the batch was read before it was measured). Now PostgreSQL's rows
# are each at most a 16th of max_bytes (at least 64 KiB) and a later FETCH asks for at most 256 of
# them (BatchBound), and MariaDB stops reading a batch once its strings pass max_bytes. Each probe
# runs in a child process (memory_probe); the text filter on and off.

# PostgreSQL: rows of at most 64 KiB of text, FETCHes of at most 16 MiB
WIDEN_MAX_BYTES = 1024 * 1024
WIDEN_ROWS = 3000
WIDEN_WIDTH = 60_000  # under PostgreSQL's row bound: each row is allowed, only their number is not
WIDENING = {  # 16 one-byte rows, then rows of WIDEN_WIDTH bytes (~180 MB in all)
    "postgresql": f"SELECT CASE WHEN g <= 16 THEN 'x' ELSE repeat('x', {WIDEN_WIDTH}) END "
                  f"FROM generate_series(1, {WIDEN_ROWS}) g",
    "mysql": f"SELECT CASE WHEN seq <= 16 THEN 'x' ELSE REPEAT('x', {WIDEN_WIDTH}) END "
             f"FROM seq_1_to_{WIDEN_ROWS}",
}
# what a call may hold: PostgreSQL one FETCH of 256 rows (~15 MB of text, decoded twice over),
# MariaDB the cap and one row; before the fix both grew by ~0.35 GB here
GROWTH_LIMIT_KIB = {"postgresql": 64 * 1024, "mysql": 24 * 1024}

@pytest.mark.parametrize("text_filter", ["on", "off"])
def test_rows_that_widen_after_the_first_batch_keep_client_memory_bounded(engine, text_filter):
    dialect, url = engine
    probe = memory_probe(url, WIDENING[dialect], WIDEN_MAX_BYTES, text_filter)
    # the rows that fit the cap, in order: the 16 narrow ones, then wide ones up to WIDEN_MAX_BYTES
    assert probe["error"] is None and probe["truncated"] and probe["usable"], probe
    assert probe["widths"] == [1, WIDEN_WIDTH], probe
    assert 16 < probe["rows"] <= 16 + WIDEN_MAX_BYTES // WIDEN_WIDTH, probe
    assert probe["growth_kib"] < GROWTH_LIMIT_KIB[dialect], probe


@pytest.mark.postgres
def test_a_row_over_the_row_bound_is_refused_whole(pg_url):
    """PostgreSQL: a row wider than its bound (a 16th of max_bytes, at least 64 KiB) is an error
    that names both limits, before it is sent; a row at the bound comes back."""
    with open_session(pg_url, limits=Limits(max_bytes=WIDEN_MAX_BYTES, timeout_s=20)) as s:
        wide = s.execute("SELECT repeat('x', 70000)")
        assert wide.error is not None and wide.error.kind is ErrorKind.RUNTIME, wide
        assert "more than the byte limit on one row (65,536 bytes" in wide.error.message, wide
        assert "1,048,576" in wide.error.message, wide
        fits = s.execute("SELECT repeat('x', 65000)")  # its text: 65,000 bytes (no quoting)
        assert fits.ok and len(fits.rows[0][0]) == 65000, fits
