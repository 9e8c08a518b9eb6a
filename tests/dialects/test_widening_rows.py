"""A result whose rows widen after its first batch cannot bring more than a bounded batch into the
client (issue 46, case 4's many-row form), with the text filter on and off.

The executor sizes a later batch from the width of the rows seen so far, so 16 narrow rows
followed by wide ones asked for thousands of wide rows at once: with ``max_bytes`` at 4 MiB,
16 one-byte rows and then 1 MB rows grew the client by 2.3 GB on PostgreSQL (one ``FETCH``
arrives whole) and 1.1 GB on MariaDB (the batch was read before it was measured). Now
PostgreSQL's rows are each at most a 16th of ``max_bytes`` (at least 64 KiB) and a later
``FETCH`` asks for at most 256 of them (``BatchBound``), and MariaDB stops reading a batch once
its strings pass ``max_bytes``. Each probe runs in a child process, whose peak RSS is its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sqlrl.db import ErrorKind, Limits, open_session
from tests.conftest import agent_database

NAME = f"sqlrl_widening_{os.getpid()}"
MAX_BYTES = 1024 * 1024  # PostgreSQL: rows of at most 64 KiB of text, FETCHes of at most 16 MiB
ROWS = 3000
WIDTH = 60_000  # under PostgreSQL's row bound: every row is allowed, only their number is not
WIDENING = {  # 16 one-byte rows, then rows of WIDTH bytes (~180 MB in all)
    "postgresql": f"SELECT CASE WHEN g <= 16 THEN 'x' ELSE repeat('x', {WIDTH}) END "
                  f"FROM generate_series(1, {ROWS}) g",
    "mysql": f"SELECT CASE WHEN seq <= 16 THEN 'x' ELSE REPEAT('x', {WIDTH}) END "
             f"FROM seq_1_to_{ROWS}",
}
# what a call may hold: PostgreSQL one FETCH of 256 rows (~15 MB of text, decoded twice over),
# MariaDB the cap and one row; before the fix both grew by ~0.35 GB here
GROWTH_LIMIT_KIB = {"postgresql": 64 * 1024, "mysql": 24 * 1024}

_PROBE = textwrap.dedent("""
    import json, resource, sys
    from sqlrl.db import Limits, open_session
    from sqlrl.db.sessions.executor import set_text_filter
    url, sql, max_bytes, filter_on = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "on"
    set_text_filter(filter_on)
    with open_session(url, limits=Limits(timeout_s=20.0, max_bytes=max_bytes)) as s:
        s.execute("SELECT 1")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = s.execute(sql)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        again = s.execute("SELECT 2")
    print(json.dumps({"growth_kib": after - before, "rows": r.row_count, "truncated": r.truncated,
                      "widths": sorted({len(row[0]) for row in r.rows}),
                      "error": str(r.error) if r.error else None, "usable": again.rows == ((2,),)}))
""")


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


@pytest.mark.parametrize("text_filter", ["on", "off"])
def test_rows_that_widen_after_the_first_batch_keep_client_memory_bounded(engine, text_filter):
    dialect, url = engine
    out = subprocess.run([sys.executable, "-c", _PROBE, url, WIDENING[dialect], str(MAX_BYTES),
                          text_filter], capture_output=True, text=True, timeout=300, check=True)
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    # the rows that fit the cap, in order: the 16 narrow ones, then wide ones up to MAX_BYTES
    assert probe["error"] is None and probe["truncated"] and probe["usable"], probe
    assert probe["widths"] == [1, WIDTH] and 16 < probe["rows"] <= 16 + MAX_BYTES // WIDTH, probe
    assert probe["growth_kib"] < GROWTH_LIMIT_KIB[dialect], probe


@pytest.mark.postgres
def test_a_row_over_the_row_bound_is_refused_whole(pg_url):
    """PostgreSQL: a row wider than its bound (a 16th of max_bytes, at least 64 KiB) is an error
    that names both limits, before it is sent; a row at the bound comes back."""
    with open_session(pg_url, limits=Limits(max_bytes=MAX_BYTES, timeout_s=20)) as s:
        wide = s.execute("SELECT repeat('x', 70000)")
        assert wide.error is not None and wide.error.kind is ErrorKind.RUNTIME, wide
        assert "more than the byte limit on one row (65,536 bytes" in wide.error.message, wide
        assert "1,048,576" in wide.error.message, wide
        fits = s.execute("SELECT repeat('x', 65000)")  # its text: 65,000 bytes (no quoting)
        assert fits.ok and len(fits.rows[0][0]) == 65000, fits
