"""The sandbox's child side: what runs inside the process ``sandbox.run_test_code`` starts.

``_child_main`` (the ``Process`` target, importable by its module path so the ``forkserver`` or
``spawn`` child can load it) limits itself, runs one BIRD-CRITIC test case's code and sends one
``["done", status, message, statements]`` reply. ``sandbox.py`` (the parent side and the public
entry point) imports these names back; the fork server preloads this module through it.

Guarantees:
- The test code's ``conn`` is a ``ProxyConnection``: every statement goes over the channel to the
  parent as ``["sql", text]`` JSON and comes back as plain rows (``commit``/``rollback``/``close``
  are no-ops; query parameters raise ``NotImplementedError``); a failed statement raises
  ``DatabaseError`` (``QueryTimeout`` for a timeout) with sqlrl's error kind.
- The namespace holds BIRD-CRITIC's helpers with their signatures and return values (listed in
  ``sandbox.py``'s docstring); ``ex_base`` records a failing ``sol_sqls`` run, reported as
  ``sol-error``.
- The child limits itself before running anything: its own process group (``setsid``), SIGKILL
  when the fork server exits (Linux), ``RLIMIT_CPU`` at ``cpu_s`` and a 4 GiB address-space cap,
  and a daemon thread that kills the process group once the owner process is gone.
- Whatever the test code does short of killing the process, exactly one ``done`` message is sent:
  ``passed``, ``failed`` (AssertionError), ``error`` (anything else raised, SystemExit included)
  or ``sol-error``; a non-passing message carries the last ``_OUTPUT_TAIL`` characters the code
  printed.
"""

from __future__ import annotations

import builtins
import inspect
import io
import json
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Sequence

from .critic_sql import (check_sql_function_usage, preprocess_results, remove_comments_sql,
                         remove_distinct_sql, remove_round_sql, results_match)

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
