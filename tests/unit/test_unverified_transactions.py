"""The SQL Server and Oracle adapters' transaction logic (both UNVERIFIED against real servers;
docs/unverified_dialects.md), through the real ``Session`` and executor, on pretend servers that
**interpret** what they are sent rather than match the adapter's SQL strings.

Each pretend server keeps a recorded state (a table ``t`` of ints, @@TRANCOUNT / XACT_STATE()
and named savepoints for SQL Server, the transaction's base, savepoints and private temporary
tables for Oracle, SET options, logins' privileges) and reads every text it receives by SQL's
meaning: statements parsed by sqlglot (SELECT, INSERT, UPDATE, DELETE, DROP, evaluated on the
state) and the transaction statements by their T-SQL / Oracle grammar (BEGIN TRAN, SAVE TRAN,
ROLLBACK [TO] <savepoint>, IF <condition> <statement> ELSE <statement>, RAISERROR, SET). The
tests then assert on the state: what survived, what was undone, what the session saw. An adapter
that sent different SQL with the same meaning passes; one whose SQL means something else fails.

Faults are injected by what a statement *is* (``Fault``: a predicate on the parsed statement),
with the server-side effect a real server would have: the statement's own partial work, the
transaction rolled back by the server (deadlock victim), or left uncommittable.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import oracledb
import oracledb.errors as ora_errors
import pyodbc
import pytest
import sqlglot
from oracledb.errors import _create_exception
from sqlglot import exp

from sqlrl.db import ErrorKind, Limits, SessionError, open_session
from sqlrl.db.dialects import get_dialect, mssql, oracle
from sqlrl.db.sessions.session import Session
from sqlrl.db.url import parse_url

from .test_unverified_dialects import odbc, ora


# --- a pretend server's state and expression evaluator (shared by both engines) -----------------

@dataclass
class Fault:
    """Make the first statement for which ``when(parsed)`` holds raise ``error``, after
    ``effect``: None, "partial" (it changed ``t`` first), "abort" (the server rolled the
    transaction back), "doom" (SQL Server: XACT_STATE() = -1), "commit" (Oracle: the transaction
    ended). ``times``: how many statements it hits."""

    when: Callable[[exp.Expression], bool]
    error: BaseException
    effect: str | None = None
    times: int = 1


def is_(kind: type, table: str | None = None) -> Callable[[exp.Expression], bool]:
    return lambda e: isinstance(e, kind) and (table is None or (
        e.find(exp.Table) is not None and e.find(exp.Table).name.lower() == table))


@dataclass
class State:
    dialect: str
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {
        "t": [{"x": 1}, {"x": 2}, {"x": 3}]})
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)
    ran: list[exp.Expression] = field(default_factory=list)  # user statements that ran

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        return {k: [dict(r) for r in v] for k, v in self.tables.items()}

    @property
    def t(self) -> list[int]:
        return [r["x"] for r in self.tables["t"]]

    def table(self, name: str) -> list[dict[str, Any]]:
        return self.tables[name.lower()]

    def fault(self, parsed: exp.Expression) -> Fault | None:
        for f in self.faults:
            if f.times and f.when(parsed):
                f.times -= 1
                return f
        return None

    # -- statements sqlglot parses -------------------------------------------------------------

    def run_sql(self, text: str, divide_by_zero: Callable[[], BaseException]) -> tuple[Any, ...]:
        """(columns, rows) of a query, or (None, rowcount) of a DML statement."""
        e = sqlglot.parse_one(text, read=self.dialect)
        self.ran.append(e)
        env = Eval(self, divide_by_zero)
        if isinstance(e, exp.Select):
            frm = next((v for v in e.args.values() if isinstance(v, exp.From)), None)
            rows = self.table(frm.this.name) if frm is not None else [{}]
            where = e.args.get("where")
            rows = [r for r in rows if where is None or env.value(where.this, r)]
            columns = [p.alias_or_name for p in e.expressions]
            return columns, [tuple(env.value(p, r) for p in e.expressions) for r in rows]
        table = self.table(e.find(exp.Table).name)
        where = e.args.get("where")
        hit = [r for r in table if where is None or env.value(where.this, r)]
        if isinstance(e, exp.Insert):
            names = list(table[0]) if table else ["x"]
            for row in e.expression.expressions:
                table.append(dict(zip(names, (env.value(v, {}) for v in row.expressions))))
            return None, len(e.expression.expressions)
        if isinstance(e, exp.Update):
            for r in hit:
                r.update({s.this.name: env.value(s.expression, dict(r)) for s in e.expressions})
            return None, len(hit)
        if isinstance(e, exp.Delete):
            table[:] = [r for r in table if r not in hit]
            return None, len(hit)
        raise AssertionError(f"the pretend server cannot run {text!r}")


class Eval:
    def __init__(self, state: State, divide_by_zero: Callable[[], BaseException]) -> None:
        self.state, self.divide_by_zero = state, divide_by_zero

    def value(self, e: exp.Expression, row: dict[str, Any]) -> Any:
        v = lambda x: self.value(x, row)  # noqa: E731
        if isinstance(e, (exp.Alias, exp.Paren)):
            return v(e.this)
        if isinstance(e, exp.Literal):
            return e.this if e.is_string else (int(e.this) if e.is_int else float(e.this))
        if isinstance(e, exp.Null):
            return None
        if isinstance(e, exp.Column):
            name = e.name.lower()
            return row[name] if name in row else self.state.functions[e.name.upper()]()
        if isinstance(e, exp.Parameter):  # T-SQL's @@TRANCOUNT
            return self.state.functions[e.sql("tsql").upper()]()
        if isinstance(e, (exp.Anonymous, exp.Func)) and not isinstance(e, exp.Binary):
            name = (e.name if isinstance(e, exp.Anonymous) else e.sql_name()).upper()
            return self.state.functions[name](*[v(a) for a in e.expressions])
        if isinstance(e, exp.Div) and v(e.expression) == 0:
            raise self.divide_by_zero()
        ops = {exp.Add: lambda a, b: a + b, exp.Sub: lambda a, b: a - b,
               exp.Mul: lambda a, b: a * b, exp.Div: lambda a, b: a / b,
               exp.EQ: lambda a, b: a == b, exp.NEQ: lambda a, b: a != b,
               exp.GT: lambda a, b: a > b, exp.GTE: lambda a, b: a >= b,
               exp.LT: lambda a, b: a < b, exp.LTE: lambda a, b: a <= b,
               exp.And: lambda a, b: a and b, exp.Or: lambda a, b: a or b}
        if type(e) in ops:
            return ops[type(e)](v(e.this), v(e.expression))
        if isinstance(e, exp.Not):
            return not v(e.this)
        raise AssertionError(f"the pretend server cannot evaluate {e.sql()!r}")


def parse(text: str, dialect: str) -> exp.Expression:
    """``text`` as sqlglot parses it (a ``Command`` when it cannot)."""
    try:
        return sqlglot.parse_one(text, read=dialect)
    except sqlglot.errors.ParseError:
        return exp.Command(this=text)


def words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z_@$#][\w@$#]*", text.upper())


# --- SQL Server: a T-SQL batch interpreter ------------------------------------------------------

class Row(tuple):
    """pyodbc returns Row objects, not tuples (the adapter converts them)."""


@dataclass
class ResultSet:
    columns: list[str] | None = None
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    rowcount: int = -1


_STARTS = {"SELECT", "INSERT", "UPDATE", "DELETE", "IF", "ELSE", "BEGIN", "ROLLBACK", "COMMIT",
           "SAVE", "RAISERROR", "SET", "WAITFOR", "PRINT"}


class TSQLServer(State):
    """One SQL Server session's state: @@TRANCOUNT, XACT_STATE(), named savepoints, options."""

    def __init__(self, privileged: bool = False) -> None:
        super().__init__("tsql")
        self.trancount, self.xact, self.base, self.savepoints = 0, 0, None, {}
        self.functions.update({
            "@@TRANCOUNT": lambda: self.trancount, "XACT_STATE": lambda: self.xact,
            "IS_SRVROLEMEMBER": lambda role: int(privileged and role == "sysadmin"),
            "HAS_PERMS_BY_NAME": lambda *a: int(privileged)})

    def batch(self, sql: str) -> list[ResultSet | BaseException]:
        tokens = [(m.group(0).upper(), m.start(), m.end()) for m in re.finditer(
            r"'(?:[^']|'')*'|[\w@#$]+|\S", sql)]
        out: list[ResultSet | BaseException] = []
        i = 0
        while i < len(tokens):
            try:
                i = self._statement(sql, tokens, i, out, run=True)
            except _Abort:
                break
        return out or [ResultSet()]

    def _end(self, tokens: list[tuple[str, int, int]], i: int) -> int:
        """Where the simple statement starting at ``tokens[i]`` ends (T-SQL needs no ``;``)."""
        depth, j, head = 0, i + 1, tokens[i][0]
        while j < len(tokens):
            word = tokens[j][0]
            depth += word == "("
            depth -= word == ")"
            if depth == 0 and (word == ";" or (word in _STARTS and not (
                    head == "UPDATE" and word == "SET") and not (
                    head in ("BEGIN", "ROLLBACK", "SAVE", "COMMIT") and j == i + 1))):
                break
            j += 1
        return j

    def _statement(self, sql: str, tokens: list, i: int, out: list, run: bool) -> int:
        if tokens[i][0] == ";":
            return i + 1
        if tokens[i][0] == "IF":
            j = i + 1
            while tokens[j][0] not in _STARTS:
                j += 1
            condition = sql[tokens[i + 1][1]:tokens[j - 1][2]]
            holds = run and Eval(self, self.zero).value(
                sqlglot.parse_one(f"SELECT {condition}", read="tsql").expressions[0], {})
            j = self._statement(sql, tokens, j, out, run and holds)
            if j < len(tokens) and tokens[j][0] == "ELSE":
                j = self._statement(sql, tokens, j + 1, out, run and not holds)
            return j
        j = self._end(tokens, i)
        if run:
            self._simple(sql[tokens[i][1]:tokens[j - 1][2]], out)
        return j

    def _simple(self, text: str, out: list) -> None:
        w = words(text)
        if w[:2] in (["BEGIN", "TRAN"], ["BEGIN", "TRANSACTION"]):
            if self.trancount == 0:
                self.base, self.xact, self.savepoints = self.snapshot(), 1, {}
            self.trancount += 1
        elif w[0] == "ROLLBACK":
            name = w[2] if len(w) > 2 else None
            if self.trancount == 0:
                raise AssertionError("ROLLBACK without a transaction (error 3903)")
            if name is None:
                self.tables, self.trancount, self.xact = self.base, 0, 0
            else:
                self.tables = {k: [dict(r) for r in v] for k, v in self.savepoints[name].items()}
        elif w[0] == "SAVE":
            if self.trancount == 0 or self.xact != 1:  # no transaction, or an uncommittable one
                out.append(odbc(pyodbc.ProgrammingError, "25000", "The current transaction cannot "
                                "be committed and cannot support operations that write to the log "
                                "file.", 3931))
                return
            self.savepoints[w[2]] = self.snapshot()
        elif w[0] == "RAISERROR":
            message = re.search(r"'((?:[^']|'')*)'", text).group(1)
            out.append(odbc(pyodbc.ProgrammingError, "42000", message, 50000))
        elif w[0] == "SET":
            _, option, *value = text.upper().split()
            self.options[option] = " ".join(value)
        else:
            self._user(text, out)

    def _user(self, text: str, out: list) -> None:
        fault = self.fault(parse(text, "tsql"))
        if fault is not None:
            if fault.effect == "partial":
                self.tables["t"].append({"x": 99})
            elif fault.effect == "abort":
                self.tables, self.trancount, self.xact = self.base, 0, 0
            elif fault.effect == "doom":
                self.xact = -1
            out.append(fault.error)
            if fault.effect == "abort":
                raise _Abort()
            return
        if words(text)[0] == "WAITFOR":
            return
        columns, rows = self.run_sql(text, self.zero)
        out.append(ResultSet(rowcount=rows) if columns is None else
                   ResultSet(columns, [Row(r) for r in rows]))

    @staticmethod
    def zero() -> BaseException:
        return odbc(pyodbc.DataError, "22012", "Divide by zero error encountered.", 8134)


