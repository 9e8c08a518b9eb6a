"""MariaDB/MySQL: reading a statement's unbuffered result and stopping it from outside.

- ``Result``: the statement's ``SSCursor`` with driver errors cleaned; an error packet (a kill, the
  statement timer) ends the result so the connection stays usable. Rows are read one at a time
  (as the unbuffered protocol sends them) and a batch stops being read once the lengths of its
  values of unbounded types (all but numbers and dates) pass the session's byte cap: the executor truncates the result there (a batch over the
  cap ends it), so a result whose rows widen after its first batch brings at most the cap plus
  one row (``max_allowed_packet``) into the client, not the batch the narrow rows asked for.
- ``stopped_by_timeout``: whether the server's timer stopped a statement that reported success.
- ``kill_query`` / ``abandon_unbuffered``: ``KILL QUERY`` from a second connection (the watchdog's
  canceller, and the executor's way to stop a capped result instead of draining it).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pymysql
from pymysql.constants import FIELD_TYPE

from ..url import parse_url

TIMEOUT_CHECK_MARGIN_S = 0.005  # statements ending this close to their deadline are checked
# numbers and dates: a value of these types has a bounded size; every other column (strings,
# blobs, JSON, bits, geometry, and any type this list does not know) is measured
_BOUNDED_TYPES = frozenset({FIELD_TYPE.DECIMAL, FIELD_TYPE.TINY, FIELD_TYPE.SHORT, FIELD_TYPE.LONG,
                            FIELD_TYPE.FLOAT, FIELD_TYPE.DOUBLE, FIELD_TYPE.NULL,
                            FIELD_TYPE.TIMESTAMP, FIELD_TYPE.LONGLONG, FIELD_TYPE.INT24,
                            FIELD_TYPE.DATE, FIELD_TYPE.TIME, FIELD_TYPE.DATETIME,
                            FIELD_TYPE.YEAR, FIELD_TYPE.NEWDATE, FIELD_TYPE.NEWDECIMAL})


class Result:
    """The statement's unbuffered cursor, with driver errors raised while fetching cleaned too;
    when the last row has been read, ``finished`` says whether the server stopped the statement."""

    def __init__(self, cur: Any, clean: Any, finished: Any, max_bytes: int = 0) -> None:
        self._cur, self._clean, self._finished = cur, clean, finished
        self._max_bytes = max_bytes  # 0: no cap (read what is asked for)
        self.description = cur.description
        self.rowcount = cur.rowcount
        # the columns whose values can be long: all but numbers and dates
        self._long = tuple(i for i, d in enumerate(cur.description or ())
                           if d[1] not in _BOUNDED_TYPES)

    def fetchmany(self, size: int) -> Any:
        """Up to ``size`` rows; fewer only at the end of the result, or when the lengths of the
        rows' values of unbounded types pass the byte cap (a lower bound of what the executor
        measures, so it truncates the result at that batch)."""
        rows: list = []
        append, read = rows.append, self._cur.read_next
        cap, seen = self._max_bytes, 0
        long = self._long if cap else ()  # nothing to measure: every row is read as asked
        try:
            for _ in range(size):
                row = read()
                if row is None:  # the whole result is read
                    self._finished()
                    break
                append(row)
                if long:
                    for i in long:
                        value = row[i]
                        if value is not None:
                            try:
                                seen += len(value)
                            except TypeError:  # a value without a length (a number): bounded
                                pass
                    if seen > cap:
                        break
        except pymysql.Error as exc:
            result = getattr(self._cur, "_result", None)
            if result is not None:  # an error packet (a kill, the timer) ended the result
                result.unbuffered_active = False
            raise self._clean(exc) from exc
        return rows

    def close(self) -> None:
        self._cur.close()


def stopped_by_timeout(conn: Any, deadline: float) -> bool:
    """Whether the server's statement timer stopped the statement that just ended. Only asked
    (one round trip) when the statement ran to its deadline: MariaDB ends ``DO SLEEP(n)`` and
    ``BENCHMARK(…)`` stopped by ``max_statement_time`` as a *success* (SLEEP's value 1, BENCHMARK's
    0), but counts every firing of the timer in the session status ``Max_statement_time_exceeded``
    (MySQL: ``Max_execution_time_exceeded``, unverified)."""
    if time.monotonic() < deadline - TIMEOUT_CHECK_MARGIN_S or not conn.alive:
        return False
    name = "Max_statement_time_exceeded" if conn.mariadb else "Max_execution_time_exceeded"
    try:
        with conn.cursor() as cur:
            cur.execute(f"SHOW SESSION STATUS LIKE '{name}'")
            row = cur.fetchone()
    except pymysql.Error:
        return False
    count = int(row[1]) if row else 0
    stopped, conn.timeouts_seen = count > conn.timeouts_seen, count
    return stopped


# --- MariaDB/MySQL: KILL QUERY from a second connection ------------------------------------------

_ADMIN_URLS: dict[tuple[str, int], Any] = {}


def register_admin_url(url: Any) -> None:
    """Use ``url`` (an admin account of a MariaDB/MySQL server) to kill statements on that server."""
    parsed = parse_url(str(url)) if isinstance(url, str) else url
    _ADMIN_URLS[(parsed.host or "127.0.0.1", int(parsed.port or 3306))] = parsed


class KillerConnections:
    """One lazily opened connection per (server, account) that sends ``KILL QUERY``."""

    def __init__(self) -> None:
        self._conns: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()

    def kill_query(self, kw: dict[str, Any], thread_id: int) -> bool:
        server = (kw.get("host"), int(kw.get("port") or 3306))
        if server not in _ADMIN_URLS:
            env = os.environ.get("SQLRL_MYSQL_ADMIN_URL")
            if env:
                try:
                    register_admin_url(env)
                except Exception:
                    pass
        admin = _ADMIN_URLS.get(server)
        if admin is not None:
            ckw = dict(kw, user=admin.username, password=admin.password or "", database=None)
        else:
            ckw = dict(kw, database=None)
        ckw["read_timeout"] = ckw["write_timeout"] = 5
        key = (server, ckw.get("user"))
        with self._lock:
            for attempt in (0, 1):
                conn = self._conns.get(key)
                try:
                    if conn is None:
                        conn = self._conns[key] = pymysql.connect(**ckw)
                    with conn.cursor() as cur:
                        cur.execute(f"KILL QUERY {int(thread_id)}")
                    return True
                except pymysql.Error as exc:
                    self._conns.pop(key, None)
                    try:
                        if conn is not None:
                            conn.close()
                    except Exception:
                        pass
                    if exc.args and exc.args[0] == 1094:  # unknown thread: already gone
                        return False
        return False


KILLERS = KillerConnections()


def kill_query(conn: Any) -> bool:
    """``KILL QUERY`` the statement running on the pymysql connection ``conn``."""
    return KILLERS.kill_query(conn.connect_kw, conn.server_thread_id[0])


def abandon_unbuffered(conn: Any, cursor: Any) -> None:
    """Stop an unbuffered (``SSCursor``) result whose rest is not wanted: ``KILL QUERY`` it
    (synchronously, so the kill cannot reach a later statement), then read what is still in
    flight up to the end packet or the kill's error; the connection stays usable."""
    result = getattr(cursor, "_result", None)
    if result is None or not result.unbuffered_active or conn._sock is None:
        return
    kill_query(conn)
    while result.unbuffered_active:
        try:
            packet = conn._read_packet()
        except pymysql.Error:  # the kill's "interrupted" error ends the result
            break
        if result._check_packet_is_eof(packet):
            break
    result.unbuffered_active = False
    result.connection = None
