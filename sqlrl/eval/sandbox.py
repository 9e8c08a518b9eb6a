"""Running BIRD-CRITIC test-case code in a killable child process, plus BIRD-CRITIC's helpers.

BIRD-CRITIC instances carry ``test_cases``: Python source defining
``test_case(pred_sqls, sol_sqls, db_path, conn, conditions)``. That code is written by the dataset's
authors, not by the model, but it is still code we did not write: it may loop forever, crash the
interpreter (``os._exit``), or raise. ``run_test_code`` runs it in a child process and guarantees:

- **Hard timeout.** A watchdog kills the child (SIGKILL to its own process group, so anything it
  forked dies too) ``timeout_s`` after it started, whatever the parent is doing; the child also gets
  an ``RLIMIT_CPU`` slightly above ``timeout_s`` and an address-space cap, so a loop stops even if
  the parent is gone. One SQL statement in flight can overrun the deadline by at most the
  session's own statement timeout (it is stopped by the database).
- **Never raises, never hangs.** A child that dies, raises, times out or speaks nonsense gives a
  ``SandboxOutcome`` with status ``error``/``timeout``; an ``AssertionError`` gives ``failed``.
- **All SQL goes through sqlrl.** The child has no database connection. Its ``conn`` is a proxy
  (DB-API style: ``cursor()``, ``execute``, ``fetchall``/``fetchone``/``fetchmany``,
  ``description``; ``commit``/``rollback``/``close`` are no-ops because the session owns its
  transaction): every statement is sent over a pipe to the parent, which runs it with the
  ``execute`` callable it was given (a ``sqlrl.db`` session: DB-side timeouts, row caps and the
  sandbox rules all apply) and sends back plain rows. Messages are JSON both ways: the parent never
  unpickles anything the child wrote.
- The child's namespace holds BIRD-CRITIC's helpers with their signatures and return values:
  ``execute_queries`` -> ``(result, exec_error, timeout_error)`` (``is_solution=True`` by default as in
  BIRD-CRITIC: errors are flagged only for solution runs; execution continues after an error, as in
  its PostgreSQL/MySQL versions), ``perform_query_on_{sqlite,postgresql,mysql}_databases`` ->
  ``(rows, conn)``, ``ex_base``, ``remove_distinct``, ``remove_comments``, ``remove_round``,
  ``preprocess_results``, ``check_sql_function_usage``, ``performance_compare_by_qep``, plus
  ``pred_query_result``, ``date`` and ``datetime``. ``ex_base`` reports a failing ``sol_sqls`` run
  so the runner can flag the instance (status ``sol-error``) instead of blaming the prediction.
- Processes come from the ``forkserver`` context (``spawn`` where unavailable): never ``fork`` of a
  threaded parent. The fork server preloads this module and sqlglot, so a test case costs one fork
  of a warm process: measured on the shared 2-core dev machine, 26 ms median per test case (one SQL
  round trip included; p90 114 ms under load), ~1 ms per further SQL round trip, ~1 s once per
  parent process to start the fork server; a bare ``spawn`` start is ~80 ms before any import.
  That is why there is no reusable worker: each test case gets a fresh process, so one test case
  cannot leave state behind for the next. As with every spawn/forkserver user, the parent's
  ``__main__`` module is re-imported in the child, so it must be import-safe (guarded by
  ``if __name__ == "__main__"``; pytest and Ray workers are); a child that cannot start gives
  status ``error``.

Not a security boundary: the child runs as the same user and can touch files and the network. It
stops runaway and crashing code; it does not contain hostile code.

BIRD-CRITIC's SQL-rewriting and result-comparison helpers that the child's namespace holds live in
``sqlrl.eval.critic_sql`` (the fork server preloads it too). The child side (the conn proxy, the
namespace, the child's limits and ``_child_main``) lives in ``sqlrl.eval.sandbox_child``, imported
here, so preloading this module preloads it too; its names stay importable from here.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .sandbox_child import (  # noqa: F401  (the child side's names, importable from here as before)
    _CHILD_MEMORY_BYTES, _OUTPUT_TAIL, DatabaseError, ProxyConnection, ProxyCursor, QueryTimeout,
    _call_test_case, _Channel, _child_main, _die_with_parent, _limit_child, _namespace, _raise_for,
    _watch_owner)

_MAX_MESSAGE_BYTES = 256 * 1024 * 1024

# --------------------------------------------------------------------------------------------
# The parent side
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SandboxOutcome:
    """``status``: passed | failed (AssertionError) | error (raised, died, bad protocol) |
    timeout (killed at the deadline) | sol-error (``ex_base`` saw ``sol_sqls`` fail)."""

    status: str
    message: str
    statements: int = 0  # SQL statements the child ran through the parent
    elapsed_ms: float = 0.0


_CTX_LOCK = threading.Lock()
_CTX: Any = None


def _context() -> Any:
    global _CTX
    with _CTX_LOCK:
        if _CTX is None:
            if "forkserver" in mp.get_all_start_methods():
                ctx = mp.get_context("forkserver")
                ctx.set_forkserver_preload([__name__, "sqlrl.eval.critic_sql", "sqlglot"])  # no effect if it already runs
            else:
                ctx = mp.get_context("spawn")
            _CTX = ctx
        return _CTX


def _reply(result: Any) -> bytes:
    error = getattr(result, "error", None)
    kind = None if error is None else getattr(error.kind, "value", str(error.kind))
    return json.dumps({
        "columns": list(result.columns), "rows": [list(r) for r in result.rows],
        "truncated": bool(result.truncated), "affected_rows": result.affected_rows,
        "error_kind": kind, "error_message": None if error is None else error.message,
    }, default=str).encode()


_POLL_S = 0.1


def _bound_sends(conn: Any, timeout_s: float) -> None:
    """Make a blocking send to a child that stopped reading fail after ``timeout_s`` (SO_SNDTIMEO
    on the socket pair; the fd stays blocking) instead of hanging the parent."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return
    try:
        sec = max(1, math.ceil(timeout_s))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", sec, 0))
    except OSError:
        pass
    finally:
        sock.close()


