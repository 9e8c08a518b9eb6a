"""Scratch databases prepared ahead: one database and one login role per session on the server
engines (PostgreSQL, MariaDB/MySQL), process-wide.

A session URL of a server engine names a base and carries admin credentials
(``provision.session_url``). ``SCRATCH.take(url, limits, adapter)`` returns an agent connection:
logged in as a role/user created for this session alone, on a database cloned from the base
(``admin.admin_ops(dialect).create_scratch``), with the session's limits applied by the
adapter (``adapter.open_agent``); an admin with ``contract.CloneHandOver`` (PostgreSQL) then
finishes the clone on that login and takes back, and verifies gone, every temporary right the
role had for it (``hand_over``) before the connection can be handed out.
``SCRATCH.give_back(conn)`` closes it and drops the database and the role. The admin connections never run agent SQL. ``SCRATCH`` registers itself as the
adapters' ``contract.CloneSource`` when imported (``dialects.base.use_clone_source``).

Guarantees:
- A connection handed out by ``take`` is used by one session only and never handed out again;
  its database and role are dropped after ``give_back`` (in the background), so nothing a session
  did — DDL, DML, sequences, settings of its role, its password — reaches a later session.
- **Prepared ahead**: once a base has been taken twice, up to ``prefill`` clones of it (with the
  same limits) are kept ready, refilled in the background after every take, at most ``max_ready``
  over all bases (the least recently used base's ready clones are dropped first). A take from the
  ready queue costs one ping; an empty queue prepares the clone on the spot.
- **No leaks across crashes**: the process holds a lock named after every scratch database it
  created (PostgreSQL advisory lock, MariaDB ``GET_LOCK``) on one admin connection per server; the
  first use of a server, and then every ``SWEEP_EVERY_S``, drops scratch databases and roles whose
  lock is free (their process died). At interpreter exit the ready clones are dropped.
- ``forget(url, base)`` (``provision.drop_database``) stops refilling that base, waits for clones
  being made from it, and drops its ready clones, so the base can be dropped.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL

from ..dialects.base import close_quietly, use_clone_source
from ..dialects.contract import SCRATCH_PREFIX, AgentLogin, hands_over
from ..types import Limits, SessionError
from ..url import dialect_name, parse_url, redact
from .admin import SWEEP_EVERY_S, AdminServer

FORGET_WAIT_S = 60.0


@dataclass(frozen=True)
class ScratchStats:
    prepared: int = 0  # scratch databases created
    prepare_errors: int = 0
    ready_hits: int = 0  # takes served from the ready queue
    misses: int = 0  # takes that prepared on the spot
    stale: int = 0  # ready clones found dead at take (server restarted) and replaced
    dropped: int = 0
    drop_errors: int = 0
    orphans_dropped: int = 0  # another (dead) process's scratch databases
    ready: int = 0  # ready now, over all bases
    live: int = 0  # handed out and not yet given back
    prepare_ms: tuple[float, ...] = ()  # the last 256 preparations (clone + connect)


@dataclass
class _Item:
    name: str
    conn: Any
    source: "_Source"


@dataclass
class _Source:
    server: AdminServer
    url: URL  # the session URL (admin credentials, the base as database)
    base: str
    limits: Limits
    adapter: AgentLogin
    ready: collections.deque = field(default_factory=collections.deque)
    takes: int = 0
    preparing: int = 0
    base_bytes: int | None = None
    last_used: float = 0.0
    forgotten: bool = False


class ScratchManager:
    def __init__(self, prefill: int = 2, max_ready: int = 16, threads: int = 2) -> None:
        self.prefill = prefill
        self.max_ready = max_ready
        self._threads = threads
        self._lock = threading.Condition()
        self._servers: dict[tuple[Any, ...], AdminServer] = {}
        self._sources: dict[tuple[Any, ...], _Source] = {}
        self._live: dict[int, _Item] = {}
        self._counts: collections.Counter = collections.Counter()
        self._prepare_ms: collections.deque = collections.deque(maxlen=256)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending = 0  # background jobs queued or running
        self._pid = os.getpid()

    def configure(self, prefill: int | None = None, max_ready: int | None = None) -> None:
        """Change how many clones are kept ready (per base, and over all bases)."""
        with self._lock:
            if prefill is not None:
                self.prefill = max(0, int(prefill))
            if max_ready is not None:
                self.max_ready = max(0, int(max_ready))

    # -- sessions ----------------------------------------------------------------------------------

    def take(self, url: str | URL, limits: Limits, adapter: Any) -> Any:
        """An agent connection on a fresh clone of ``url``'s database. Raises ``SessionError``."""
        source = self._source(parse_url(url), limits, adapter)
        while True:
            with self._lock:
                item = source.ready.popleft() if source.ready else None
                source.takes += 1
                source.last_used = time.monotonic()
            if item is None:
                break
            if adapter.ping(item.conn):
                with self._lock:
                    self._counts["ready_hits"] += 1
                    self._live[id(item.conn)] = item
                self._refill(source)
                return item.conn
            with self._lock:
                self._counts["stale"] += 1
            self._background(self._drop, item)
        with self._lock:
            self._counts["misses"] += 1
            source.preparing += 1
        try:
            item = self._prepare(source)
        finally:
            with self._lock:
                source.preparing -= 1
                self._lock.notify_all()
        with self._lock:
            self._live[id(item.conn)] = item
        self._refill(source)
        return item.conn

    def give_back(self, conn: Any) -> bool:
        """Close ``conn`` and drop its database and role (in the background). False when ``conn``
        did not come from ``take`` (it is closed all the same)."""
        with self._lock:
            item = self._live.pop(id(conn), None)
        if item is None:
            _close(conn)
            return False
        self._background(self._drop, item)
        return True

    def forget(self, url: str | URL, base: str) -> None:
        """Stop preparing clones of ``base`` and drop the ready ones (before dropping the base)."""
        parsed = parse_url(url)
        key = _server_key(parsed)
        with self._lock:
            sources = [s for k, s in self._sources.items() if k[0] == key and s.base == base]
            for source in sources:
                source.forgotten = True
            deadline = time.monotonic() + FORGET_WAIT_S
            while any(s.preparing for s in sources) and time.monotonic() < deadline:
                self._lock.wait(0.1)
            items = [source.ready.popleft() for source in sources for _ in range(len(source.ready))]
            for source in sources:
                self._sources.pop(_source_key(source.url, source.limits), None)
        for item in items:
            self._drop(item)

    def stats(self) -> ScratchStats:
        with self._lock:
            return ScratchStats(
                ready=sum(len(s.ready) for s in self._sources.values()), live=len(self._live),
                prepare_ms=tuple(self._prepare_ms), **dict(self._counts))

    def sweep(self, url: str | URL) -> int:
        """Drop now the scratch databases and roles on ``url``'s server whose owning process is
        gone (``url``: an admin URL); returns how many. Also runs on its own at first use of a
        server and every ``SWEEP_EVERY_S``."""
        server = AdminServer(parse_url(url))
        try:
            before = self.stats().orphans_dropped
            self._sweep(server)
            return self.stats().orphans_dropped - before
        finally:
            for conn in [server.holder, *server.idle]:
                _close(conn)

    def held_names(self) -> set[str]:
        """The scratch databases this process owns now (ready, being prepared, or in use)."""
        with self._lock:
            servers = list(self._servers.values())
        names: set[str] = set()
        for server in servers:
            with server.lock:
                names |= server.held
        return names

    def settle(self, timeout_s: float = 60.0) -> bool:
        """Wait until no background work (prepare, drop, sweep) is queued or running; False if
        it did not settle within ``timeout_s``. For tests and benchmarks."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def shutdown(self) -> None:
        """Drop every clone of this process, ready or still in use (at interpreter exit)."""
        if os.getpid() != self._pid:
            return  # a forked child does not own the parent's clones
        with self._lock:
            items = [s.ready.popleft() for s in self._sources.values() for _ in range(len(s.ready))]
            items += list(self._live.values())
            self._live.clear()
            for source in self._sources.values():
                source.forgotten = True
        for item in items:
            self._drop(item)
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    # -- internals ---------------------------------------------------------------------------------

    def _source(self, url: URL, limits: Limits, adapter: Any) -> _Source:
        if not url.database:
            raise SessionError(f"a {dialect_name(url)} session URL must name its base database")
        key = _source_key(url, limits)
        with self._lock:
            source = self._sources.get(key)
            if source is not None:
                return source
            server = self._servers.get(key[0])
        if server is None:  # first use of this server: check the admin and the server's settings
            server = AdminServer(url)
            server.ops.prepare_server(server.url)
            with self._lock:
                server = self._servers.setdefault(key[0], server)
        with self._lock:
            source = self._sources.setdefault(key, _Source(server, url, url.database, limits,
                                                           adapter))
        self._maybe_sweep(server)
        return source

    def _prepare(self, source: _Source) -> _Item:
        t0 = time.perf_counter()
        server, ops = source.server, source.server.ops
        name = f"{SCRATCH_PREFIX}{secrets.token_hex(6)}"
        password = secrets.token_urlsafe(18)
        created = False
        conn = None
        try:
            if not server.hold(name):
                raise SessionError("a scratch database name collided; try again")
            if source.base_bytes is None:
                source.base_bytes = server.run(lambda admin: ops.base_size(admin, source.base))
            created = True
            server.run(lambda admin: ops.create_scratch(admin, source.base, name, password,
                                                        source.base_bytes))
            agent_url = source.url.set(username=name, password=password, database=name)
            conn = source.adapter.open_agent(agent_url, source.limits)
            if hands_over(ops):  # finished on the session's login; temporary rights taken back
                server.run(lambda admin: ops.hand_over(admin, conn, name))
        except BaseException as exc:
            with self._lock:
                self._counts["prepare_errors"] += 1
            self._drop(_Item(name, conn, source), count=False, created=created)
            if isinstance(exc, SessionError):
                raise
            raise SessionError(f"cannot prepare a scratch database of {redact(source.url)}: "
                               f"{' '.join(str(exc).split()) or type(exc).__name__}") from exc
        with self._lock:
            self._counts["prepared"] += 1
            self._prepare_ms.append((time.perf_counter() - t0) * 1e3)
        return _Item(name, conn, source)

    def _refill(self, source: _Source) -> None:
        with self._lock:
            if source.forgotten or source.takes < 2:
                return  # a base taken once may never be taken again: no clones ahead
            want = self.prefill - len(source.ready) - source.preparing
            room = self.max_ready - sum(len(s.ready) + s.preparing for s in self._sources.values())
            evict: list[_Item] = []
            if want > 0 and room < want:  # make room: the least recently used bases go first
                for other in sorted(self._sources.values(), key=lambda s: s.last_used):
                    while other is not source and other.ready and room < want:
                        evict.append(other.ready.pop())
                        room += 1
            n = max(0, min(want, room))
            source.preparing += n
        for item in evict:
            self._background(self._drop, item)
        for _ in range(n):
            self._background(self._prepare_ready, source)

    def _prepare_ready(self, source: _Source) -> None:
        try:
            item = self._prepare(source)
        except Exception:
            item = None  # counted; the next take prepares on the spot and reports the error
        with self._lock:
            source.preparing -= 1
            keep = item is not None and not source.forgotten
            if keep:
                source.ready.append(item)
            self._lock.notify_all()
        if item is not None and not keep:
            self._drop(item)

    def _drop(self, item: _Item, count: bool = True, created: bool = True) -> None:
        server = item.source.server
        _close(item.conn, item.source.adapter)
        try:
            if created:
                server.run(lambda admin: server.ops.drop_scratch(admin, item.name))
            ok = True
        except Exception:
            ok = False  # retried after the server's next successful drop (or by a sweep)
        server.unhold(item.name)
        with self._lock:
            if count:
                self._counts["dropped" if ok else "drop_errors"] += 1
        with server.lock:
            if not ok:
                server.failed.add(item.name)
            retry = ok and bool(server.failed)
            if retry:
                failed, server.failed = server.failed, set()
        if retry:  # the server answers again: drop what could not be dropped before
            for name in failed:
                self._background(self._drop, _Item(name, None, item.source))
        self._maybe_sweep(server)

    def _maybe_sweep(self, server: AdminServer) -> None:
        with server.lock:
            due = time.monotonic() - server.last_sweep >= SWEEP_EVERY_S
            if due:
                server.last_sweep = time.monotonic()
        if due:
            self._background(self._sweep, server)

    def _sweep(self, server: AdminServer) -> None:
        """Drop scratch databases and roles on ``server`` whose owning process is gone."""
        try:
            names = server.run(lambda admin: server.ops.scratch_names(admin, SCRATCH_PREFIX))
        except Exception:
            return
        for name in names:
            if name in server.held or not server.hold(name):
                continue  # ours, or held by a live process
            try:
                server.run(lambda admin, name=name: server.ops.drop_scratch(admin, name))
                with self._lock:
                    self._counts["orphans_dropped"] += 1
            except Exception:
                pass
            finally:
                server.unhold(name)

    def _background(self, fn: Any, *args: Any) -> None:
        def job() -> None:
            try:
                fn(*args)
            finally:
                with self._lock:
                    self._pending -= 1
                    self._lock.notify_all()

        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self._threads, thread_name_prefix="sqlrl-scratch")
            executor = self._executor
            self._pending += 1
        try:
            executor.submit(job)
        except RuntimeError:  # interpreter shutting down: do it here
            job()


def _server_key(url: URL) -> tuple[Any, ...]:
    return (dialect_name(url), url.host, url.port, url.username)


def _source_key(url: URL, limits: Limits) -> tuple[Any, ...]:
    return (_server_key(url), url.database, limits, tuple(sorted(url.query.items())))


def _close(conn: Any, adapter: Any = None) -> None:
    """Close an agent connection through its adapter (quietly: it may be dead already)."""
    if conn is not None and adapter is not None:
        try:
            adapter.close_agent(conn)
        except Exception:
            pass
    elif conn is not None:
        close_quietly(conn)


SCRATCH = ScratchManager(prefill=int(os.environ.get("SQLRL_SCRATCH_PREFILL", "2")),
                         max_ready=int(os.environ.get("SQLRL_SCRATCH_MAX_READY", "16")),
                         threads=int(os.environ.get("SQLRL_SCRATCH_THREADS", "2")))
atexit.register(SCRATCH.shutdown)
use_clone_source(SCRATCH)  # server-clone adapters take their connections from it (base.clone_source)