class _Abort(Exception):
    """The server ended the batch (and the transaction) on an error."""


class FakeODBC:
    """A pyodbc connection on a ``TSQLServer``. Without MARS a connection serves one statement
    at a time: a cursor whose results are not read to the end (or cancelled, or closed) keeps it
    busy, as with the real drivers."""

    def __init__(self, server: TSQLServer) -> None:
        self.server, self.timeout, self.timeouts, self.closed, self.busy = server, 0, [], False, None
        self.cursors: list[FakeCursor] = []
        self.converters: dict[int, Any] = {}

    def cursor(self) -> "FakeCursor":
        self.timeouts.append(self.timeout)
        self.cursors.append(FakeCursor(self))
        return self.cursors[-1]

    def add_output_converter(self, sqltype: int, fn: Any) -> None:
        self.converters[sqltype] = fn

    def close(self) -> None:
        self.closed = True


class FakeCursor:
    def __init__(self, conn: FakeODBC) -> None:
        self.conn, self.sets, self.rows = conn, [], []
        self.description, self.rowcount, self.cancelled, self.closed = None, -1, False, False

    def execute(self, sql: str) -> "FakeCursor":
        if self.conn.busy not in (None, self):
            raise pyodbc.Error("HY000", "[HY000] Connection is busy with results for another command")
        self.conn.busy = self
        self.sets = self.conn.server.batch(sql)
        self._load()
        return self

    def _load(self) -> None:
        s = self.sets.pop(0)
        if isinstance(s, BaseException):
            if not self.sets:
                self._free()
            raise s
        self.description = None if s.columns is None else [(c, None) for c in s.columns]
        self.rows, self.rowcount = list(s.rows), s.rowcount

    def _free(self) -> None:
        self.sets, self.rows = [], []
        if self.conn.busy is self:
            self.conn.busy = None

    def fetchone(self) -> Any:
        row = self.rows.pop(0) if self.rows else None
        if not self.rows and not self.sets:
            self._free()
        return row

    def fetchmany(self, n: int) -> list[Any]:
        out, self.rows = self.rows[:n], self.rows[n:]
        return out

    def nextset(self) -> bool:
        if not self.sets:
            self.description = None
            self._free()
            return False
        self._load()
        return True

    def cancel(self) -> None:
        self.cancelled = True
        self._free()

    def close(self) -> None:
        self.closed = True
        self._free()


