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
``sqlrl.eval.critic_sql`` (the fork server preloads it too).
"""

from __future__ import annotations

import builtins
import inspect
import io
import json
import math
import multiprocessing as mp
import os
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .critic_sql import (check_sql_function_usage, preprocess_results, remove_comments_sql,
                         remove_distinct_sql, remove_round_sql, results_match)

_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
_CHILD_MEMORY_BYTES = 4 * 1024 * 1024 * 1024
_OUTPUT_TAIL = 600

# --------------------------------------------------------------------------------------------
# The child side: conn proxy and BIRD-CRITIC's helper namespace
# --------------------------------------------------------------------------------------------

class DatabaseError(Exception):
    """A statement the test case sent failed; ``kind`` is sqlrl's ErrorKind value."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class QueryTimeout(DatabaseError):
    """The statement ran past the session's timeout and was stopped by the database."""


class _Channel:
    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.statements = 0

    def execute(self, sql: str) -> dict[str, Any]:
        if not isinstance(sql, str):
            raise TypeError(f"SQL must be a string, got {type(sql).__name__}")
        self.statements += 1
        self._conn.send_bytes(json.dumps(["sql", sql]).encode())
        reply = json.loads(self._conn.recv_bytes())
        reply["rows"] = [tuple(r) for r in reply["rows"]]
        return reply


def _raise_for(reply: dict[str, Any]) -> None:
    if reply["error_kind"] is not None:
        cls = QueryTimeout if reply["error_kind"] == "timeout" else DatabaseError
        raise cls(reply["error_kind"], reply["error_message"])


