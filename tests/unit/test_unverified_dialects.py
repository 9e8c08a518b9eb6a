"""SQL Server and Oracle adapters, checked without a server (both are UNVERIFIED against real
servers; see docs/unverified_dialects.md).

What runs here: the adapters import and register; URL -> connection string / parameters; error
classification on the drivers' own exception classes (pyodbc.Error subclasses as pyodbc builds
them, oracledb errors built through oracledb's own ``_Error``); every sandbox rule; the real
drivers failing on a closed local port (``connect_timeout`` set). The adapters' transaction
logic runs on pretend servers that interpret SQL (tests/unit/test_unverified_transactions.py).
The sandbox rules read sqlglot's tokens (``glot_lex``), the same the call is split by.
"""

from __future__ import annotations

import socket
from dataclasses import replace
import struct
import time
from types import SimpleNamespace

import oracledb
import pyodbc
import pytest
import oracledb.errors as ora_errors
from oracledb.errors import _create_exception, _Error

from sqlrl.db import ErrorKind, Limits, SessionError, open_session
from sqlrl.db.dialects import available_dialects, get_dialect
from sqlrl.db.dialects.base import DialectAdapter, common_denial
from sqlrl.db.dialects import mssql, oracle
from sqlrl.db.dialects.glot_lex import ORACLE, TSQL
from sqlrl.db.sessions.session import Session
from sqlrl.db.url import dialect_name, parse_url


# --- registry ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, cls, glot", [("mssql", mssql.MSSQLDialect, "tsql"),
                                             ("oracle", oracle.OracleDialect, "oracle")])
def test_adapters_import_and_register(name, cls, glot):
    adapter = get_dialect(name)
    assert isinstance(adapter, cls) and isinstance(adapter, DialectAdapter)
    assert adapter.name == name and adapter.sqlglot_dialect == glot
    assert adapter.isolation == "transaction"
    assert name in available_dialects()


@pytest.mark.parametrize("url, name", [
    ("mssql+pyodbc://u:p@h:1433/db?driver=FreeTDS", "mssql"),
    ("mssql://u:p@h/db", "mssql"),
    ("oracle://u:p@h:1521/?service_name=FREEPDB1", "oracle"),
    ("oracle+oracledb://u:p@h:1521/ORCL", "oracle"),
])
def test_urls_map_to_the_adapters(url, name):
    assert dialect_name(parse_url(url)) == name


# --- SQL Server: URL -> ODBC connection string -------------------------------------------------

def conn_str(url, installed=()):
    return mssql.odbc_connection_string(parse_url(url), installed)


def test_freetds_connection_string():
    assert conn_str("mssql+pyodbc://sa_less:pw@db.example:1444/shop?driver=FreeTDS") == (
        "DRIVER={FreeTDS};SERVER=db.example;PORT=1444;DATABASE=shop;UID={sa_less};PWD={pw};"
        "ClientCharset=UTF-8;APP=sqlrl")
    assert "PORT=1433" in conn_str("mssql+pyodbc://u:p@h/db?driver=FreeTDS")


def test_microsoft_driver_connection_string_and_passthrough_keys():
    s = conn_str("mssql+pyodbc://u:p@h:1433/db?driver=ODBC+Driver+18+for+SQL+Server"
                 "&TrustServerCertificate=yes&Encrypt=no&allow_superuser=1&connect_timeout=3")
    assert s == ("DRIVER={ODBC Driver 18 for SQL Server};SERVER=h,1433;DATABASE=db;UID={u};PWD={p};"
                 "APP=sqlrl;TrustServerCertificate=yes;Encrypt=no")


def test_passwords_and_values_are_braced_and_escaped():
    s = conn_str("mssql+pyodbc://u:p%3B%7Dx%3Dy@h/db?driver=FreeTDS&Language=us+english")
    assert "PWD={p;}}x=y}" in s and "Language={us english}" in s


def test_driver_defaults_to_an_installed_one():
    assert conn_str("mssql+pyodbc://u:p@h/db", ["FreeTDS"]).startswith("DRIVER={FreeTDS};")
    assert conn_str("mssql+pyodbc://u:p@h/db", ["FreeTDS", "ODBC Driver 18 for SQL Server"]).startswith(
        "DRIVER={ODBC Driver 18 for SQL Server};")
    with pytest.raises(SessionError, match="no SQL Server ODBC driver"):
        conn_str("mssql+pyodbc://u:p@h/db", [])


def test_odbc_connect_passthrough_and_bad_input():
    assert conn_str("mssql+pyodbc:///?odbc_connect=DSN%3Dx%3BUID%3Du") == "DSN=x;UID=u"
    with pytest.raises(SessionError, match="no host"):
        conn_str("mssql+pyodbc://u:p@/db?driver=FreeTDS")
    with pytest.raises(SessionError, match="not an ODBC connection keyword"):
        conn_str("mssql+pyodbc://u:p@h/db?driver=FreeTDS&a%3Bb=1")