# --- Oracle: one statement per call, a transaction that never autocommits -----------------------

class OracleServer(State):
    """One Oracle session's state: the transaction's base (what a rollback returns to), named
    savepoints, private temporary tables (``ptts``; ``ptt_view=False``: before 18c) and the
    login's roles."""

    def __init__(self, roles: tuple[str, ...] = ("CONNECT",), ptts: tuple[str, ...] = (),
                 ptt_view: bool = True) -> None:
        super().__init__("oracle")
        self.tables.update({"dual": [{"dummy": "X"}],
                            "session_roles": [{"role": r} for r in roles],
                            "session_privs": [{"privilege": "CREATE SESSION"}]})
        self.base, self.savepoints, self.ptts, self.ptt_view = self.snapshot(), {}, list(ptts), ptt_view
        self.functions.update({"USER": lambda: "APP",
                               "SYS_CONTEXT": lambda ns, key: "TRUE" if "DBA" in roles else "FALSE"})

    def table(self, name: str) -> list[dict[str, Any]]:
        if name.lower() == "user_private_temp_tables" and self.ptt_view:
            return [{"table_name": p} for p in self.ptts]
        if name.lower() not in self.tables:
            raise ora(942, "table or view does not exist")
        return super().table(name)

    def rollback(self) -> None:
        self.tables, self.savepoints = {k: [dict(r) for r in v] for k, v in self.base.items()}, {}

    def execute(self, sql: str) -> tuple[Any, ...]:
        w = words(sql)
        if w[0] == "SAVEPOINT":
            self.savepoints[w[1]] = self.snapshot()
            return None, 0
        if w[0] == "ROLLBACK" and "TO" in w:
            if w[-1] not in self.savepoints:
                raise ora(1086, f"savepoint '{w[-1]}' never established in this session or is invalid")
            self.tables = {k: [dict(r) for r in v] for k, v in self.savepoints[w[-1]].items()}
            return None, 0
        parsed = parse(sql, "oracle")
        fault = self.fault(parsed)
        if fault is not None:
            if fault.effect == "partial":
                self.tables["t"].append({"x": 99})
            elif fault.effect == "commit":  # the transaction ended: its savepoints with it
                self.base, self.savepoints = self.snapshot(), {}
            raise fault.error
        if isinstance(parsed, exp.Drop):
            self.ptts.remove(parsed.find(exp.Table).name)
            return None, 0
        return self.run_sql(sql, lambda: ora(1476, "divisor is equal to zero"))


