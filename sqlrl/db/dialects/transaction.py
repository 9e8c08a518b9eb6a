"""What the transaction-isolated server adapters share (SQL Server, Oracle; both unverified here).

Such an engine isolates a session as ONE transaction on a shared database, rolled back when the
session ends (``ServerTransaction`` storage in ``engines.py``), with the savepoint ``SAVEPOINT``
taken before each statement so that a failed statement is undone alone. An adapter subclasses
``TransactionDialect`` and sets:

- ``lexer``: its ``glot_lex`` lexer; ``lex`` splits with it, and its sandbox reads the same tokens;
- ``denial``: its sandbox rule, ``staticmethod((statement) -> reason | None)``;
- ``classify_error``: ``staticmethod((exc) -> ErrorKind)``, which must map ``SessionLost`` to
  ``ErrorKind.SESSION_LOST``.

Everything that differs between the engines (connecting, the privilege check, ``begin``/``end``,
``run``, ``ping``, recovery after a failed statement) stays in the engine's module.
"""

from __future__ import annotations

from typing import Any, Callable

from sqlalchemy.engine import URL

from ..statements import Statement
from ..types import ErrorKind, SessionError
from ..url import redact
from .base import close_quietly, error_message, url_flag

SAVEPOINT = "sqlrl_sp"


class SessionLost(Exception):
    """The session's transaction or connection is gone (always ``ErrorKind.SESSION_LOST``)."""


def setup_failed(conn: Any, url: URL, exc: BaseException,
                 readable: Callable[[BaseException], BaseException]) -> SessionError:
    """Close a connection whose session set-up failed; the error to raise (``from exc``)."""
    close_quietly(conn)
    return SessionError(f"cannot set up a session on {redact(url)}: "
                        f"{error_message(readable(exc))}")


def refuse_privileged(conn: Any, url: URL, account: str, user: str) -> None:
    """Unless the URL has ``?allow_superuser=1``: close ``conn`` and raise ``SessionError``, since
    model-written SQL never runs as ``account`` (what the login is) -- ``user``: what to log in as."""
    if url_flag(url, "allow_superuser"):
        return
    close_quietly(conn)
    raise SessionError(f"refusing to run model-written SQL as {account} on {redact(url)}: use "
                       f"an unprivileged {user}, or add ?allow_superuser=1")


class TransactionDialect:
    """The shared methods of a transaction-isolated adapter (see the module doc)."""

    isolation = "transaction"
    lexer: Any = None
    denial: Callable[[Statement | str], str | None]
    classify_error: Callable[[BaseException], ErrorKind]

    def classify(self, exc: BaseException) -> ErrorKind:
        return self.classify_error(exc)

    def lex(self, conn: Any, sql: str) -> list[Statement]:
        """``sql``'s statements by the engine's sqlglot tokenizer (``lexer``)."""
        return self.lexer.split(sql)

    def denied(self, statement: Statement | str) -> str | None:
        return self.denial(statement)

    def close(self, conn: Any) -> None:
        conn.close()