def test_timeouts_round_up_to_what_the_drivers_take():
    assert mssql.query_timeout_seconds(1.0) == 1
    assert mssql.query_timeout_seconds(0.9999) == 1
    assert mssql.query_timeout_seconds(1.2) == 2
    assert mssql.query_timeout_seconds(0.2) == 1 and mssql.query_timeout_seconds(-3) == 1
    assert mssql.lock_timeout_ms(2.5) == 2500
    assert oracle.call_timeout_ms(1.5) == 1500 and oracle.call_timeout_ms(0) == 1


def test_datetimeoffset_converter():
    raw = struct.pack("<6hI2h", 2024, 2, 29, 13, 5, 7, 123456000, -5, -30)
    assert mssql.datetimeoffset_to_text(raw) == "2024-02-29 13:05:07.123456-05:30"
    raw = struct.pack("<6hI2h", 2024, 1, 2, 3, 4, 5, 0, 1, 0)
    assert mssql.datetimeoffset_to_text(raw) == "2024-01-02 03:04:05+01:00"
    assert mssql.datetimeoffset_to_text(None) is None
    assert mssql.datetimeoffset_to_text(b"2024-01-02 03:04:05 +01:00") == "2024-01-02 03:04:05 +01:00"


# --- Oracle: URL -> connect parameters ---------------------------------------------------------

def params(url):
    return oracle.connect_params(parse_url(url))


def test_oracle_connect_params():
    assert params("oracle://u:p@h:1522/?service_name=FREEPDB1") == {
        "user": "u", "password": "p", "host": "h", "port": 1522, "service_name": "FREEPDB1",
        "tcp_connect_timeout": 10.0}
    assert params("oracle+oracledb://u:p@h/ORCL?connect_timeout=2.5") == {
        "user": "u", "password": "p", "host": "h", "port": 1521, "sid": "ORCL",
        "tcp_connect_timeout": 2.5}
    assert params("oracle://u:p@mytns")["dsn"] == "mytns"
    assert params("oracle://u:p@h:1521")["dsn"] == "h:1521"


def test_oracle_connect_params_refuse_bad_and_privileged_urls():
    with pytest.raises(SessionError, match="not both"):
        params("oracle://u:p@h/ORCL?service_name=X")
    with pytest.raises(SessionError, match="unknown Oracle URL option"):
        params("oracle://u:p@h/?service_name=X&threaded=1")
    with pytest.raises(SessionError, match="mode=sysdba"):
        params("oracle://sys:p@h/?service_name=X&mode=sysdba")
    p = params("oracle://sys:p@h/?service_name=X&mode=sysdba&allow_superuser=1")
    assert p["mode"] == oracledb.AUTH_MODE_SYSDBA


def test_oracle_privilege_rules():
    assert oracle.privileged_reasons("APP", "FALSE", ["CONNECT", "RESOURCE"],
                                     ["CREATE SESSION", "CREATE TABLE"]) == []
    assert oracle.privileged_reasons("SYSTEM", "FALSE", [], []) == ["user SYSTEM"]
    assert oracle.privileged_reasons("X", "TRUE", [], []) == ["connected AS SYSDBA"]
    assert oracle.privileged_reasons("X", "FALSE", ["DBA"], ["ALTER SYSTEM"]) == [
        "role DBA", "privilege ALTER SYSTEM"]


def test_oracle_lobs_are_fetched_as_str_and_bytes():
    class Cur:
        arraysize = 77

        def var(self, type_, arraysize):
            return (type_, arraysize)

    cur = Cur()
    meta = lambda t: SimpleNamespace(type_code=t)  # noqa: E731
    assert oracle.output_type_handler(cur, meta(oracledb.DB_TYPE_CLOB)) == (oracledb.DB_TYPE_LONG, 77)
    assert oracle.output_type_handler(cur, meta(oracledb.DB_TYPE_NCLOB)) == (oracledb.DB_TYPE_LONG, 77)
    assert oracle.output_type_handler(cur, meta(oracledb.DB_TYPE_BLOB)) == (oracledb.DB_TYPE_LONG_RAW, 77)
    assert oracle.output_type_handler(cur, meta(oracledb.DB_TYPE_NUMBER)) is None


# --- error classification ------------------------------------------------------------------------

def odbc(cls, state, text, native):
    """A pyodbc error exactly as pyodbc builds driver errors: (sqlstate, "[state] msg (native) (fn)")."""
    return cls(state, f"[{state}] [FreeTDS][SQL Server]{text} ({native}) (SQLExecDirectW)")


