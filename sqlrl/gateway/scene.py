"""A rollout's session: opened for its task, with the task's setup SQL run in it (Ray-free).

``open_scene(sessions, task, limits, key, retry_after_s)`` opens ONE trajectory-scoped session
from a ``SessionSource`` (``sqlrl.db.source``), keyed by the rollout id, then runs the kind's scene
(``TaskKind.scene_sql``: a debugging task's ``preprocess_sql``; none for text-to-SQL) in it, one
statement after the other, through the session's own ``execute`` -- the executor and limits the
built-in loop's session runs them with -- and returns the session. Running the scene here rather
than inside the ``SessionRequest`` (where ``open_many`` raises one ``SessionError`` for both) is
what tells its two failures apart:

- ``Unavailable`` (HTTP 503 + ``Retry-After``; the claimed task waits again): no session could be
  opened (a server down, the pool at capacity, a database not in the catalog), or the session was
  lost while the scene ran (``session-lost``, ``lease-expired``) -- the infrastructure's fault,
  worth retrying.
- ``SetupFailed``: a scene statement failed with an SQL error (``syntax``, ``runtime``,
  ``permission``, ``timeout``) on a session that works -- the task's own fault, the same on every
  session, so retrying cannot help. A timeout counts as the task's: a scene that does not finish
  within the rollout's ``sql_timeout_s`` will not the next time either. ``statement`` (1-based),
  ``of`` and ``error`` (the ``QueryError``) say which statement and why; ``reason`` is one line
  for the trace.

Either way the session is closed before the error is raised (nothing is leaked), and a session
that is returned has had every scene statement succeed.
"""

from __future__ import annotations

from typing import Any

from sqlrl.db.source import SessionRequest, SessionSource
from sqlrl.db.types import ErrorKind, Limits, QueryError
from sqlrl.tasks.kinds import kind_of

from .contract import Unavailable

__all__ = ["SetupFailed", "open_scene"]

# statement errors that say the session broke, not the SQL: retried (Unavailable), never the task's fault
LOST = frozenset({ErrorKind.SESSION_LOST, ErrorKind.LEASE_EXPIRED})


class SetupFailed(Exception):
    """A statement of the task's setup SQL failed on a working session (module docstring)."""

    def __init__(self, task_id: str, statement: int, of: int, error: QueryError) -> None:
        self.task_id, self.statement, self.of, self.error = task_id, statement, of, error
        super().__init__(self.reason)

    @property
    def reason(self) -> str:
        return (f"the task's setup SQL failed (statement {self.statement} of {self.of}: "
                f"{self.error.kind.value} error: {self.error.message})")


def open_scene(sessions: SessionSource, task: Any, limits: Limits, key: str, retry_after_s: int) -> Any:
    """The rollout's session with the task's scene run in it (module docstring)."""
    scene = tuple(kind_of(task).scene_sql(task))
    try:
        (session,) = sessions.open_many([SessionRequest(task.db_id, task.dialect, limits=limits, key=key)])
    except Exception as exc:
        raise Unavailable(f"could not open a session on {task.db_id!r}: {exc}", retry_after_s) from None
    try:
        for i, sql in enumerate(scene, 1):
            error = session.execute(sql).error
            if error is None:
                continue
            if error.kind in LOST:
                raise Unavailable(f"the session on {task.db_id!r} was lost while the task's setup SQL ran: "
                                  f"{error}", retry_after_s)
            raise SetupFailed(task.task_id, i, len(scene), error)
    except BaseException:
        sessions.close_many([session])
        raise
    return session
