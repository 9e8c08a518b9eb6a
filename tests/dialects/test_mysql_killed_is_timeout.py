"""MariaDB ends ``DO SLEEP(n)`` and ``BENCHMARK(…)`` stopped by ``max_statement_time`` as a
*success* (SLEEP's value 1, BENCHMARK's 0, often with no warning at all). Sessions report every
statement the server's timer stopped as a ``timeout`` error — read from the server's own
``Max_statement_time_exceeded`` counter, not from the SQL text — and nothing else as one."""

from __future__ import annotations

import os
import time

import pytest

from tests.conftest import agent_database

from sqlrl.db import ErrorKind, Limits, PoolConfig, SessionPool, open_session

pytestmark = pytest.mark.mysql

NAME = f"sqlrl_sleep_{os.getpid()}"
TIMEOUT_S = 0.5
STOPPED = [
    "DO SLEEP(100)", "SELECT SLEEP(100)", "SELECT BENCHMARK(1000000000, MD5('x'))",
    "DO BENCHMARK(1000000000, MD5('x'))", "SET @a = BENCHMARK(1000000000, MD5('x'))",
    "SELECT 1 FROM DUAL WHERE BENCHMARK(1000000000, MD5('x')) = 0",
    "SELECT b FROM (SELECT BENCHMARK(1000000000, MD5('x')) AS b) t",
]


@pytest.fixture(scope="module")
def url(mysql_admin_url):
    yield from agent_database(mysql_admin_url, NAME)


def _timed(session, sql):
    t0 = time.monotonic()
    result = session.execute(sql)
    return result, time.monotonic() - t0


@pytest.mark.parametrize("sql", STOPPED)
def test_a_statement_stopped_by_the_timer_is_a_timeout(url, sql):
    with open_session(url, limits=Limits(timeout_s=TIMEOUT_S)) as s:
        result, elapsed = _timed(s, sql)
        assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT, (sql, result)
        assert result.rows == () and elapsed < 30  # (100 s of work: only a guard against hanging)
        ok, _ = _timed(s, "SELECT 1")  # the session is usable and not mistaken afterwards
        assert ok.error is None and ok.rows == ((1,),)


def test_statements_that_end_in_time_are_not_timeouts(url):
    with open_session(url, limits=Limits(timeout_s=TIMEOUT_S)) as s:
        assert s.execute("DO SLEEP(100)").error.kind is ErrorKind.TIMEOUT
        for sql, rows in (("SELECT SLEEP(0.2)", ((0,),)), ("DO SLEEP(0.2)", ()),
                          ("SELECT BENCHMARK(1000, MD5('x'))", ((0,),))):
            result = s.execute(sql)
            assert result.error is None and result.rows == rows, (sql, result)
        r = s.execute("SELECT 1; DO SLEEP(100); SELECT 2")  # stops there, says where
        assert r.error.kind is ErrorKind.TIMEOUT and r.error.statement_index == 1


def test_pooled_sessions_count_timeouts_per_session(url):
    """Every session's counter starts at zero (each has its own connection)."""
    with SessionPool(PoolConfig(max_size=1, limits=Limits(timeout_s=TIMEOUT_S))) as pool:
        for _ in range(3):
            with pool.session(url) as s:
                result = s.execute("SELECT BENCHMARK(1000000000, MD5('x'))")
                assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
                assert s.execute("SELECT SLEEP(0.2)").rows == ((0,),)
        assert pool.stats().connects == 3  # one connection (and clone) per session