@pytest.mark.parametrize("exc, kind", [
    (odbc(pyodbc.ProgrammingError, "42000", "Incorrect syntax near 'FROM'.", 102), ErrorKind.SYNTAX),
    (odbc(pyodbc.ProgrammingError, "42000", "Incorrect syntax near the keyword 'FROM'.", 156), ErrorKind.SYNTAX),
    (odbc(pyodbc.ProgrammingError, "42000", "Unclosed quotation mark after the character string 'x'.", 105), ErrorKind.SYNTAX),
    (odbc(pyodbc.ProgrammingError, "42000", "The SELECT permission was denied on the object 'orders'.", 229), ErrorKind.PERMISSION),
    (odbc(pyodbc.ProgrammingError, "42000", "CREATE TABLE permission denied in database 'shop'.", 262), ErrorKind.PERMISSION),
    (odbc(pyodbc.ProgrammingError, "42000", "The user does not have permission to perform this action.", 297), ErrorKind.PERMISSION),
    (odbc(pyodbc.ProgrammingError, "42000", "VIEW SERVER STATE permission was denied on object 'server'.", 300), ErrorKind.PERMISSION),
    (odbc(pyodbc.OperationalError, "HYT00", "Query timeout expired", 0), ErrorKind.TIMEOUT),
    (odbc(pyodbc.OperationalError, "HYT01", "Connection timeout expired", 0), ErrorKind.TIMEOUT),
    (odbc(pyodbc.Error, "HY000", "Lock request time out period exceeded.", 1222), ErrorKind.TIMEOUT),
    (odbc(pyodbc.OperationalError, "08S01", "Communication link failure", 0), ErrorKind.SESSION_LOST),
    (odbc(pyodbc.OperationalError, "08001", "Unable to connect", 20009), ErrorKind.SESSION_LOST),
    (pyodbc.ProgrammingError("Attempt to use a closed connection."), ErrorKind.SESSION_LOST),
    (pyodbc.ProgrammingError("The cursor's connection has been closed."), ErrorKind.SESSION_LOST),
    (odbc(pyodbc.ProgrammingError, "42000", "Cannot issue SAVE TRANSACTION when there is no active transaction.", 628), ErrorKind.SESSION_LOST),
    (odbc(pyodbc.ProgrammingError, "42000", "The current transaction cannot be committed and cannot support operations that write to the log file.", 3930), ErrorKind.SESSION_LOST),
    (odbc(pyodbc.ProgrammingError, "42000", mssql.GUARD_MESSAGE, 50000), ErrorKind.SESSION_LOST),
    (mssql.SessionLost("gone"), ErrorKind.SESSION_LOST),
    (odbc(pyodbc.ProgrammingError, "42S02", "Invalid object name 'nope'.", 208), ErrorKind.RUNTIME),
    (odbc(pyodbc.ProgrammingError, "42S22", "Invalid column name 'nope'.", 207), ErrorKind.RUNTIME),
    (odbc(pyodbc.DataError, "22012", "Divide by zero error encountered.", 8134), ErrorKind.RUNTIME),
    (odbc(pyodbc.IntegrityError, "23000", "Violation of PRIMARY KEY constraint 'pk'.", 2627), ErrorKind.RUNTIME),
    (odbc(pyodbc.ProgrammingError, "42000", "Could not find stored procedure 'x'.", 2812), ErrorKind.RUNTIME),
    (odbc(pyodbc.Error, "40001", "Transaction was deadlocked ... chosen as the deadlock victim.", 1205), ErrorKind.RUNTIME),
])
def test_mssql_classification(exc, kind):
    assert get_dialect("mssql").classify(exc) is kind


def test_mssql_error_parts():
    exc = odbc(pyodbc.ProgrammingError, "42S02", "Invalid object name 'x'.", 208)
    assert mssql.sqlstate_and_natives(exc)[:2] == ("42S02", (208,))
    assert mssql.sqlstate_and_natives(pyodbc.Error("msg (12)", "HY000"))[:2] == ("HY000", (12,))


def test_mssql_messages_are_readable():
    exc = mssql.readable(odbc(pyodbc.ProgrammingError, "42S02", "Invalid object name 'nope'.", 208))
    assert str(exc) == "Invalid object name 'nope'. (error 208, SQLSTATE 42S02)"
    assert mssql.classify_mssql(exc) is ErrorKind.RUNTIME
    ms = pyodbc.OperationalError("HYT00", "[HYT00] [Microsoft][ODBC Driver 18 for SQL Server]Query timeout "
                                          "expired (0) (SQLExecDirectW)")
    assert str(mssql.readable(ms)) == "Query timeout expired (SQLSTATE HYT00)"
    assert mssql.classify_mssql(mssql.readable(ms)) is ErrorKind.TIMEOUT
    other = ValueError("x")
    assert mssql.readable(other) is other


