"""SQLite statements as SQLite's tokenizer reads them (``tokenize.c``), for splitting and the
sandbox's keyword rules. On SQLite the sandbox's wall is the authorizer (``sqlite.py``); these
rules only give early, readable errors.

Rules: ``--`` starts a comment whatever follows and it ends at LF; ``/* */`` does not nest and an
unterminated one runs to the end of the text; ``'…'`` strings double their quote and have no
backslash escapes; identifiers may be quoted with ``"…"``, `` `…` `` (both doubling their quote)
or ``[…]``; ``x'…'`` blobs end at the next quote; white space is ``\\t \\n \\v \\f \\r`` and space.

Guarantees:
- ``split(sql)``: statements end at a ``;`` outside strings, quoted names and comments — except
  inside a ``CREATE TRIGGER … BEGIN … END`` body, where ``sqlite3.complete_statement`` (SQLite's
  own ``sqlite3_complete``) decides. Empty statements are dropped. Text the tokenizer cannot read
  (an unterminated string or quoted name) is one statement, so SQLite rejects it whole. Never
  raises.
- ``lex(text)``: ``words`` are the first two bare words (comments skipped), ``code`` the text with
  comments blanked, ``parts`` the number of statements SQLite reads in it.
"""

from __future__ import annotations

import re
import sqlite3
from functools import lru_cache

from ..statements import Statement

_WS = " \t\n\x0b\x0c\r"
_SPECIAL = re.compile(r"""[-/;'"`\[]""")  # where a comment, string, name or ';' may start
_RUN = re.compile(r"[0-9A-Za-z_$\x80-\U0010ffff]+")  # an identifier, keyword or number
_TRIGGER_HEAD = {"EXPLAIN", "QUERY", "PLAN", "CREATE", "TEMP", "TEMPORARY"}


def _end_of(sql: str, kind: str, start: int) -> int:
    """Where the comment, string or quoted name opened by ``kind`` at ``start`` ends (-1: never,
    which SQLite rejects; an unterminated ``/*`` comment is legal and runs to the end)."""
    n = len(sql)
    if kind == "--":
        end = sql.find("\n", start + 2)
        return n if end < 0 else end
    if kind == "/*":
        end = sql.find("*/", start + 2)
        return n if end < 0 else end + 2
    if kind == "x'":
        end = sql.find("'", start + 2)
        return -1 if end < 0 else end + 1
    close = "]" if kind == "[" else kind
    pos = start + 1
    while True:
        end = sql.find(close, pos)
        if end < 0:
            return -1  # unterminated: SQLite rejects the text
        if close != "]" and sql.startswith(close, end + 1):
            pos = end + 2
            continue
        return end + 1


def _scan(sql: str) -> tuple[str, str, list[int]]:
    """(``sql`` with comments blanked, the same with strings and quoted names blanked too,
    positions of its ``;`` tokens). Text after an unterminated string or name holds no ``;``."""
    code: list[str] = []
    bare: list[str] = []
    semicolons: list[int] = []
    pos = i = 0  # text before pos is emitted; the next special character is searched from i
    while True:
        m = _SPECIAL.search(sql, i)
        if m is None:
            code.append(sql[pos:])
            bare.append(sql[pos:])
            return "".join(code), "".join(bare), semicolons
        at = m.start()
        kind = sql[at:at + 2] if sql[at] in "-/" else sql[at]
        if kind in ("-", "/") or len(kind) == 2 and kind not in ("--", "/*"):
            i = at + 1  # a minus or a slash
            continue
        if (kind == "'" and at and sql[at - 1] in "xX"
                and not (at > 1 and _RUN.match(sql, at - 2, at - 1))):
            kind, at = "x'", at - 1  # a blob literal
        gap = sql[pos:at]
        if kind == ";":
            semicolons.append(at)
            code.append(gap + ";")
            bare.append(gap + ";")
            pos = i = at + 1
            continue
        end = _end_of(sql, kind, at)
        if end < 0:  # SQLite rejects the text: no statement ends after this point
            code.append(gap + sql[at:])
            bare.append(gap + " " * (len(sql) - at))
            return "".join(code), "".join(bare), []
        blank = " " * (end - at)
        code.append(gap + (blank if kind in ("--", "/*") else sql[at:end]))
        bare.append(gap + blank)
        pos = i = end


def _words(bare: str, most: int = 2) -> tuple[str, ...]:
    """The first bare words (runs of name characters not starting with a digit or ``$``); the
    sandbox reads two (the trigger check, six)."""
    words: list[str] = []
    for m in _RUN.finditer(bare):
        word = m.group()
        if not word[0].isdigit() and word[0] != "$":
            words.append(word.upper())
            if len(words) == most:
                break
    return tuple(words)


def split(sql: str) -> list[Statement]:
    """The statements of one call (see the module docstring)."""
    if ";" not in sql:  # one statement at most: scanned once, by lex
        statement = lex(sql.strip(_WS))
        return [statement] if statement.code.strip(_WS) else []
    return [lex(text) for text in _pieces(sql)]


def _pieces(sql: str) -> list[str]:
    code, bare, semicolons = _scan(sql)
    out: list[str] = []
    start = 0
    for end in [*semicolons, len(sql)]:
        if end < len(sql) and not _ends_here(sql, bare, start, end):
            continue
        if code[start:end].strip(_WS):
            out.append(sql[start:end].strip(_WS))
        start = end + 1
    return out


def _ends_here(sql: str, bare: str, start: int, semicolon: int) -> bool:
    head = _words(bare[start:semicolon], 6)  # [EXPLAIN [QUERY PLAN]] CREATE [TEMP] TRIGGER
    if "TRIGGER" not in head or not set(head[:head.index("TRIGGER")]) <= _TRIGGER_HEAD:
        return True
    return sqlite3.complete_statement(sql[start:semicolon + 1])


@lru_cache(maxsize=64)
def lex(text: str) -> Statement:
    """One statement text, as SQLite reads it."""
    code, bare, semicolons = _scan(text)
    words = _words(bare)
    parts = len(_pieces(text)) if semicolons else 1
    return Statement(text, words, words[0] if words else "", code, parts)