def _kill(proc: Any) -> None:
    if proc.pid is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # exists only once the child ran setsid()
        except (OSError, AttributeError):
            pass
    try:
        proc.kill()
    except Exception:
        pass


def run_test_code(code: str, execute: Callable[[str], Any], *, pred_sqls: Sequence[str],
                  sol_sqls: Sequence[str], db_path: str, conditions: dict[str, Any],
                  pred_query_result: Any, dialect: str, timeout_s: float) -> SandboxOutcome:
    """Run one test case's code in a fresh child process; ``execute(sql)`` runs the child's SQL
    (it must return a ``QueryResult``-like object and never raise). Never raises."""
    t0 = time.perf_counter()

    def outcome(status: str, message: str, statements: int = 0) -> SandboxOutcome:
        return SandboxOutcome(status, message, statements, (time.perf_counter() - t0) * 1e3)

    try:
        job = json.dumps({
            "code": code, "pred_sqls": list(pred_sqls), "sol_sqls": list(sol_sqls),
            "db_path": db_path, "conditions": conditions, "dialect": dialect,
            "pred_query_result": None if pred_query_result is None
            else [list(r) for r in pred_query_result]}, default=str)
        ctx = _context()
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=_child_main, args=(child, job, max(1, math.ceil(timeout_s)) + 2, os.getpid()),
                           daemon=True, name="sqlrl-critic-test")
        proc.start()
    except Exception as exc:
        return outcome("error", f"could not start the test-case process: {type(exc).__name__}: {exc}")
    child.close()
    killed = threading.Event()

    def watchdog() -> None:
        killed.set()
        _kill(proc)

    timer = threading.Timer(timeout_s, watchdog)
    timer.daemon = True
    timer.start()
    _bound_sends(parent, timeout_s)
    statements = 0
    timed_out = f"test case killed after {timeout_s:g} s"
    try:
        while True:
            # Poll rather than block: a descendant the test code moved out of reach could hold the
            # pipe open after the child died, and recv would then wait forever.
            if killed.is_set():
                return outcome("timeout", timed_out, statements)
            if not parent.poll(_POLL_S):
                if not proc.is_alive() and not parent.poll(0):
                    if killed.is_set():  # the watchdog fired while we were polling
                        return outcome("timeout", timed_out, statements)
                    return outcome("error", f"test-case process died (exit code {proc.exitcode})",
                                   statements)
                continue
            try:
                msg = json.loads(parent.recv_bytes(_MAX_MESSAGE_BYTES))
            except (EOFError, OSError):
                proc.join(1.0)
                if killed.is_set():
                    return outcome("timeout", timed_out, statements)
                return outcome("error", f"test-case process died (exit code {proc.exitcode})",
                               statements)
            except ValueError as exc:
                _kill(proc)
                return outcome("error", f"test-case process sent a malformed message: {exc}",
                               statements)
            if isinstance(msg, list) and len(msg) == 2 and msg[0] == "sql" and isinstance(msg[1], str):
                statements += 1
                try:
                    parent.send_bytes(_reply(execute(msg[1])))
                except (OSError, ValueError):  # the child is gone or stopped reading
                    _kill(proc)
                    return outcome("timeout" if killed.is_set() else "error",
                                   timed_out if killed.is_set() else
                                   "test-case process stopped reading replies", statements)
            elif isinstance(msg, list) and len(msg) == 4 and msg[0] == "done":
                proc.join(1.0)
                if proc.is_alive():
                    _kill(proc)
                if killed.is_set():
                    return outcome("timeout", timed_out, statements)
                return outcome(str(msg[1]), str(msg[2]), statements)
            else:
                _kill(proc)
                return outcome("error", f"test-case process sent an unknown message: {str(msg)[:200]}",
                               statements)
    finally:
        timer.cancel()
        parent.close()
        if proc.is_alive():
            _kill(proc)
        proc.join(5.0)