class ProxyCursor:
    arraysize = 1

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel
        self._rows: list[tuple[Any, ...]] = []
        self._pos = 0
        self.description: tuple[tuple[Any, ...], ...] | None = None
        self.rowcount = -1

    def execute(self, sql: str, params: Any = None) -> "ProxyCursor":
        if params:
            raise NotImplementedError("query parameters are not supported by the sandbox's conn "
                                      "proxy; put the values in the SQL text")
        reply = self._channel.execute(sql)
        _raise_for(reply)
        self._rows, self._pos = reply["rows"], 0
        cols = reply["columns"]
        self.description = tuple((c, None, None, None, None, None, None) for c in cols) or None
        affected = reply.get("affected_rows")
        self.rowcount = affected if affected is not None else (len(self._rows) if cols else -1)
        return self

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._pos = self._rows[self._pos:], len(self._rows)
        return rows

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._pos >= len(self._rows):
            return None
        self._pos += 1
        return self._rows[self._pos - 1]

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        n = self.arraysize if size is None else size
        rows = self._rows[self._pos:self._pos + n]
        self._pos += len(rows)
        return rows

    def __iter__(self) -> Any:
        while (row := self.fetchone()) is not None:
            yield row

    def close(self) -> None:
        pass

    def __enter__(self) -> "ProxyCursor":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class ProxyConnection:
    """What test code gets as ``conn``: every statement runs in the test case's sqlrl session."""

    autocommit = True

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel

    def cursor(self, *args: Any, **kwargs: Any) -> ProxyCursor:
        return ProxyCursor(self._channel)

    def execute(self, sql: str, params: Any = None) -> ProxyCursor:  # sqlite3's shortcut
        return self.cursor().execute(sql, params)

    def commit(self) -> None:  # the session owns its (scratch) transaction
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "ProxyConnection":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _namespace(channel: _Channel, job: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    dialect = job["dialect"]
    proxy = ProxyConnection(channel)

    def perform_query(query: str, db_path: Any = None, conn: Any = None, *args: Any, **kwargs: Any):
        reply = channel.execute(query)
        _raise_for(reply)
        return (reply["rows"] if reply["columns"] else None), proxy

    def execute_queries(queries: Any, db_path: Any = None, conn: Any = None, logger: Any = None,
                        section_title: str = "", is_solution: bool = True, **kwargs: Any):
        result, exec_error, timeout_error = None, False, False
        for query in [queries] if isinstance(queries, str) else list(queries or ()):
            try:
                result, _ = perform_query(query)
            except QueryTimeout:
                if is_solution:
                    timeout_error = True
            except Exception as exc:  # DatabaseError, bad input: BIRD-CRITIC catches them all
                if is_solution:
                    exec_error = str(exc) or type(exc).__name__
        return result, exec_error, timeout_error

    def ex_base(pred_sqls: Any, sol_sqls: Any, db_path: Any = None, conn: Any = None,
                conditions: Any = None) -> int:
        if not pred_sqls or not sol_sqls:
            return 0
        pred_res, pred_err, pred_to = execute_queries(pred_sqls, db_path, conn)
        sol_res, sol_err, sol_to = execute_queries(sol_sqls, db_path, conn)
        if sol_err or sol_to:
            state["sol_failed"] = f"sol_sqls failed in ex_base: {sol_err or 'timeout'}"
        if any([pred_err, pred_to, sol_err, sol_to]):
            return 0
        order = bool(conditions is not None and conditions.get("order", False))
        return int(results_match(pred_res, sol_res, order))

    def performance_compare_by_qep(old_sqls: Any, sol_sqls: Any, db_path: Any = None,
                                   conn: Any = None) -> int:
        """BIRD-CRITIC's plan-cost comparison: 1 when ``sol_sqls``' summed EXPLAIN cost is lower.
        Each DML statement's cost is its engine's ``Dialect.plan_cost`` (PostgreSQL: ``Total
        Cost`` of ``EXPLAIN (FORMAT JSON)``; SQLite: 1.0 per statement, as BIRD-CRITIC's SQLite
        version does); non-DML statements are executed. Unlike
        BIRD-CRITIC there is no BEGIN/ROLLBACK between the two sides (the session owns its
        transaction), so old_sqls' DDL is visible to sol_sqls."""
        if not old_sqls or not sol_sqls:
            return 0

        from sqlrl.db.dialects.descriptor import by_sqlglot

        engine = by_sqlglot(dialect)
        plan_cost = engine.plan_cost if engine is not None else None

        def cost(sqls: Sequence[str]) -> float:
            total = 0.0
            for sql in sqls:
                if not sql.strip().upper().startswith(("SELECT", "INSERT", "UPDATE", "DELETE")):
                    try:
                        perform_query(sql)
                    except DatabaseError:
                        pass
                    continue
                if plan_cost is None:
                    raise NotImplementedError(f"performance_compare_by_qep is not implemented "
                                              f"for {dialect}")
                total += plan_cost(lambda text: perform_query(text)[0], sql)
            return total

        return int(cost(sol_sqls) < cost(old_sqls))

    def logger_free(fn: Callable[..., list[str]]) -> Callable[..., list[str]]:
        def helper(sql_list: Any) -> list[str]:
            return [fn(s, dialect) for s in ([sql_list] if isinstance(sql_list, str) else sql_list)]
        return helper

    ns: dict[str, Any] = {
        "__name__": "bird_critic_test_case", "__builtins__": builtins,
        "execute_queries": execute_queries, "ex_base": ex_base,
        "perform_query_on_sqlite_databases": perform_query,
        "perform_query_on_postgresql_databases": perform_query,
        "perform_query_on_mysql_databases": perform_query,
        "performance_compare_by_qep": performance_compare_by_qep,
        "check_sql_function_usage": check_sql_function_usage,
        "remove_distinct": logger_free(remove_distinct_sql),
        "remove_comments": logger_free(remove_comments_sql),
        "remove_round": logger_free(remove_round_sql),
        "preprocess_results": preprocess_results,
        "pred_query_result": job["pred_query_result"],
        "DatabaseError": DatabaseError, "QueryTimeout": QueryTimeout,
    }
    return ns


def _call_test_case(fn: Callable[..., Any], args: tuple[Any, ...], conditions: Any) -> Any:
    """BIRD-CRITIC's SQLite harness calls ``test_case(pred, sol, db_path, conn, conditions=...)``,
    its PostgreSQL one ``test_case(pred, sol, db_name, conn)``: pass ``conditions`` when the
    function can take it."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return fn(*args, conditions)
    named = {p.name: p for p in params}
    if (("conditions" in named and named["conditions"].kind != inspect.Parameter.POSITIONAL_ONLY)
            or any(p.kind == p.VAR_KEYWORD for p in params)):
        return fn(*args, conditions=conditions)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) > len(args) or any(p.kind == p.VAR_POSITIONAL for p in params):
        return fn(*args, conditions)
    return fn(*args)


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when the process that forked it (the forkserver) exits."""
    try:
        import ctypes
        import signal as _signal

        parent = os.getppid()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(_signal.SIGKILL), 0, 0, 0) == 0 and os.getppid() != parent:
            os._exit(1)  # the parent died before the request took effect
    except (OSError, AttributeError):
        pass  # not Linux: the watchdog and the CPU limit still bound the child