def ora(code, text):
    """An Oracle server error as python-oracledb builds it (``_Error`` picks the exception class)."""
    err = _Error(f"ORA-{code:05d}: {text}", code=code)
    return err.exc_type(err)


def test_oracle_messages_are_readable():
    exc = oracle.readable(ora(942, "table or view does not exist"))
    assert str(exc) == "ORA-00942: table or view does not exist"
    assert oracle.classify_oracle(exc) is ErrorKind.RUNTIME
    lost = oracle.readable(ora(3113, "end-of-file on communication channel"))
    assert str(lost).startswith("DPY-4011: the database or network closed the connection")
    assert "Help:" not in str(lost) and oracle.classify_oracle(lost) is ErrorKind.SESSION_LOST


@pytest.mark.parametrize("exc, kind", [
    (ora(900, "invalid SQL statement"), ErrorKind.SYNTAX),
    (ora(923, "FROM keyword not found where expected"), ErrorKind.SYNTAX),
    (ora(933, "SQL command not properly ended"), ErrorKind.SYNTAX),
    (ora(936, "missing expression"), ErrorKind.SYNTAX),
    (ora(1756, "quoted string not properly terminated"), ErrorKind.SYNTAX),
    (_create_exception(ora_errors.ERR_MISSING_ENDING_SINGLE_QUOTE), ErrorKind.SYNTAX),
    (ora(942, "table or view does not exist"), ErrorKind.RUNTIME),
    (ora(904, '"NOPE": invalid identifier'), ErrorKind.RUNTIME),
    (ora(979, "not a GROUP BY expression"), ErrorKind.RUNTIME),
    (ora(1476, "divisor is equal to zero"), ErrorKind.RUNTIME),
    (ora(1, "unique constraint (X.PK) violated"), ErrorKind.RUNTIME),
    (ora(1031, "insufficient privileges"), ErrorKind.PERMISSION),
    (ora(1950, "no privileges on tablespace 'USERS'"), ErrorKind.PERMISSION),
    (ora(24247, "network access denied by access control list (ACL)"), ErrorKind.PERMISSION),
    (ora(1013, "user requested cancel of current operation"), ErrorKind.TIMEOUT),
    (ora(54, "resource busy and acquire with NOWAIT specified or timeout expired"), ErrorKind.TIMEOUT),
    (_create_exception(ora_errors.ERR_CALL_TIMEOUT_EXCEEDED, timeout=1000), ErrorKind.TIMEOUT),
    (ora(3113, "end-of-file on communication channel"), ErrorKind.SESSION_LOST),
    (ora(3114, "not connected to ORACLE"), ErrorKind.SESSION_LOST),
    (ora(28, "your session has been killed"), ErrorKind.SESSION_LOST),
    (ora(1086, "savepoint 'SQLRL_SP' never established in this session or is invalid"), ErrorKind.SESSION_LOST),
    (_create_exception(ora_errors.ERR_CONNECTION_CLOSED), ErrorKind.SESSION_LOST),
    (_create_exception(ora_errors.ERR_NOT_CONNECTED), ErrorKind.SESSION_LOST),
    (oracle.SessionLost("gone"), ErrorKind.SESSION_LOST),
    (RuntimeError("ORA-00942: table or view does not exist"), ErrorKind.RUNTIME),
    (RuntimeError("ORA-00900: invalid SQL statement"), ErrorKind.SYNTAX),
])
def test_oracle_classification(exc, kind):
    assert get_dialect("oracle").classify(exc) is kind


# --- sandbox rules -------------------------------------------------------------------------------

def mssql_reason(statement):
    return common_denial(statement) or get_dialect("mssql").denied(statement)


def oracle_reason(statement):
    return common_denial(statement) or get_dialect("oracle").denied(statement)


