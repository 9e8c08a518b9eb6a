"""The single SQL executor: every statement any part of sqlrl runs goes through ``run_call``.

Guarantees:
- Never raises for anything the SQL text or the database does: the outcome is a ``QueryResult``
  (errors typed by ``ErrorKind``).
- Applies, in this order: the text-size cap, statement splitting (``statements.py``), the statement
  count cap, the sandbox (common rules, then the engine's), execution by the engine adapter, and a
  row cap and byte cap on what is fetched (``truncated=True``).
- Execution of a multi-statement call stops at the first error; earlier statements' effects stay.
- Values are normalised (``normalize.py``) so results are JSON-serialisable and hashable.
"""

from __future__ import annotations

import marshal
import time
from typing import Any

from .dialects.base import DialectAdapter, common_denial, error_message
from .normalize import normalize_rows
from .statements import split_statements
from .types import ErrorKind, Limits, QueryResult

_FETCH_CHUNK = 256


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
    statements = split_statements(sql, adapter.sqlglot_dialect)
    n = len(statements)
    if n == 0:
        return failed(ErrorKind.SYNTAX, "no SQL statement to execute (empty text or only comments)", n=0)
    if n > limits.max_statements:
        return failed(ErrorKind.PERMISSION,
                      f"{n} statements in one call; the limit is {limits.max_statements}", n=n)

    columns: tuple[str, ...] = ()
    rows: list[tuple[Any, ...]] = []
    truncated = False
    affected: int | None = None
    for index, statement in enumerate(statements):
        reason = common_denial(statement) or adapter.denied(statement)
        if reason:
            return failed(ErrorKind.PERMISSION, reason, index, n)
        cursor = None
        try:
            cursor = adapter.run(conn, state, statement, time.monotonic() + limits.timeout_s)
            columns, rows, truncated, affected = _fetch(cursor, limits)
        except Exception as exc:  # every driver error becomes a typed result
            return failed(adapter.classify(exc), error_message(exc), index, n)
        finally:
            if cursor is not None:
                try:
                    cursor.close()
                except Exception:
                    pass
    return QueryResult(columns=columns, rows=tuple(rows), row_count=len(rows), truncated=truncated,
                       elapsed_ms=(time.perf_counter() - t0) * 1e3, affected_rows=affected,
                       statements=n)


def _fetch(cursor: Any, limits: Limits) -> tuple[tuple[str, ...], list[tuple[Any, ...]], bool, int | None]:
    if cursor.description is None:  # DDL/DML: no result set
        count = getattr(cursor, "rowcount", -1)
        return (), [], False, (count if isinstance(count, int) and count >= 0 else None)
    columns = tuple(str(d[0]) for d in cursor.description)
    rows: list[tuple[Any, ...]] = []
    size = 0
    while True:
        want = min(_FETCH_CHUNK, limits.max_rows + 1 - len(rows))
        chunk = normalize_rows(cursor.fetchmany(want))
        room = limits.max_rows - len(rows)
        chunk_size = len(marshal.dumps(chunk))  # C-speed size estimate (plain values only)
        if len(chunk) <= room and size + chunk_size <= limits.max_bytes:
            rows.extend(chunk)
            size += chunk_size
            if len(chunk) < want:  # the driver had no more rows
                return columns, rows, False, None
            continue
        for row in chunk[:room]:  # the cap falls inside this chunk: go row by row
            size += len(marshal.dumps(row))
            if size > limits.max_bytes:
                break
            rows.append(row)
        return columns, rows, True, None