class FakeOracle:
    """A python-oracledb connection on an ``OracleServer``."""

    def __init__(self, server: OracleServer) -> None:
        self.server, self.call_timeout, self.call_timeouts, self.closed = server, 0, [], False
        self.autocommit, self.outputtypehandler = False, None

    def cursor(self) -> "FakeOraCursor":
        return FakeOraCursor(self)

    def rollback(self) -> None:
        self.server.rollback()

    def ping(self) -> None:
        if self.closed:
            raise _create_exception(ora_errors.ERR_NOT_CONNECTED)

    def close(self) -> None:
        self.closed = True


class FakeOraCursor:
    def __init__(self, conn: FakeOracle) -> None:
        self.conn, self.rows, self.description, self.rowcount = conn, [], None, -1
        self.arraysize = self.prefetchrows = 0

    def execute(self, sql: str) -> "FakeOraCursor":
        self.conn.call_timeouts.append(self.conn.call_timeout)
        columns, out = self.conn.server.execute(sql)
        if columns is None:
            self.description, self.rowcount = None, out
        else:
            self.description, self.rows = [(c.upper(),) for c in columns], list(out)
        return self

    def fetchone(self) -> Any:
        return self.rows.pop(0) if self.rows else None

    def fetchall(self) -> list[Any]:
        out, self.rows = self.rows, []
        return out

    def fetchmany(self, n: int) -> list[Any]:
        out, self.rows = self.rows[:n], self.rows[n:]
        return out

    def close(self) -> None:
        pass