@pytest.mark.parametrize("sql, why", [
    # transaction control, in every T-SQL spelling and anywhere in a batch
    ("BEGIN TRAN", "transaction"), ("BEGIN TRANSACTION t", "transaction"),
    ("BEGIN DISTRIBUTED TRANSACTION", "transaction"), ("COMMIT", "transaction"),
    ("COMMIT TRAN", "transaction"), ("COMMIT WORK", "transaction"),
    ("ROLLBACK TRANSACTION sqlrl_sp", "transaction"), ("SAVE TRAN x", "SAVE TRANSACTION"),
    ("SAVE TRANSACTION sqlrl_sp", "SAVE TRANSACTION"),
    ("SELECT 1 COMMIT", "transaction"), ("PRINT 1 COMMIT", "transaction"),
    ("FETCH NEXT FROM c COMMIT", "transaction"), ("IF 1 = 1 BEGIN TRAN", "BEGIN TRANSACTION"),
    ("UPDATE t SET x = 1 ROLLBACK", "transaction"),
    ("CREATE PROCEDURE p AS COMMIT", "transaction"),
    ("SELECT [a]]'] COMMIT SELECT 'x'", "transaction"),  # ]] is an escaped bracket
    ("SELECT 'unterminated COMMIT", "transaction"),  # unreadable text: every word counts
    ("SET IMPLICIT_TRANSACTIONS ON", "IMPLICIT_TRANSACTIONS"),
    ("SET ANSI_NULLS, IMPLICIT_TRANSACTIONS ON", "IMPLICIT_TRANSACTIONS"),
    ("SET XACT_ABORT ON", "XACT_ABORT"), ("SET ANSI_DEFAULTS ON", "ANSI_DEFAULTS"),
    ("SET NOEXEC ON", "NOEXEC"), ("SET FMTONLY ON", "FMTONLY"), ("SET TEXTSIZE -1", "TEXTSIZE"),
    ("SET LOCK_TIMEOUT -1", "limits"), ("SET REMOTE_PROC_TRANSACTIONS ON", "REMOTE_PROC"),
    ("SET CONTEXT_INFO 0x01", "CONTEXT_INFO"), ("SET TRANSACTION ISOLATION LEVEL SNAPSHOT", "transaction"),
    ("SET QUERY_GOVERNOR_COST_LIMIT 0", "QUERY_GOVERNOR"), ("SET SHOWPLAN_XML ON", "SHOWPLAN"),
    ("SET CURSOR_CLOSE_ON_COMMIT ON", "CURSOR_CLOSE"), ("SET PARSEONLY ON", "PARSEONLY"),
    # procedures, dynamic SQL, impersonation
    ("EXEC xp_cmdshell 'whoami'", "EXEC"), ("EXECUTE master..xp_cmdshell 'dir'", "EXEC"),
    ("xp_cmdshell 'whoami'", "stored procedure call"), ("master.dbo.xp_cmdshell 'dir'", "stored procedure call"),
    ("[xp_cmdshell] 'dir'", "stored procedure call"),
    ("SELECT 1 EXEC xp_cmdshell 'dir'", "EXEC"), ("EXEC('DROP TABLE orders')", "EXEC"),
    ("EXEC (N'SELECT 1')", "EXEC"), ("EXEC @sql", "EXEC"), ("EXECUTE sp_executesql N'SELECT 1'", "EXEC"),
    ("DECLARE @s nvarchar(99) = N'x'; EXEC sp_executesql @s", "EXEC"),
    ("sp_executesql N'DELETE FROM orders'", "stored procedure call"),
    ("INSERT INTO t EXEC sp_who", "EXEC"), ("EXEC my_proc 1", "EXEC"), ("my_proc 1", "stored procedure call"),
    ("EXEC sp_configure 'xp_cmdshell', 1", "EXEC"), ("SELECT * FROM sp_OACreate", "sp_oacreate"),
    ("EXECUTE AS USER = 'dbo'", "impersonation"), ("EXECUTE AS LOGIN = 'sa'", "impersonation"),
    ("REVERT", "REVERT"), ("SETUSER 'dbo'", "SETUSER"),
    ("SELECT {fn USER()}", "ODBC escape"), ("{call xp_cmdshell('dir')}", "ODBC escape"),
    # files, remote data, server administration
    ("SELECT * FROM OPENROWSET(BULK '/etc/passwd', SINGLE_CLOB) AS x", "OPENROWSET"),
    ("SELECT * FROM OPENDATASOURCE('SQLNCLI', 'Data Source=x').db.dbo.t", "OPENDATASOURCE"),
    ("SELECT * FROM OPENQUERY(remote, 'SELECT 1')", "OPENQUERY"),
    ("BULK INSERT orders FROM '/tmp/x.csv'", "BULK"), ("USE master", "USE"),
    ("SELECT 1 USE master", "USE"), ("SHUTDOWN WITH NOWAIT", "SHUTDOWN"),
    ("RECONFIGURE", "RECONFIGURE"), ("BACKUP DATABASE shop TO DISK = '/tmp/x.bak'", "BACKUP"),
    ("RESTORE DATABASE shop FROM DISK = '/tmp/x.bak'", "RESTORE"), ("DBCC CHECKDB", "DBCC"),
    ("KILL 52", "KILL"), ("CHECKPOINT", "CHECKPOINT"),
    ("CREATE LOGIN evil WITH PASSWORD = 'x'", "CREATE LOGIN"), ("ALTER LOGIN sa ENABLE", "ALTER LOGIN"),
    ("DROP LOGIN x", "DROP LOGIN"), ("CREATE USER evil WITHOUT LOGIN", "CREATE USER"),
    ("ALTER ROLE db_owner ADD MEMBER me", "ALTER ROLE"), ("ALTER SERVER ROLE sysadmin ADD MEMBER me", "ALTER SERVER"),
    ("ALTER SERVER CONFIGURATION SET PROCESS AFFINITY CPU = AUTO", "ALTER SERVER"),
    ("ALTER DATABASE shop SET TRUSTWORTHY ON", "ALTER DATABASE"), ("CREATE DATABASE x", "CREATE DATABASE"),
    ("DROP DATABASE shop", "DROP DATABASE"), ("CREATE ASSEMBLY a FROM 0x00", "CREATE ASSEMBLY"),
    ("CREATE EXTERNAL DATA SOURCE s WITH (LOCATION = 'x')", "CREATE EXTERNAL"),
    ("CREATE CREDENTIAL c WITH IDENTITY = 'x'", "CREATE CREDENTIAL"),
    ("ALTER AUTHORIZATION ON DATABASE::shop TO me", "AUTHORIZATION"),
    ("CREATE TRIGGER t ON ALL SERVER FOR LOGON AS SELECT 1", "ALL SERVER"),
    ("GRANT CONTROL TO public", "GRANT"), ("REVOKE SELECT ON orders FROM public", "REVOKE"),
    ("DENY SELECT ON orders TO public", "DENY"), ("UPDATE STATISTICS orders", "STATISTICS"),
    ("WRITETEXT t.c @p 'x'", "WRITETEXT"),
    # visible to other sessions
    ("CREATE TABLE ##shared (x int)", "global temporary"), ("SELECT * INTO ##g FROM orders", "global temporary"),
    # a misspelled keyword reads as a procedure call
    ("SELEC 1", "stored procedure call"),
])
def test_mssql_denials(sql, why):
    reason = mssql_reason(sql)
    assert reason is not None and why.lower() in reason.lower(), (sql, reason)


