"""Splitting a call's SQL text into statements, and reading each statement's leading keyword.

Guarantees:
- ``split_statements`` never raises: text that the dialect's tokenizer cannot read (an unterminated
  string, say) comes back as one statement, so the database itself reports the syntax error.
- Semicolons inside strings, quoted identifiers, comments and dollar-quoted bodies do not split.
- Empty statements (``;;``, a trailing ``;``, comment-only text) are dropped.

Policy (documented in docs/sessions.md): one ``execute`` call may hold several statements; they run
in order in the same session, execution stops at the first error, and the result is the last
statement's. Splitting here (rather than in each driver) makes that identical on every dialect.
"""

from __future__ import annotations

import re
from functools import lru_cache

from sqlglot.dialects import Dialect
from sqlglot.tokens import TokenType

_COMMENT_RE = re.compile(r"--[^\n]*|/\*.*?\*/", re.S)


@lru_cache(maxsize=None)
def _dialect(name: str) -> Dialect:
    return Dialect.get_or_raise(name)


def split_statements(sql: str, sqlglot_dialect: str = "sqlite") -> list[str]:
    """Split ``sql`` into statement texts (without the separating semicolons)."""
    body = sql.strip().rstrip(";")
    if ";" not in body and "--" not in body and "/*" not in body:  # fast path: one statement
        return [body.strip()] if body.strip() else []
    try:
        tokens = _dialect(sqlglot_dialect).tokenize(sql)
    except Exception:  # sqlglot.errors.TokenError and friends: let the database report it
        return [sql.strip()] if not is_blank(sql) else []
    statements: list[str] = []
    start = 0
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            statements.append(sql[start:tok.start])
            start = tok.end + 1
    statements.append(sql[start:])
    return [s.strip() for s in statements if not is_blank(s)]


def is_blank(sql: str) -> bool:
    """True when ``sql`` holds nothing but white space and comments."""
    return not _COMMENT_RE.sub(" ", sql).strip()


_HEAD_RE = re.compile(r"\W*([A-Za-z_]+)(?:\W+([A-Za-z_]+))?")


def leading_keywords(statement: str, n: int = 2) -> tuple[str, ...]:
    """The first ``n`` (at most 2) words of a statement, upper-cased, comments skipped (cheap,
    no parsing)."""
    head = statement[:200]
    if "--" in head or "/*" in head:
        head = _COMMENT_RE.sub(" ", statement)[:200]
    m = _HEAD_RE.match(head)
    if m is None:
        return ()
    return tuple(w.upper() for w in m.groups()[:n] if w)