# --- the sessions -------------------------------------------------------------------------------

class SteppingClock:
    """``time`` for the executor and the adapters: ``monotonic()`` moves 10 ms per call, so a
    timeout derived from a statement's deadline is checked exactly, whatever the machine load."""

    def __init__(self) -> None:
        self.now = time.monotonic()  # never behind the real clock (the watchdog reads that one)

    def monotonic(self) -> float:
        self.now += 0.01
        return self.now

    def __getattr__(self, name: str) -> Any:  # perf_counter, time, sleep: the real ones
        return getattr(time, name)


@pytest.fixture()
def stepping_clock(monkeypatch) -> SteppingClock:
    from sqlrl.db.sessions import executor

    clock = SteppingClock()
    for module in (executor, mssql, oracle):
        monkeypatch.setattr(module, "time", clock)
    return clock


def session(name: str, conn: Any, **limits: Any) -> Session:
    adapter = get_dialect(name)
    url = {"mssql": "mssql+pyodbc://u:p@fake/db?driver=FreeTDS",
           "oracle": "oracle://u:p@fake/?service_name=X"}[name]
    return Session(adapter, conn, adapter.begin(conn, parse_url(url)), url, Limits(**limits))


HYT00 = odbc(pyodbc.OperationalError, "HYT00", "Timeout expired", 0)
DEADLOCK = odbc(pyodbc.Error, "40001", "Transaction was deadlocked", 1205)
PK = odbc(pyodbc.IntegrityError, "23000", "Violation of PRIMARY KEY", 2627)


