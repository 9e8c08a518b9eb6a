"""PostgreSQL: the text that runs a streamed query, and reading its row-size check's error back.

- ``streamed_text(statement, check, rows)``: ``BEGIN; DECLARE sqlrl_c NO SCROLL CURSOR FOR`` the
  query behind a barrier that keeps it planned on its own, filtered by the row-size ``check``,
  then the first ``FETCH`` -- one round trip. The user's text starts on line 2 (error positions
  are shifted back by one).
- ``row_bytes(max_bytes)``: the most text one row may have: a 16th of the call's ``max_bytes``,
  at least 64 KiB (at most ``max_bytes``), so that a first batch of 16 rows is at most
  ``max(max_bytes, 1 MiB)`` and a later one of ``LATER_BATCH_ROWS`` rows at most
  ``max(16 x max_bytes, 16 MiB)`` of text, however the rows widen;
- ``row_cap(max_bytes)``: the check (once per session): a row whose text is longer than
  ``row_bytes(max_bytes)`` stops the query with "bigint out of range" in ``int48pl``.
- ``wide_row(exc)``: whether an error is that check's; ``OWN_TEXT``: every piece of sqlrl's own
  text an error message may quote, to be cut from it.

Guarantees (tests/dialects/test_pg_row_cap.py, with the text filter on and off): the same rows,
columns and order come back as from the bare query; rows the query filters out are never
measured; a row longer than the cap never reaches the client; nothing the session defines (its
own functions or operators ahead of ``pg_catalog``) is called by the check.
"""

from __future__ import annotations

import re

import psycopg2

from .postgresql_lex import has_offset

CURSOR = "sqlrl_c"  # the streamed query's cursor (the sandbox refuses the name to the session)

# A streamed query's rows pass a size check on the server before they are sent: a row whose text
# is longer than the call's byte cap stops the query with an error (which ``postgresql`` rewrites)
# instead of reaching the client, whose driver would hold the whole row, decoded, before sqlrl
# could cap it. OFFSET 0 keeps the query a subquery planned on its own, so the check sees exactly
# the rows it returns. What is measured is the row's text (``record_out``: every column's output
# function, as sent, plus quoting), never its stored size: ``pg_column_size`` counts a compressed
# value compressed (a 200 MB string stored in 2.3 MB) and a nested record before the quoting its
# output doubles at every level (539 bytes printing as 138 MB), so neither bounds what is sent.
# Every name is schema-qualified (``pg_catalog``): a session may create functions and operators
# in its clone and put their schema before ``pg_catalog`` on its ``search_path``, and an
# unqualified ``pg_column_size`` or ``<=`` then resolved to the session's own (one returning 1
# let a 50 MB value through). The check is one addition, text length (int4) + (2**63 - 1 - cap),
# raising "bigint out of range" in ``int48pl`` exactly when the row is longer than ``cap``; the
# row is measured once (``<= cap OR <error arm>`` cost the server 8.6-14.2 µs more per query).
_I8_MAX = 2**63 - 1
_CAP_MAX = 2**31 - 1  # a row's text is at most ~1 GB (PostgreSQL's limit for one value)
# One FETCH arrives whole (libpq), so what bounds a batch is rows x the row bound: a row may have
# a ROW_SHARE-th of the call's byte cap (at least ROW_FLOOR), and a later FETCH asks for at most
# LATER_BATCH_ROWS rows (the executor's ``BatchBound``). Before, a row could have all of
# max_bytes and a later FETCH 10,000 rows: 16 narrow rows, then 1 MB ones, grew the client by
# 2.3 GB with max_bytes at 4 MiB (issue 46, case 4's many-row form).
ROW_SHARE = 16
ROW_FLOOR = 64 * 1024
LATER_BATCH_ROWS = 256
_ROW_TEXT_BYTES = "pg_catalog.octet_length((sqlrl_r.*)::pg_catalog.text)"
_ROW_CAP = "WHERE (" + _ROW_TEXT_BYTES + " OPERATOR(pg_catalog.+) {slack}) IS NOT NULL"
# The barrier: a query without an OFFSET anywhere gets ``OFFSET 0`` appended (one subquery level);
# one with an OFFSET (its own, which a second OFFSET would contradict, or a nested query's: the
# parse tree is searched as text) is put in a subquery that has it (two levels, 2.5-6 µs more).
_ONE_LEVEL = ("SELECT * FROM (", "OFFSET 0) sqlrl_r ")
_TWO_LEVELS = ("SELECT * FROM (SELECT * FROM (", ") sqlrl_q OFFSET 0) sqlrl_r ")
_WIDE_ROW_CODE, _WIDE_ROW_ROUTINE = "22003", "int48pl"  # the check's overflow (``wide_row``)
OWN_TEXT = re.compile(rf"BEGIN; DECLARE {CURSOR} NO SCROLL CURSOR FOR"
                      rf"( SELECT \* FROM \((SELECT \* FROM \()?)?"
                      rf"|\s*(\) sqlrl_q )?OFFSET 0\) sqlrl_r WHERE "
                      rf"\(pg_catalog\.octet_length.*? IS NOT NULL"
                      rf"|\s*;FETCH FORWARD \d+ FROM {CURSOR}"
                      rf"|SET statement_timeout = \d+; (FETCH FORWARD \d+ FROM {CURSOR})?")


def row_bytes(max_bytes: int) -> int:
    """The most text one streamed row may have in a call whose byte cap is ``max_bytes``."""
    return min(max(0, max_bytes), max(ROW_FLOOR, max_bytes // ROW_SHARE), _CAP_MAX)


def row_cap(max_bytes: int) -> str:
    """The row-size check of a streamed query whose rows may have ``row_bytes(max_bytes)`` of
    text each."""
    return _ROW_CAP.format(slack=_I8_MAX - row_bytes(max_bytes))


def streamed_text(statement: str, check: str, rows: int) -> str:
    """What runs a streamed ``statement`` (the user's text from line 2): its cursor, declared over
    the barrier and the row-size ``check`` (``row_cap``), and the first FETCH of ``rows`` rows."""
    head, tail = _TWO_LEVELS if has_offset(statement) else _ONE_LEVEL
    return (f"BEGIN; DECLARE {CURSOR} NO SCROLL CURSOR FOR {head}\n{statement}\n{tail}{check}"
            f";FETCH FORWARD {rows} FROM {CURSOR}")


def wide_row(exc: psycopg2.Error) -> bool:
    """Whether a streamed query's error is the row-size check's overflow (``_ROW_CAP``): "bigint
    out of range" raised by the C routine ``int48pl`` (int4 + int8), which the server names in
    the error. A query's own int4 + int8 sum past 2**63 reads the same and is reported as a
    wide row; a query's other overflows (int8 + int8, int8 * int8, ...) are not."""
    routine = exc.diag.source_function
    return exc.pgcode == _WIDE_ROW_CODE and (
        routine == _WIDE_ROW_ROUTINE or (routine is None and "bigint out of range" in str(exc)))