@pytest.mark.parametrize("sql", [
    "SELECT TOP 5 * FROM orders ORDER BY order_id",
    "(SELECT 1) UNION SELECT 2",
    "WITH c AS (SELECT 1 AS x) SELECT x FROM c",
    "SELECT [commit], [rollback] FROM t WHERE note = 'commit; rollback; exec xp_cmdshell'",
    "SELECT N'BEGIN TRAN' AS s -- COMMIT\n, 2 /* ROLLBACK /* nested */ EXEC x */",
    "UPDATE products SET price = price * 2 WHERE product_id = 1",
    "INSERT INTO #t (x) VALUES (1)", "CREATE TABLE #t (x int)", "SELECT * INTO #copy FROM orders",
    "DELETE FROM orders", "TRUNCATE TABLE order_items", "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE;",
    "CREATE TABLE notes (id int, body nvarchar(max))", "ALTER TABLE orders ADD c int",
    "DROP TABLE orders", "CREATE VIEW v AS SELECT 1 AS x", "CREATE INDEX i ON orders(status)",
    "CREATE SCHEMA scratch", "CREATE PROCEDURE p AS SELECT 1",
    "DECLARE @x int = 1; SELECT @x", "SET @x = 1", "SET NOCOUNT ON", "SET DATEFORMAT dmy",
    "SET ROWCOUNT 5", "SET IDENTITY_INSERT orders ON", "SET STATISTICS IO ON",
    "IF 1 = 1 BEGIN SELECT 1 END ELSE BEGIN SELECT 2 END", "WHILE 1 = 0 BEGIN BREAK END",
    "PRINT 'hello'", "RAISERROR('x', 16, 1)", "THROW 50001, 'x', 1", "WAITFOR DELAY '00:00:01'",
    "EXEC sp_help 'orders'", "EXECUTE dbo.sp_columns @table_name = 'orders'", "sp_tables",
    "[sp_help] 'orders'", "sp_helptext 'v'",
    "SELECT * FROM sys.tables", "SELECT OBJECT_ID('orders'), @@VERSION, SERVERPROPERTY('Edition')",
    "SELECT * FROM OPENJSON(N'[1,2]')", "SELECT 1 AS [##x]",
])
def test_mssql_allows_ordinary_sql(sql):
    assert mssql_reason(sql) is None, (sql, mssql_reason(sql))


