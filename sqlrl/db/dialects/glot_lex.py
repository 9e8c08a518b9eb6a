"""The lexer of the engines read by sqlglot's tokenizers (SQL Server: ``tsql``; Oracle:
``oracle``; both UNVERIFIED): one token stream per statement, used both to split a call into
statements and by the engine's sandbox rules (``mssql_denial``, ``oracle_denial``), so the two
never read one text two ways.

    TSQL.split("SELECT 1; PRINT 1 COMMIT")   # two Statements; .node holds each one's tokens
    TSQL.lex("SELECT [a]]b], @v")            # ('WORD', 'SELECT'), ('IDENT', 'A]B'), ...

A token is ``(kind, text)``, text upper-cased: "WORD" (a bare word or keyword, with T-SQL's
``@var``, ``@@GLOBAL``, ``#temp``, ``##global`` and Oracle's ``name$x``/``t@link`` kept whole),
"IDENT" (a quoted identifier, without its quotes: ``[x]``, ``"x"``) or "PUNCT" (any other
symbol). String literals of every form sqlglot knows for the dialect (``N'..'``, Oracle's
``q'[..]'``), numbers and comments (T-SQL's nest) are dropped.

Guarantees:
- Nothing is hidden by sqlglot's command words: sqlglot reads the rest of a statement that
  starts with one (PRINT, EXPLAIN, CALL, FETCH, T-SQL's END, ...) as one string; that text is read
  again as tokens here, so ``PRINT 1 COMMIT`` shows its ``COMMIT``.
- A text sqlglot cannot tokenize (an unterminated string or comment) is never read as fewer
  words: every bare word and symbol of its raw text counts (strings and comments included), and
  ``split`` returns it as one statement, for the server to reject.
- Statements are split at semicolons outside strings, identifiers and comments; a piece with no
  token at all (``;;``, comment-only) is dropped.
"""

from __future__ import annotations

import re
from functools import cached_property
from sqlglot.dialects import Dialect
from sqlglot.errors import TokenError
from sqlglot.tokens import Token as GlotToken
from sqlglot.tokens import TokenType

from ..statements import MAX_WORDS, Statement

__all__ = ["ORACLE", "TSQL", "GlotLexer", "Token"]

Token = tuple[str, str]

_DROPPED = frozenset({t for t in TokenType if t.name.endswith("STRING")} | {TokenType.NUMBER})
_PREFIXES = frozenset({TokenType.PARAMETER, TokenType.HASH})  # T-SQL's @ and # before a name
_WORD = re.compile(r"[^\W\d][\w@#$]*\Z")
_RAW = re.compile(r"[^\W\d][\w@#$]*|[@#][\w@#$]*|\d[\w.]*|[^\w\s]")


class GlotLexer:
    """Statements and tokens of one sqlglot dialect (module doc)."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect

    @cached_property
    def _glot(self) -> Dialect:
        return Dialect.get_or_raise(self.dialect)

    def _raw(self, sql: str) -> list[GlotToken]:
        return self._glot.tokenizer_class(dialect=self._glot).tokenize(sql)

    def tokens(self, sql: str) -> list[Token]:
        """The tokens of ``sql`` (module doc)."""
        try:
            raw = self._raw(sql)
        except TokenError:
            return _raw_tokens(sql)
        return self._read(raw)

    def _read(self, raw: list[GlotToken]) -> list[Token]:
        cls = self._glot.tokenizer_class
        out: list[Token] = []
        i = 0
        while i < len(raw):
            tok = raw[i]
            swallows = (tok.token_type in cls.COMMANDS and i + 1 < len(raw)
                        and raw[i + 1].token_type == TokenType.STRING
                        and (i == 0 or raw[i - 1].token_type in cls.COMMAND_PREFIX_TOKENS))
            if tok.token_type in _PREFIXES:  # @, @@, #, ## glued to the name that follows
                j, prefix = i, ""
                while j < len(raw) and raw[j].token_type in _PREFIXES and (
                        j == i or raw[j].start == raw[j - 1].end + 1):
                    prefix += raw[j].text
                    j += 1
                glued = (j < len(raw) and raw[j].start == raw[j - 1].end + 1
                         and _WORD.match(raw[j].text) is not None)
                out.append(("WORD", (prefix + (raw[j].text if glued else "")).upper()))
                i = j + 1 if glued else j
                continue
            if tok.token_type in _DROPPED:
                pass
            elif tok.token_type == TokenType.IDENTIFIER:
                out.append(("IDENT", tok.text.upper()))
            elif all(_WORD.match(part) for part in tok.text.split()):
                out.extend(("WORD", part.upper()) for part in tok.text.split())  # GROUP BY: two
            else:
                out.append(("PUNCT", tok.text.upper()))
            if swallows:  # the rest of the statement, which sqlglot kept as one string
                out.extend(self.tokens(raw[i + 1].text))
                i += 1
            i += 1
        return out

    def split(self, sql: str) -> list[Statement]:
        """``sql`` as statements, each with its tokens in ``Statement.node``."""
        try:
            raw = self._raw(sql)
        except TokenError:
            text = sql.strip()
            return [self._statement(text, _raw_tokens(text))] if text else []
        out: list[Statement] = []
        start, piece = 0, False
        for tok in [*raw, None]:
            if tok is None or tok.token_type == TokenType.SEMICOLON:
                text = sql[start:tok.start if tok is not None else len(sql)].strip()
                if piece:
                    out.append(self._statement(text, self.tokens(text)))
                start, piece = (tok.end + 1 if tok is not None else len(sql)), False
            else:
                piece = True
        return out

    def lex(self, text: str) -> Statement:
        """``text`` read as one statement (``parts``: how many statements ``split`` finds in it)."""
        statement = self._statement(text, self.tokens(text))
        parts = len(self.split(text))
        return statement if parts == 1 else Statement(
            statement.text, statement.words, statement.kind, statement.code, parts, statement.node)

    def tokens_of(self, statement: Statement | str) -> tuple[Token, ...]:
        """The tokens ``split`` gave ``statement``, or those of a text."""
        if isinstance(statement, Statement) and isinstance(statement.node, tuple):
            return statement.node
        return tuple(self.tokens(statement.text if isinstance(statement, Statement) else statement))

    @staticmethod
    def _statement(text: str, tokens: list[Token]) -> Statement:
        words = tuple(t for k, t in tokens if k == "WORD")[:MAX_WORDS]
        return Statement(text, words, words[0] if words else "", text, 1, tuple(tokens))


def _raw_tokens(sql: str) -> list[Token]:
    """Unreadable text: every bare word and symbol of it (strings and comments included)."""
    out: list[Token] = []
    for m in _RAW.finditer(sql):
        text = m.group(0)
        if text[0].isdigit():
            continue
        out.append(("WORD" if _WORD.match(text) or text[0] in "@#" else "PUNCT", text.upper()))
    return out


TSQL = GlotLexer("tsql")
ORACLE = GlotLexer("oracle")

