"""The single SQL executor: every statement any part of sqlrl runs goes through ``run_call``.

Guarantees:
- Never raises for anything the SQL text or the database does: the outcome is a ``QueryResult``
  (errors typed by ``ErrorKind``).
- Applies, in this order: the text-size cap, statement splitting, the statement count cap, the
  sandbox (common rules, then the engine's), execution by the engine adapter, and a row cap and
  byte cap on what is fetched (``truncated=True``).
- The adapter's optional capabilities are the ones it declared (``dialects/contract.py``,
  checked when it registered; ``contract_of`` resolves them once per class): no hook is looked
  up by name here.
- Splitting and the sandbox read the text by the engine's own lexical rules: an adapter with the
  ``ExactLexer`` capability (``lex(conn, sql)``: PostgreSQL via pglast, MariaDB/MySQL, SQLite)
  splits the call into ``Statement``s and its ``denied`` judges each lexed statement; other
  adapters get sqlglot's split for their dialect and judge the statement text.
- Execution of a multi-statement call stops at the first error; earlier statements' effects stay.
- ``Limits.timeout_s`` bounds the whole call (every statement and every fetch): one deadline is
  set when the call starts and passed to every ``adapter.run``; the fetch loop checks it between
  batches; an adapter with ``Cancellable`` (``canceller(conn)``) has the call armed on the process's watchdog
  (``sqlrl.db.sessions.watchdog``), which stops the statement from outside the session if the deadline
  passes. A call stopped by the deadline is always ``ErrorKind.TIMEOUT``; one that the server
  ended more than ``_LATE_S`` after its deadline (an undo, an uninterruptible function) says so.
- Fetching is byte-bounded: batches start at ``FIRST_BATCH_ROWS`` and are then sized from the
  observed row width so one batch is about ``max_bytes / 4``, never more than a ``BatchBound``
  adapter's ``batch_rows(conn)`` (rows that widen after the first batch cannot arrive
  ``MAX_BATCH_ROWS`` at a time); when the row or byte cap is reached the rest is abandoned (an
  ``Abandoning`` adapter's ``abandon`` stops the server's work). A batch whose rows alone pass
  ``max_bytes`` ends the result as truncated, however few rows it holds (an adapter may stop
  reading a batch there).
- Values are normalised (``normalize.py``) so results are JSON-serialisable and hashable.
- ``QueryResult.read_only`` is the engine's attestation, statement by statement, asked only when
  ``Limits.attest`` is on (otherwise None, at no cost): an adapter with ``ReadOnlyAttestation``
  is asked ``read_only(conn, state, cursor) -> bool | None`` after each statement that ran
  (True: the engine attests it only read; False: it wrote; None: cannot tell), and its
  ``observe(conn, state)`` is called before the statement runs (SQLite compiles it afresh there,
  so its authorizer sees it); the call is True only when every statement is True, False when any
  is False, else None. An adapter without ``read_only``, a hook that raises, and every failed
  call give None. The hooks observe, they never change what a statement does or what a later
  statement sees.
"""

from __future__ import annotations

import marshal
import time
from typing import Any, cast

from ..dialects.base import common_denial, error_message
from ..dialects.contract import (Abandoning, BatchBound, Cancellable, DialectAdapter,
                                ExactLexer, ReadOnlyAttestation, contract_of)
from .normalize import normalize_rows
from ..statements import Statement, split
from ..types import ErrorKind, Limits, QueryResult, read_only_of
from .watchdog import WATCHDOG

FIRST_BATCH_ROWS = 16  # rows of a result's first batch (its width is not known yet)
MAX_BATCH_ROWS = 65_536
_DEADLINE_MESSAGE = "the call ran past its time limit ({:g} s for all its statements and fetches)"
_LATE_MESSAGE = "; it was stopped then, and the server took until {:.1f} s after the deadline to end it"
_LATE_S = 0.5  # a call that ended this long after its deadline says so
_FILTER = [True]  # the text filter (sandbox rules); off only in the filter-off containment test


def set_text_filter(enabled: bool) -> bool:
    """TEST-ONLY: switch the text filter (``common_denial`` and the engines' ``denied``) on or
    off for this process; returns the previous setting. The filter-off test uses it to show that
    the servers alone contain a session (docs/sessions.md); nothing else may call it."""
    previous = _FILTER[0]
    _FILTER[0] = bool(enabled)
    return previous


class DeadlineExceeded(Exception):
    """Raised by the fetch loop when the call's deadline passed between two batches."""


