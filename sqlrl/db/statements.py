"""A call's SQL text as statements, read by the lexical rules of the engine that will run it.

Each engine whose descriptor names a ``lexer`` (``dialects/engines.py``) has its call split by that
module, whose comment, quote and terminator rules are the server's (checked against the real
servers by tests/dialects/test_lexer_differential.py):

- ``postgres``: ``dialects/postgresql_lex.py`` — pglast (libpg_query: PostgreSQL's own scanner and
  grammar); statements are classified by their parse node;
- ``mysql``: ``dialects/mysql_lex.py`` — MariaDB's lexer rules (``--`` + control character,
  ``#``, executable ``/*! */`` / ``/*M! */`` comments read as code, backslash escapes);
- ``sqlite``: ``dialects/sqlite_lex.py`` — SQLite's tokenizer rules, statement ends by
  ``sqlite3.complete_statement`` (a trigger body keeps its ``;``).

- ``tsql``, ``oracle`` (unverified): ``dialects/glot_lex.py`` — sqlglot's tokenizer for the
  dialect, with the text of its command words read again as tokens; the sandbox reads the same
  tokens (``Statement.node``).

Other engines (a test's DuckDB) use sqlglot's tokenizer for their dialect directly.

Guarantees:
- ``split`` never raises: text the engine's lexer cannot read (an unterminated string, say) comes
  back as one statement, so the database itself reports the syntax error.
- Semicolons inside strings, quoted identifiers, comments and dollar-quoted bodies do not split;
  empty statements (``;;``, a trailing ``;``, comment-only text) are dropped.
- ``Statement.words`` are the statement's leading bare words as its engine reads them (comments
  skipped, executable comments read), upper-cased.

Policy (docs/sessions.md): one ``execute`` call may hold several statements; they run in order in
the same session, execution stops at the first error, and the result is the last statement's.
Splitting here (rather than in each driver) makes that identical on every dialect.

It does not decide what is allowed: the sandbox rules (``dialects/base.py`` and each engine's) do,
from these statements.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from sqlglot.dialects import Dialect
from sqlglot.tokens import TokenType

from .dialects.descriptor import by_sqlglot

MAX_WORDS = 8  # leading words kept per statement


@dataclass(frozen=True)
class Statement:
    """One statement of a call, as its engine's lexer reads it."""

    text: str  # what is sent to the server (no terminator)
    words: tuple[str, ...] = ()  # leading bare words (not strings or quoted names), upper-cased
    kind: str = ""  # the engine's class: PostgreSQL's parse node ("TransactionStmt"); else words[0]
    code: str = ""  # text with comments blanked (MariaDB: executable comments' contents kept)
    parts: int = 1  # statements the engine reads in ``text`` (1 for everything ``split`` returns)
    node: Any = field(default=None, compare=False, repr=False)  # PostgreSQL: the parse tree (JSON);
    #                                                  glot_lex engines: the tokens (kind, text)


@lru_cache(maxsize=None)
def _lexer(dialect: str) -> Any:
    """The exact lexer of the engine whose sqlglot name is ``dialect`` (a module, or an object
    in one: ``Dialect.lexer`` is ``"module"`` or ``"module:name"``), or None. The lexer module is
    imported by that name on first use (pglast is loaded only by PostgreSQL's users)."""
    engine = by_sqlglot(dialect)
    if engine is None or not engine.lexer:
        return None
    module, _, name = engine.lexer.partition(":")
    loaded = importlib.import_module(module)
    return vars(loaded)[name] if name else loaded


def split(sql: str, dialect: str = "sqlite") -> list[Statement]:
    """``sql`` as statements, by the lexical rules of ``dialect`` (a sqlglot dialect name)."""
    module = _lexer(dialect)
    if module is not None:
        return module.split(sql)
    return _generic_split(sql, dialect)


def split_statements(sql: str, dialect: str = "sqlite") -> list[str]:
    """Statement texts of ``sql`` (without the separating semicolons)."""
    return [s.text for s in split(sql, dialect)]


def is_blank(sql: str, dialect: str = "sqlite") -> bool:
    """True when ``sql`` holds nothing but white space, comments and empty statements."""
    return not split(sql, dialect)


def leading_keywords(statement: str, n: int = 2, dialect: str = "sqlite") -> tuple[str, ...]:
    """The first ``n`` bare words of ``statement``'s first statement, upper-cased."""
    statements = split(statement, dialect)
    return statements[0].words[:n] if statements else ()


def as_statement(statement: "Statement | str", dialect: str = "sqlite") -> Statement:
    """``statement`` itself, or a text read as one statement by ``dialect``'s lexer."""
    if isinstance(statement, Statement):
        return statement
    module = _lexer(dialect)
    if module is not None:
        return module.lex(statement)
    return _generic_lex(statement, dialect)


# --- engines without a lexer of their own: sqlglot's tokenizer -----------------------------------

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$#@]*\Z")
_NOT_WORDS = {TokenType.STRING, TokenType.IDENTIFIER, TokenType.NUMBER, TokenType.NATIONAL_STRING}


@lru_cache(maxsize=None)
def _sqlglot(name: str) -> Dialect:
    return Dialect.get_or_raise(name)


def _tokens(sql: str, dialect: str) -> list[Any] | None:
    try:
        return _sqlglot(dialect).tokenize(sql)
    except Exception:  # sqlglot.errors.TokenError and friends: let the database report it
        return None


def _generic_split(sql: str, dialect: str) -> list[Statement]:
    tokens = _tokens(sql, dialect)
    if tokens is None:
        return [_generic_lex(sql.strip(), dialect)] if sql.strip() else []
    out: list[Statement] = []
    start, piece = 0, []
    for tok in [*tokens, None]:
        if tok is None or tok.token_type == TokenType.SEMICOLON:
            text = sql[start:tok.start if tok else len(sql)].strip()
            if piece:
                out.append(_from_tokens(text, piece))
            start, piece = (tok.end + 1 if tok else 0), []
        else:
            piece.append(tok)
    return out


def _generic_lex(text: str, dialect: str) -> Statement:
    if _tokens(text, dialect) is None:  # unreadable: every bare word of the raw text counts
        words = tuple(w.upper() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_$]*", text)[:MAX_WORDS])
        return Statement(text, words, words[0] if words else "", text)
    statements = _generic_split(text, dialect)
    first = statements[0] if statements else Statement(text, code=text)
    return replace(first, text=text, code=text, parts=len(statements))


def _from_tokens(text: str, tokens: list[Any], parts: int = 1) -> Statement:
    words = tuple(t.text.upper() for t in tokens
                  if t.token_type not in _NOT_WORDS and _WORD.match(t.text))[:MAX_WORDS]
    return Statement(text, words, words[0] if words else "", text, parts)