@pytest.mark.parametrize("sql, why", [
    ("CREATE TABLE notes (id NUMBER)", "implicitly on DDL"), ("ALTER TABLE orders ADD c NUMBER", "DDL"),
    ("DROP TABLE orders", "DDL"), ("DROP TABLE orders PURGE", "DDL"), ("TRUNCATE TABLE orders", "DDL"),
    ("RENAME orders TO x", "DDL"), ("COMMENT ON TABLE orders IS 'x'", "DDL"),
    ("GRANT SELECT ON orders TO public", "DDL"), ("REVOKE SELECT ON orders FROM public", "DDL"),
    ("ANALYZE TABLE orders COMPUTE STATISTICS", "DDL"), ("PURGE RECYCLEBIN", "DDL"),
    ("FLASHBACK TABLE orders TO BEFORE DROP", "DDL"), ("CREATE GLOBAL TEMPORARY TABLE g (x NUMBER)", "DDL"),
    ("CREATE DIRECTORY d AS '/tmp'", "DDL"), ("CREATE DATABASE LINK l CONNECT TO u IDENTIFIED BY p", "DDL"),
    ("ALTER SYSTEM KILL SESSION '1,2'", "settings"), ("ALTER SESSION SET CURRENT_SCHEMA = sys", "settings"),
    ("CREATE PRIVATE TEMPORARY TABLE ora$ptt_x (a NUMBER) ON COMMIT PRESERVE DEFINITION", "PRESERVE"),
    ("DROP TABLE \"ORDERS\"", "DDL"), ("DROP TABLE other.ora$ptt_x", "DDL"),
    ("COMMIT", "transaction"), ("COMMIT WORK", "transaction"), ("ROLLBACK", "transaction"),
    ("SAVEPOINT a", "transaction"), ("SET TRANSACTION READ ONLY", "transaction"),
    ("BEGIN EXECUTE IMMEDIATE 'DROP TABLE orders'; END", "transaction"),
    ("DECLARE x NUMBER; BEGIN COMMIT; END", "PL/SQL"),
    ("CALL dbms_output.put_line('x')", "procedures"), ("EXEC p", "procedures"),
    ("LOCK TABLE orders IN EXCLUSIVE MODE", "LOCK"), ("SET ROLE dba", "session settings"),
    ("SET CONSTRAINTS ALL DEFERRED", "session settings"),
    ("ADMINISTER KEY MANAGEMENT SET KEYSTORE OPEN IDENTIFIED BY x", "ADMINISTER"),
    ("WITH FUNCTION f RETURN NUMBER IS PRAGMA AUTONOMOUS_TRANSACTION", "WITH FUNCTION"),
    ("WITH PROCEDURE p IS BEGIN NULL", "WITH FUNCTION"),
    ("SELECT utl_http.request('http://example.com') FROM dual", "UTL_HTTP"),
    ("SELECT UTL_INADDR.get_host_address('x') FROM dual", "UTL_INADDR"),
    ("SELECT sys.utl_file.fopen('D', 'f', 'r') FROM dual", "UTL_FILE"),
    ("SELECT dbms_xmlgen.getxml('SELECT * FROM orders') FROM dual", "DBMS_XMLGEN"),
    ("SELECT dbms_scheduler.generate_job_name FROM dual", "DBMS_SCHEDULER"),
    ("SELECT \"DBMS_SQL\".open_cursor FROM dual", "DBMS_SQL"),
    ("SELECT dbms_java.runjava('x') FROM dual", "DBMS_JAVA"),
    ("SELECT httpuritype('http://x').getclob() FROM dual", "HTTPURITYPE"),
    ("SELECT bfilename('D', 'f') FROM dual", "BFILENAME"),
    ("SELECT * FROM orders@remote_db", "database links"),
    ("INSERT INTO orders@remote SELECT * FROM orders", "database links"),
    ("EXPLAIN PLAN FOR CREATE TABLE x (a NUMBER)", "EXPLAIN"),
    ("SELECT 'unterminated utl_file FROM dual", "UTL_FILE"),
])
def test_oracle_denials(sql, why):
    reason = oracle_reason(sql)
    assert reason is not None and why.lower() in reason.lower(), (sql, reason)


