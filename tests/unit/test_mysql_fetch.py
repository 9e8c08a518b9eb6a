"""MariaDB's unbuffered ``Result`` (``sqlrl.db.dialects.mysql_fetch``) with a fake cursor (no
server): rows are read one at a time, a batch stops being read once its strings and blobs pass
the byte cap (the executor then truncates there), and only at the end of the result is
``finished`` called."""

from __future__ import annotations

from pymysql.constants import FIELD_TYPE

from sqlrl.db import Limits
from sqlrl.db.dialects.mysql_fetch import Result
from sqlrl.db.sessions import executor


class _SSCursor:
    """What ``Result`` uses of pymysql's ``SSCursor``: ``description`` and ``read_next``."""

    def __init__(self, rows, types) -> None:
        self.description = tuple((f"c{i}", t, None, None, None, None, True)
                                 for i, t in enumerate(types))
        self.rowcount = -1
        self._rows, self.read = list(rows), 0

    def read_next(self):
        if self.read == len(self._rows):
            return None
        self.read += 1
        return self._rows[self.read - 1]

    def close(self) -> None:
        pass


def _result(rows, types, max_bytes):
    ended: list[bool] = []
    cur = _SSCursor(rows, types)
    return Result(cur, lambda exc: exc, lambda: ended.append(True), max_bytes), cur, ended


def test_a_batch_stops_being_read_past_the_byte_cap():
    rows = [(i, "x") for i in range(16)] + [(i, "y" * 60_000) for i in range(16, 3000)]
    result, cur, ended = _result(rows, [FIELD_TYPE.LONG, FIELD_TYPE.VAR_STRING], 1_000_000)
    assert len(result.fetchmany(16)) == 16
    batch = result.fetchmany(2984)
    # one row past the cap, not the 2,984 asked for; nothing more was read off the wire
    assert len(batch) == 1_000_000 // 60_000 + 1 and cur.read == 16 + len(batch)
    assert not ended  # not the end of the result: the executor truncates and abandons it


def test_numbers_and_dates_do_not_count_and_the_end_is_reported():
    rows = [(i, 1.5) for i in range(50)]
    result, cur, ended = _result(rows, [FIELD_TYPE.LONGLONG, FIELD_TYPE.DOUBLE], 10)
    assert len(result.fetchmany(100)) == 50 and ended == [True]


def test_without_a_cap_a_batch_is_what_was_asked_for():
    rows = [("z" * 1000,)] * 40
    result, _, ended = _result(rows, [FIELD_TYPE.BLOB], 0)
    assert len(result.fetchmany(30)) == 30 and not ended
    assert len(result.fetchmany(30)) == 10 and ended == [True]


def test_the_executor_truncates_where_the_result_stopped_reading():
    rows = [(i, "x") for i in range(16)] + [(i, "y" * 60_000) for i in range(16, 3000)]

    class _Adapter:
        name, sqlglot_dialect, isolation = "fake", "mysql", "none"

        def connect(self, url, limits): return None
        def begin(self, conn, url): return None
        def end(self, conn, state): return False
        def ping(self, conn): return True
        def close(self, conn): pass
        def classify(self, exc): raise AssertionError(exc)
        def denied(self, statement): return None

        def run(self, conn, state, statement, deadline):
            self.result, self.cur, _ = _result(rows, [FIELD_TYPE.LONG, FIELD_TYPE.STRING], 1_000_000)
            return self.result

    adapter = _Adapter()
    r = executor.run_call(adapter, None, None, "SELECT 1", Limits(max_bytes=1_000_000))
    assert r.ok and r.truncated and r.row_count == 16 + 1_000_000 // 60_010, r.row_count
    assert adapter.cur.read < 40  # read row by row: the wide rows past the cap stayed unread


def test_a_column_of_a_type_not_known_to_be_bounded_is_measured():
    rows = [("x" * 600_000,)] * 10
    result, cur, ended = _result(rows, [200], 1_000_000)  # a type code pymysql does not name
    assert len(result.fetchmany(10)) == 2 and cur.read == 2 and not ended