def test_mssql_effects_persist_in_one_transaction_that_end_rolls_back(stepping_clock):
    server = TSQLServer()
    conn = FakeODBC(server)
    s = session("mssql", conn, timeout_s=2.5)
    assert server.trancount == 1 and server.xact == 1  # begin opened exactly one transaction
    r = s.execute("INSERT INTO t VALUES (4); SELECT x FROM t")
    assert r.ok and r.columns == ("x",) and r.rows == ((1,), (2,), (3,), (4,)) and r.statements == 2
    assert type(r.rows[0]) is tuple
    assert s.execute("UPDATE t SET x = x * 10 WHERE x > 3").affected_rows == 1
    assert server.t == [1, 2, 3, 40] and server.trancount == 1  # still inside the transaction
    assert set(conn.timeouts[1:]) == {3}  # ceil of the remaining 2.5 s, set before each cursor
    s.close()
    assert server.t == [1, 2, 3] and server.trancount == 0 and conn.closed  # all undone


def test_mssql_a_failed_statement_is_undone_alone():
    server = TSQLServer()
    server.faults.append(Fault(is_(exp.Insert), PK, "partial", times=1))
    s = session("mssql", FakeODBC(server))
    assert s.execute("INSERT INTO t VALUES (4)").error.kind is ErrorKind.RUNTIME  # 99 written, then failed
    r = s.execute("INSERT INTO t VALUES (5); DELETE FROM t WHERE x = 5; SELECT x FROM t")
    assert r.ok and r.rows == ((1,), (2,), (3,))
    server.faults.append(Fault(is_(exp.Update), PK, "partial"))
    r = s.execute("INSERT INTO t VALUES (4); UPDATE t SET x = 0; INSERT INTO t VALUES (5)")
    assert r.error.kind is ErrorKind.RUNTIME and r.error.statement_index == 1
    assert r.error.message == "Violation of PRIMARY KEY (error 2627, SQLSTATE 23000)"
    assert server.t == [1, 2, 3, 4] and not s.lost  # the UPDATE's 99 undone, 4 kept, 5 never ran
    assert server.trancount == 1 and server.xact == 1
    s.close()


def test_mssql_a_timeout_keeps_the_session_usable():
    server = TSQLServer()
    server.faults.append(Fault(lambda e: "WAITFOR" in e.sql().upper(), HYT00))
    s = session("mssql", FakeODBC(server), timeout_s=1)
    s.execute("INSERT INTO t VALUES (4)")
    assert s.execute("WAITFOR DELAY '00:00:10'").error.kind is ErrorKind.TIMEOUT
    assert s.execute("SELECT x FROM t").rows[-1] == (4,) and not s.lost
    s.close()


@pytest.mark.parametrize("effect, detail", [("abort", "@@TRANCOUNT=0"), ("doom", "XACT_STATE()=-1")])
def test_mssql_a_transaction_the_server_ended_loses_the_session(effect, detail):
    server = TSQLServer()
    server.faults.append(Fault(is_(exp.Update), DEADLOCK, effect))
    conn = FakeODBC(server)
    s = session("mssql", conn)
    s.execute("INSERT INTO t VALUES (4)")
    r = s.execute("UPDATE t SET x = 1")
    assert r.error.kind is ErrorKind.SESSION_LOST and detail in r.error.message
    assert "1205" in r.error.message and s.lost
    ran = len(server.ran)
    assert s.execute("SELECT x FROM t").error.kind is ErrorKind.SESSION_LOST
    assert len(server.ran) == ran  # nothing more reaches the server
    s.close()
    assert conn.closed  # a lost session's connection is not reused


@pytest.mark.parametrize("trancount, xact", [(0, 0), (1, -1)])
def test_mssql_no_statement_runs_outside_the_session_transaction(trancount, xact):
    server = TSQLServer()
    s = session("mssql", FakeODBC(server))
    server.trancount, server.xact = trancount, xact  # gone, or doomed, between calls
    r = s.execute("INSERT INTO t VALUES (4)")
    assert r.error.kind is ErrorKind.SESSION_LOST and s.lost
    assert server.t == [1, 2, 3] and not any(isinstance(e, exp.Insert) for e in server.ran)


