"""Trajectory-scoped SQL sessions over SQLite, PostgreSQL, MySQL/MariaDB, SQL Server and Oracle.

Public API: ``open_session``, ``Session``, ``QueryResult``, ``QueryError``, ``ErrorKind``,
``Limits``, ``SessionError``, ``SessionPool``. See docs/sessions.md.
"""

from .sessions.pool import PoolConfig, PoolStats, PoolTimeout, SessionPool
from .sessions.session import Session, open_session
from .types import ErrorKind, Limits, QueryError, QueryResult, SessionError

__all__ = ["ErrorKind", "Limits", "PoolConfig", "PoolStats", "PoolTimeout", "QueryError",
           "QueryResult", "Session", "SessionError", "SessionPool", "open_session"]