def run_call(adapter: DialectAdapter, conn: Any, state: Any, sql: str, limits: Limits) -> QueryResult:
    t0 = time.perf_counter()

    def failed(kind: ErrorKind, message: str, index: int = 0, n: int = 1) -> QueryResult:
        return QueryResult.failure(kind, message, statement_index=index, statements=n,
                                   elapsed_ms=(time.perf_counter() - t0) * 1e3)

    if not isinstance(sql, str):
        return failed(ErrorKind.SYNTAX, f"SQL must be text, got {type(sql).__name__}")
    if len(sql) > limits.max_sql_chars:
        return failed(ErrorKind.PERMISSION,
                      f"SQL text is {len(sql)} characters; the limit is {limits.max_sql_chars}")
    contract = contract_of(adapter)  # resolved once per adapter class, at its registration
    lexer = cast(ExactLexer, adapter) if contract.has(ExactLexer) else None
    statements: list[Statement] = (lexer.lex(conn, sql) if lexer is not None
                                   else split(sql, adapter.sqlglot_dialect))
    n = len(statements)
    if n == 0:
        return failed(ErrorKind.SYNTAX, "no SQL statement to execute (empty text or only comments)", n=0)
    if n > limits.max_statements:
        return failed(ErrorKind.PERMISSION,
                      f"{n} statements in one call; the limit is {limits.max_statements}", n=n)

    deadline = time.monotonic() + limits.timeout_s
    cancel = (cast(Cancellable, adapter).canceller(conn) if contract.has(Cancellable) else None)
    armed = WATCHDOG.arm(deadline, cancel) if cancel is not None else None
    attest = (cast(ReadOnlyAttestation, adapter)
              if limits.attest and contract.has(ReadOnlyAttestation) else None)
    abandon = cast(Abandoning, adapter) if contract.has(Abandoning) else None
    batch = (min(MAX_BATCH_ROWS, max(1, cast(BatchBound, adapter).batch_rows(conn)))
             if contract.has(BatchBound) else MAX_BATCH_ROWS)
    read_only: bool | None = None if attest is None else True
    columns: tuple[str, ...] = ()
    rows: list[tuple[Any, ...]] = []
    truncated = False
    affected: int | None = None
    index = 0
    error: tuple[ErrorKind, str] | None = None
    try:
        for index, statement in enumerate(statements):
            reason = _FILTER[0] and (common_denial(statement) or adapter.denied(
                statement if lexer is not None else statement.text))
            if reason:
                error = (ErrorKind.PERMISSION, reason)
                break
            cursor = None
            try:
                if index and time.monotonic() >= deadline:
                    raise DeadlineExceeded()
                if attest is not None:
                    attest.observe(conn, state)
                cursor = adapter.run(conn, state, statement.text, deadline)
                columns, rows, truncated, affected = _fetch(cursor, limits, deadline, batch)
                if truncated:
                    _abandon(abandon, conn, cursor)
                if attest is not None:
                    read_only = read_only_of((read_only, _attested(attest, conn, state, cursor)))
            except DeadlineExceeded:
                if cursor is not None:
                    _abandon(abandon, conn, cursor)
                error = (ErrorKind.TIMEOUT, _DEADLINE_MESSAGE.format(limits.timeout_s))
            except Exception as exc:  # every driver error becomes a typed result
                error = (adapter.classify(exc), error_message(exc))
            finally:
                if cursor is not None:
                    try:
                        cursor.close()
                    except Exception:
                        pass
            if error is not None:
                break
    finally:
        if WATCHDOG.disarm(armed):  # stopped from outside: a timeout whatever the driver said
            if error is None or error[0] is not ErrorKind.SESSION_LOST:
                late = time.monotonic() - deadline  # honest when the server took long to stop
                error = (ErrorKind.TIMEOUT, _DEADLINE_MESSAGE.format(limits.timeout_s) + (
                    _LATE_MESSAGE.format(late) if late >= _LATE_S else ""))
    if error is not None:
        return failed(error[0], error[1], index, n)
    return QueryResult(columns=columns, rows=tuple(rows), row_count=len(rows), truncated=truncated,
                       elapsed_ms=(time.perf_counter() - t0) * 1e3, affected_rows=affected,
                       statements=n, read_only=read_only)


def _attested(attest: ReadOnlyAttestation, conn: Any, state: Any, cursor: Any) -> bool | None:
    """The adapter's word on the statement that just ran; None when it cannot give one."""
    try:
        verdict = attest.read_only(conn, state, cursor)
    except Exception:
        return None
    return verdict if isinstance(verdict, bool) else None


def _abandon(adapter: Abandoning | None, conn: Any, cursor: Any) -> None:
    """The rest of a result is not wanted: let the adapter stop the server's work on it."""
    if adapter is not None:
        try:
            adapter.abandon(conn, cursor)
        except Exception:
            pass


def _fetch(cursor: Any, limits: Limits, deadline: float, batch: int = MAX_BATCH_ROWS
           ) -> tuple[tuple[str, ...], list[tuple[Any, ...]], bool, int | None]:
    if cursor.description is None:  # DDL/DML: no result set
        count = getattr(cursor, "rowcount", -1)
        return (), [], False, (count if isinstance(count, int) and count >= 0 else None)
    columns = tuple(str(d[0]) for d in cursor.description)
    rows: list[tuple[Any, ...]] = []
    size = 0
    want = min(FIRST_BATCH_ROWS, batch, limits.max_rows + 1)
    target = max(1, limits.max_bytes // 4)
    while True:
        chunk = normalize_rows(cursor.fetchmany(want))
        room = limits.max_rows - len(rows)
        # C-speed size estimate (plain values only), one row at a time: no copy of the batch
        sizes = list(map(len, map(marshal.dumps, chunk)))
        chunk_size = sum(sizes)
        if len(chunk) <= room and size + chunk_size <= limits.max_bytes:
            rows.extend(chunk)
            size += chunk_size
            if len(chunk) < want:  # the driver had no more rows
                return columns, rows, False, None
            if time.monotonic() >= deadline:
                raise DeadlineExceeded()
            width = max(1, chunk_size // max(1, len(chunk)))
            want = max(1, min(batch, target // width, limits.max_rows + 1 - len(rows)))
            continue
        for row, row_size in zip(chunk[:room], sizes):  # the cap falls inside this chunk
            size += row_size
            if size > limits.max_bytes:
                break
            rows.append(row)
        return columns, rows, True, None