def test_mssql_a_dead_connection_is_not_recovered():
    server = TSQLServer()
    link = odbc(pyodbc.OperationalError, "08S01", "Communication link failure", 0)
    server.faults.append(Fault(is_(exp.Select, "t"), link))
    s = session("mssql", FakeODBC(server))
    ran = len(server.ran)
    assert s.execute("SELECT x FROM t").error.kind is ErrorKind.SESSION_LOST and s.lost
    assert len(server.ran) == ran  # no @@TRANCOUNT query, no rollback to the savepoint


def test_mssql_batches_give_their_first_result_set_and_surface_later_errors():
    server = TSQLServer()
    server.tables["typed"] = [{"d": decimal.Decimal("2.50"), "n": dt.date(2024, 1, 2), "b": b"\x00\xff"}]
    server.tables["big"] = [{"v": i} for i in range(100)]
    conn = FakeODBC(server)
    s = session("mssql", conn, max_rows=10)
    r = s.execute("UPDATE t SET x = 2 SELECT 7 AS a")
    assert r.columns == ("a",) and r.rows == ((7,),) and server.t == [2, 2, 2]
    assert s.execute("UPDATE t SET x = 5 DELETE FROM t WHERE x = 5").affected_rows == 3
    s.execute("INSERT INTO t VALUES (1)")
    r = s.execute("SELECT 1 AS a INSERT INTO t VALUES (2) SELECT 1/0")
    assert r.error.kind is ErrorKind.RUNTIME and "8134" in r.error.message
    assert server.t == [1]  # the whole batch undone, the earlier call kept
    r = s.execute("SELECT 1/0 SELECT 2")
    assert r.error.kind is ErrorKind.RUNTIME and server.trancount == 1 and not s.lost
    r = s.execute("SELECT v FROM big")
    assert r.truncated and r.row_count == 10
    assert any(c.closed and c.cancelled for c in conn.cursors)  # the rest of the batch cancelled
    r = s.execute("SELECT d, n, b FROM typed")
    assert r.rows == ((2.5, "2024-01-02", "0x00ff"),)
    s.close()


def test_mssql_a_connection_is_reused_only_when_clean():
    adapter = get_dialect("mssql")
    server = TSQLServer()
    conn = FakeODBC(server)
    state = adapter.begin(conn, None)
    assert adapter.end(conn, state) is True and server.trancount == 0
    state = adapter.begin(conn, None)
    adapter.run(conn, state, "SET NOCOUNT ON", time.monotonic() + 5).close()
    assert server.options["NOCOUNT"] == "ON"
    assert adapter.end(conn, state) is False  # SET options outlive ROLLBACK
    assert adapter.ping(conn)


def test_mssql_connect_sets_the_session_up_and_refuses_sysadmin(monkeypatch):
    made: list[FakeODBC] = []

    def connect(privileged: bool) -> Callable[..., FakeODBC]:
        def fake(connstr: str, autocommit: bool, timeout: int) -> FakeODBC:
            assert autocommit is True  # the adapter, not the driver, drives the transaction
            made.append(FakeODBC(TSQLServer(privileged)))
            made[-1].login_timeout = timeout
            return made[-1]
        return fake

    monkeypatch.setattr(mssql.pyodbc, "connect", connect(True))
    with pytest.raises(SessionError, match="sysadmin"):
        open_session("mssql+pyodbc://sa:pw@h/db?driver=FreeTDS")
    assert made[-1].closed
    open_session("mssql+pyodbc://sa:pw@h/db?driver=FreeTDS&allow_superuser=1").close()
    monkeypatch.setattr(mssql.pyodbc, "connect", connect(False))
    with open_session("mssql+pyodbc://u:pw@h/db?driver=FreeTDS&connect_timeout=4",
                      limits=Limits(timeout_s=2.5)) as s:
        conn = made[-1]
        assert conn.login_timeout == 4 and conn.timeout == 3
        assert conn.server.options == {"IMPLICIT_TRANSACTIONS": "OFF", "XACT_ABORT": "OFF",
                                       "LOCK_TIMEOUT": "2500", "TEXTSIZE": str(mssql.MAX_VALUE_BYTES)}
        assert mssql.SQL_SS_TIMESTAMPOFFSET in conn.converters
        assert s.execute("SELECT x FROM t").rows == ((1,), (2,), (3,))


