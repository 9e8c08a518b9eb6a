"""The admin side of database servers: each engine's admin operations, and one server seen with
one admin account as ``sqlrl.db.provisioning.scratch`` uses it.

``admin_ops(dialect)`` is the admin class its descriptor names (``Dialect.admin``), made once per
process: ``provision`` (bases), ``scratch`` (clones) and ``loader`` all reach the engine's admin
statements through it. This module imports neither of them (``admin`` < ``scratch`` <
``provision``: no import cycle).

``AdminServer(url)`` holds, for one server seen with one admin account:
- a few **admin connections** (``run(fn)``: ``fn(connection)`` on an idle one; a connection found
  dead after an error — the server restarted — is replaced, with every other idle one, and ``fn``
  tried once more);
- one **holder connection** carrying the liveness locks (``hold(name)`` / ``unhold(name)``:
  PostgreSQL advisory locks, MariaDB ``GET_LOCK``) of the scratch databases this process owns. A
  new holder connection (the old one died) takes every held lock again.
The engine-specific statements are the admin class's (``admin_ops``).
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy.engine import URL

from ..dialects.base import close_quietly
from ..dialects.contract import admin_class
from ..dialects.descriptor import dialects, find
from ..types import SessionError
from ..url import dialect_name

SWEEP_EVERY_S = 300.0  # how often a process sweeps a server for orphans (sqlrl.db.provisioning.scratch)
_ADMINS: dict[str, Any] = {}


def admin_ops(dialect: str) -> Any:
    """The admin operations object of ``dialect`` (raises ``SessionError`` for an engine without
    server-side scratch databases)."""
    if dialect not in _ADMINS:
        engine = find(dialect)
        if engine is None or engine.admin is None:
            raise SessionError(f"no provisioning for dialect {dialect!r}; known: "
                               f"{', '.join(d.name for d in dialects() if d.admin)}")
        try:
            _ADMINS[dialect] = admin_class(engine)()  # checked against ServerAdmin
        except ImportError as exc:
            raise SessionError(f"the {dialect} driver is not installed: {exc}") from exc
    return _ADMINS[dialect]


class AdminServer:
    """One server seen with one admin account: a holder connection for the liveness locks and a
    few admin connections for creating and dropping."""

    def __init__(self, url: URL) -> None:
        self.url = url._replace(database=None)  # (URL.set ignores None)
        self.ops = admin_ops(dialect_name(url))
        self.lock = threading.Lock()  # guards holder, held, idle
        self.holder: Any = None
        self.held: set[str] = set()
        self.failed: set[str] = set()  # scratch databases whose drop failed (server down): retried
        self.idle: list[Any] = []
        self.last_sweep = -SWEEP_EVERY_S  # the first use sweeps

    def run(self, fn: Any) -> Any:
        """``fn(admin_connection)`` on an idle admin connection (opened when none is idle); a
        connection found dead (the server restarted) is replaced and ``fn`` tried once more."""
        for attempt in (1, 2):
            with self.lock:
                conn = self.idle.pop() if self.idle else None
            if conn is None:
                conn = self.ops.connect(self.url)
            try:
                result = fn(conn)
            except BaseException:
                lost = self.ops.is_lost(conn)
                if lost:  # the server restarted: its other idle connections are dead too
                    with self.lock:
                        dead, self.idle = self.idle, []
                    for other in [conn, *dead]:
                        close_quietly(other)
                else:
                    with self.lock:
                        self.idle.append(conn)
                if attempt == 2 or not lost:
                    raise
                continue
            with self.lock:
                self.idle.append(conn)
            return result
        raise AssertionError("unreachable")

    def hold(self, name: str) -> bool:
        with self.lock:
            for attempt in (1, 2):
                try:
                    if self.holder is None:
                        self.holder = self.ops.connect(self.url)
                        for held in self.held:  # a new holder connection: take the locks again
                            self.ops.hold(self.holder, held)
                    if not self.ops.hold(self.holder, name):
                        return False
                    self.held.add(name)
                    return True
                except Exception:
                    lost = self.holder is None or self.ops.is_lost(self.holder)
                    close_quietly(self.holder)
                    self.holder = None
                    if attempt == 2 or not lost:
                        raise
        return False

    def unhold(self, name: str) -> None:
        with self.lock:
            self.held.discard(name)
            if self.holder is not None:
                try:
                    self.ops.unhold(self.holder, name)
                except Exception:
                    close_quietly(self.holder)
                    self.holder = None