@pytest.mark.parametrize("sql", [
    "SELECT * FROM orders WHERE ROWNUM <= 5",
    "(SELECT 1 FROM dual) UNION SELECT 2 FROM dual",
    "WITH c AS (SELECT 1 x FROM dual) SELECT x FROM c",
    "SELECT 'commit; utl_file; drop table x' AS s, q'[it's utl_http]' AS q FROM dual",
    "SELECT 1 /* dbms_sql */ FROM dual -- utl_file",
    "SELECT \"COMMIT\", \"BEGIN\" FROM t",
    "INSERT INTO orders (order_id) VALUES (99)", "UPDATE products SET price = price * 2",
    "DELETE FROM orders WHERE status = 'cancelled'",
    "MERGE INTO t USING s ON (t.id = s.id) WHEN MATCHED THEN UPDATE SET t.v = s.v",
    "INSERT ALL INTO t (x) VALUES (1) INTO t (x) VALUES (2) SELECT * FROM dual",
    "SELECT * FROM orders FOR UPDATE",
    "SELECT dbms_random.value FROM dual", "SELECT dbms_lob.getlength(c) FROM t",
    "CREATE PRIVATE TEMPORARY TABLE ora$ptt_scratch (a NUMBER, b VARCHAR2(20))",
    "CREATE PRIVATE TEMPORARY TABLE ora$ptt_copy ON COMMIT DROP DEFINITION AS SELECT * FROM orders",
    "DROP TABLE ora$ptt_scratch", "DROP TABLE \"ORA$PTT_SCRATCH\" PURGE",
    "EXPLAIN PLAN FOR SELECT * FROM orders",
    "EXPLAIN PLAN SET STATEMENT_ID = 'x' FOR UPDATE orders SET status = 'x'",
    "SELECT begin_date, end_date FROM periods",
    "SELECT email FROM customers WHERE email LIKE '%@example.com'",
    # no Oracle statement starts with these words: the server answers ORA-00900 (a syntax error)
    "SELEC 1", "SHOW USER",
])
def test_oracle_allows_ordinary_sql(sql):
    assert oracle_reason(sql) is None, (sql, oracle_reason(sql))


def test_one_sqlglot_lexer_reads_literals_and_comments_like_the_servers():
    assert TSQL.tokens("SELECT [a]]b], N'x''y', \"q\" /* /* nested */ c */ -- d\n, #t, ##g, @v, @@X") == [
        ("WORD", "SELECT"), ("IDENT", "A]B"), ("PUNCT", ","), ("PUNCT", ","), ("IDENT", "Q"),
        ("PUNCT", ","), ("WORD", "#T"), ("PUNCT", ","), ("WORD", "##G"), ("PUNCT", ","), ("WORD", "@V"),
        ("PUNCT", ","), ("WORD", "@@X")]
    assert ORACLE.tokens("SELECT q'{a'b}', nq'!x!', n'y', \"Mixed\", t@l, ora$x /* c */ -- d") == [
        ("WORD", "SELECT"), ("PUNCT", ","), ("PUNCT", ","), ("PUNCT", ","), ("IDENT", "MIXED"),
        ("PUNCT", ","), ("WORD", "T@L"), ("PUNCT", ","), ("WORD", "ORA$X")]
    # sqlglot keeps the rest of a command-word statement as one string: it is read again
    assert ("WORD", "COMMIT") in TSQL.tokens("PRINT 1 COMMIT")
    assert ("WORD", "UTL_FILE") in ORACLE.tokens("CALL utl_file.fremove('D', 'f')")
    # unreadable text: every word of it counts, strings included
    assert ("WORD", "COMMIT") in TSQL.tokens("SELECT 'unterminated COMMIT")


@pytest.mark.parametrize("name, bad", [("mssql", "COMMIT"), ("oracle", "UTL_FILE")])
def test_the_sandbox_reads_the_tokens_the_call_was_split_by(name, bad):
    """The executor splits a call with the adapter's ``lex`` and hands each statement, with its
    tokens, to ``denied``: one reading of the text for both."""
    adapter = get_dialect(name)
    statements = adapter.lex(None, "SELECT ';' AS a; /* ; */ SELECT 2 -- ;\n; ;")
    assert [s.text for s in statements] == ["SELECT ';' AS a", "/* ; */ SELECT 2 -- ;"]
    assert statements[1].words[:1] == ("SELECT",) and statements[1].node[0] == ("WORD", "SELECT")
    tampered = replace(statements[0], node=(("WORD", "SELECT"), ("WORD", bad)))  # denied reads the node
    assert adapter.denied(tampered) is not None and adapter.denied(statements[0]) is None
    forms = ["SELECT 1 COMMIT", "PRINT 1 COMMIT"] if name == "mssql" else ["COMMIT", "CALL p(1)"]
    for sql in forms:
        r = Session(adapter, None, None, f"{name}://x", Limits()).execute(sql)
        assert r.error is not None and r.error.kind is ErrorKind.PERMISSION, (sql, r.error)


# --- the real drivers fail fast on a closed port ---------------------------------------------------

def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_mssql_unreachable_server_is_a_session_error():
    with pytest.raises(SessionError) as info:
        open_session(f"mssql+pyodbc://u:secret@127.0.0.1:{closed_port()}/db?driver=FreeTDS&connect_timeout=3")
    assert "cannot connect" in str(info.value) and "secret" not in str(info.value)


def test_oracle_unreachable_server_is_a_session_error():
    with pytest.raises(SessionError) as info:
        open_session(f"oracle://u:secret@127.0.0.1:{closed_port()}/?service_name=FREEPDB1&connect_timeout=3")
    assert "cannot connect" in str(info.value) and "secret" not in str(info.value)