def test_oracle_savepoints_timeouts_and_rollback_on_error(stepping_clock):
    server = OracleServer()
    timeout = _create_exception(ora_errors.ERR_CALL_TIMEOUT_EXCEEDED, timeout=1500)
    server.faults += [Fault(is_(exp.Update), ora(1, "unique constraint violated"), "partial"),
                      Fault(is_(exp.Select, "dual"), timeout)]
    conn = FakeOracle(server)
    s = session("oracle", conn, timeout_s=1.5)
    assert s.execute("INSERT INTO t VALUES (4)").affected_rows == 1
    r = s.execute("UPDATE t SET x = 0")
    assert r.error.kind is ErrorKind.RUNTIME and server.t == [1, 2, 3, 4]  # 99 undone, 4 kept
    assert s.execute("SELECT 1 FROM dual").error.kind is ErrorKind.TIMEOUT
    assert s.execute("SELECT x FROM t").rows == ((1,), (2,), (3,), (4,)) and not s.lost
    # from the deadline, in ms (on the stepping clock some of the 1.5 s is gone)
    assert conn.call_timeouts and all(1400 <= ms < 1500 for ms in conn.call_timeouts)
    s.close()
    assert server.t == [1, 2, 3] and conn.closed  # the transaction rolled back


def test_oracle_a_lost_transaction_or_connection_loses_the_session():
    server = OracleServer()
    server.faults.append(Fault(is_(exp.Update), ora(60, "deadlock detected"), "commit"))
    s = session("oracle", FakeOracle(server))
    r = s.execute("UPDATE t SET x = 0")
    assert r.error.kind is ErrorKind.SESSION_LOST and "ORA-01086" in r.error.message and s.lost
    server = OracleServer()
    server.faults.append(Fault(is_(exp.Select), ora(3113, "end-of-file on communication channel")))
    s = session("oracle", FakeOracle(server))
    assert s.execute("SELECT 1 FROM dual").error.kind is ErrorKind.SESSION_LOST
    assert s.execute("SELECT x FROM t").error.kind is ErrorKind.SESSION_LOST
    assert [type(e) for e in server.ran] == []  # neither ran; no recovery on a dead connection


def test_oracle_end_drops_leftover_private_temp_tables():
    adapter = get_dialect("oracle")
    server = OracleServer(ptts=("ORA$PTT_A",))
    conn = FakeOracle(server)
    assert adapter.end(conn, adapter.begin(conn, None)) is True and server.ptts == []
    conn = FakeOracle(OracleServer(ptt_view=False))  # before 18c: no private temporary tables
    assert adapter.end(conn, adapter.begin(conn, None)) is True
    assert adapter.ping(conn) and (conn.close() or not adapter.ping(conn))


def test_oracle_connect_sets_the_session_up_and_refuses_dba(monkeypatch):
    made: list[Any] = []

    def connect(roles: tuple[str, ...]) -> Callable[..., FakeOracle]:
        def fake(**kw: Any) -> FakeOracle:
            made.extend([kw, FakeOracle(OracleServer(roles))])
            return made[-1]
        return fake

    monkeypatch.setattr(oracle.oracledb, "connect", connect(("CONNECT", "DBA")))
    with pytest.raises(SessionError, match="role DBA"):
        open_session("oracle://app:pw@h/?service_name=X")
    assert made[-1].closed
    monkeypatch.setattr(oracle.oracledb, "connect", connect(("CONNECT", "RESOURCE")))
    with open_session("oracle://app:pw@h/?service_name=X", limits=Limits(timeout_s=2)) as s:
        conn = made[-1]
        assert made[-2]["service_name"] == "X" and conn.autocommit is False
        assert conn.outputtypehandler is oracle.output_type_handler
        assert s.execute("INSERT INTO t VALUES (4)").ok
        assert s.execute("SELECT x FROM t").rows == ((1,), (2,), (3,), (4,))
    assert conn.server.t == [1, 2, 3]