def _limit_child(cpu_s: int) -> None:
    try:
        os.setsid()  # own process group: the parent's kill reaches anything this child forks
    except OSError:
        pass
    _die_with_parent()
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (_CHILD_MEMORY_BYTES, _CHILD_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass


def _watch_owner(owner_pid: int, interval_s: float = 0.25) -> None:
    """Kill this child's process group as soon as its owner (the process that asked for the test
    case) is gone — a reward actor killed by Ray, a crashed evaluator — so test-case code never
    runs on as an orphan. (The forkserver, our real parent, outlives the owner for as long as any
    of its children holds the owner's liveness pipe, so the parent-death signal alone is not
    enough.) A daemon thread: it gets the GIL even while the test code spins in Python."""
    def loop() -> None:
        while True:
            time.sleep(interval_s)
            try:
                os.kill(owner_pid, 0)
            except ProcessLookupError:
                try:
                    os.killpg(0, signal.SIGKILL)
                finally:
                    os._exit(1)
            except OSError:
                pass

    threading.Thread(target=loop, name="sqlrl-owner-watch", daemon=True).start()


def _child_main(conn: Any, job_text: str, cpu_s: int, owner_pid: int | None = None) -> None:
    _limit_child(cpu_s)
    if owner_pid is not None:
        _watch_owner(owner_pid)
    channel = _Channel(conn)
    job = json.loads(job_text)
    state: dict[str, Any] = {}
    captured = io.StringIO()
    sys.stdout = sys.stderr = captured
    try:
        ns = _namespace(channel, job, state)
        code = "import datetime\nfrom datetime import date\n" + job["code"]
        exec(compile(code, "<test_case>", "exec"), ns)
        fn = ns.get("test_case")
        if not callable(fn):
            raise NameError("the test case code defines no function test_case(...)")
        pred = list(job["pred_sqls"])
        sol = list(job["sol_sqls"])
        _call_test_case(fn, (pred, sol, job["db_path"], ProxyConnection(channel)), job["conditions"])
        status, message = "passed", ""
    except AssertionError as exc:
        status, message = "failed", f"assertion failed: {exc}".rstrip(": ")
    except BaseException as exc:  # SystemExit, KeyboardInterrupt, anything the test code raised
        status, message = "error", f"{type(exc).__name__}: {exc}"
    if status != "passed" and state.get("sol_failed"):
        status, message = "sol-error", f"{state['sol_failed']} ({message})"
    out = captured.getvalue()
    if status != "passed" and out.strip():
        message += f"\n[test output, last {_OUTPUT_TAIL} chars]\n{out[-_OUTPUT_TAIL:]}"
    conn.send_bytes(json.dumps(["done", status, message, channel.statements]).encode())
    conn.close()


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
