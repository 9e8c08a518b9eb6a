"""SQL Server and Oracle adapters, checked without a server (both are UNVERIFIED against real
servers; see docs/unverified_dialects.md).

What runs here: the adapters import and register; URL -> connection string / parameters; error
classification on the drivers' own exception classes (pyodbc.Error subclasses as pyodbc builds
them, oracledb errors built through oracledb's own ``_Error``); every sandbox rule; the real
drivers failing fast on a closed local port; and the adapters' transaction logic (guard,
savepoints, recovery, lost sessions, result sets, reuse) through the real ``Session`` and executor
on scripted fake connections that model @@TRANCOUNT / XACT_STATE() / savepoints.
"""

from __future__ import annotations

import datetime as dt
import decimal
import socket
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
from sqlrl.db.session import Session
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


def test_lexers_drop_literals_and_comments_like_the_servers():
    assert mssql.tsql_tokens("SELECT [a]]b], N'x''y', \"q\" /* /* nested */ c */ -- d\n, #t, ##g, @v") == [
        ("WORD", "SELECT"), ("IDENT", "A]B"), ("PUNCT", ","), ("PUNCT", ","), ("IDENT", "Q"),
        ("PUNCT", ","), ("WORD", "#T"), ("PUNCT", ","), ("WORD", "##G"), ("PUNCT", ","), ("WORD", "@V")]
    assert oracle.oracle_tokens("SELECT q'{a'b}', nq'!x!', n'y', \"Mixed\", t@l, ora$x /* c */ -- d") == [
        ("WORD", "SELECT"), ("PUNCT", ","), ("PUNCT", ","), ("PUNCT", ","), ("IDENT", "MIXED"),
        ("PUNCT", ","), ("WORD", "T@L"), ("PUNCT", ","), ("WORD", "ORA$X")]


# --- the real drivers fail fast on a closed port ---------------------------------------------------

def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_mssql_unreachable_server_is_a_quick_session_error():
    t0 = time.monotonic()
    with pytest.raises(SessionError) as info:
        open_session(f"mssql+pyodbc://u:secret@127.0.0.1:{closed_port()}/db?driver=FreeTDS&connect_timeout=3")
    assert time.monotonic() - t0 < 5
    assert "cannot connect" in str(info.value) and "secret" not in str(info.value)


def test_oracle_unreachable_server_is_a_quick_session_error():
    t0 = time.monotonic()
    with pytest.raises(SessionError) as info:
        open_session(f"oracle://u:secret@127.0.0.1:{closed_port()}/?service_name=FREEPDB1&connect_timeout=3")
    assert time.monotonic() - t0 < 5
    assert "cannot connect" in str(info.value) and "secret" not in str(info.value)


# --- SQL Server transaction logic on a scripted connection ----------------------------------------

class Row:
    """Like pyodbc.Row: iterable and indexable, but not a tuple."""

    def __init__(self, *values):
        self._values = values

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)

    def __getitem__(self, i):
        return self._values[i]


class ResultSet:
    def __init__(self, columns=None, rows=(), rowcount=-1):
        self.description = None if columns is None else [(c, None) for c in columns]
        self.rows = [Row(*r) for r in rows]
        self.rowcount = rowcount


class FakeODBC:
    """A pyodbc connection to a pretend SQL Server: one table ``t`` (a list of ints), @@TRANCOUNT,
    XACT_STATE() and savepoints. ``script`` maps user statements to result sets, or to
    ``(exception, effect)`` where effect is "partial" (the statement changed t before failing),
    "abort" (the server rolled the transaction back) or "doom" (XACT_STATE() = -1)."""

    def __init__(self, script=None):
        self.t, self.script, self.log = [1, 2, 3], dict(script or {}), []
        self.trancount, self.xact, self.savepoints, self.base = 0, 0, [], None
        self.timeout, self.timeouts, self.closed, self.cursors = 0, [], False, []
        self.busy = None  # the cursor whose results still occupy the connection

    def cursor(self):
        self.timeouts.append(self.timeout)
        cur = FakeCursor(self)
        self.cursors.append(cur)
        return cur

    def close(self):
        self.closed = True

    def handle(self, sql):
        self.log.append(sql)
        if sql == "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION; BEGIN TRANSACTION":
            self.trancount, self.xact, self.savepoints, self.base = 1, 1, [], list(self.t)
            return [ResultSet()]
        if sql == mssql._GUARD:
            if self.xact == 1 and self.trancount == 1:
                self.savepoints.append(list(self.t))
                return [ResultSet()]
            raise pyodbc.ProgrammingError(
                "42000", f"[42000] [FreeTDS][SQL Server]{mssql.GUARD_MESSAGE} (50000) (SQLExecDirectW)")
        if sql == "SELECT @@TRANCOUNT, XACT_STATE()":
            return [ResultSet(["", ""], [(self.trancount, self.xact)])]
        if sql == "ROLLBACK TRANSACTION sqlrl_sp":
            self.t = self.savepoints.pop()
            return [ResultSet()]
        if sql == "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION":
            if self.trancount:
                self.t, self.trancount, self.xact = self.base, 0, 0
            return [ResultSet()]
        if sql in ("SELECT @@TRANCOUNT", "SELECT 1"):
            return [ResultSet([""], [(self.trancount if "TRAN" in sql else 1,)])]
        if sql.startswith("INSERT INTO t VALUES"):
            self.t.append(int(sql.split("(")[1].rstrip(")")))
            return [ResultSet(rowcount=1)]
        if sql == "SELECT x FROM t":
            return [ResultSet(["x"], [(x,) for x in self.t])]
        outcome = self.script[sql]
        if isinstance(outcome, tuple):
            exc, effect = outcome
            if effect == "partial":
                self.t.append(99)
            elif effect == "abort":
                self.t, self.trancount, self.xact = self.base, 0, 0
            elif effect == "doom":
                self.xact = -1
            raise exc
        return outcome


class FakeCursor:
    """Without MARS a connection serves one statement at a time: a cursor whose results are not
    read to the end (or cancelled, or closed) keeps the connection busy, as with the real drivers."""

    def __init__(self, conn):
        self.conn, self.sets, self.rows = conn, [], []
        self.description, self.rowcount, self.cancelled, self.closed = None, -1, False, False

    def execute(self, sql):
        if self.conn.busy not in (None, self):
            raise pyodbc.Error("HY000", "[HY000] [FreeTDS][SQL Server]Connection is busy with "
                                        "results for another command (0) (SQLExecDirectW)")
        self.conn.busy = self
        self.sets = list(self.conn.handle(sql))
        self._load()
        return self

    def _load(self):
        s = self.sets.pop(0)
        if isinstance(s, Exception):
            if not self.sets:  # T-SQL goes on after a statement-level error: still busy if more
                self._free()
            raise s
        self.description, self.rows, self.rowcount = s.description, list(s.rows), s.rowcount

    def _free(self):
        self.sets, self.rows = [], []
        if self.conn.busy is self:
            self.conn.busy = None

    def fetchone(self):
        if not self.rows and not self.sets:
            self._free()
        return self.rows.pop(0) if self.rows else None

    def fetchmany(self, n):
        out, self.rows = self.rows[:n], self.rows[n:]
        return out

    def nextset(self):
        if not self.sets:
            self.description = None
            self._free()
            return False
        self._load()
        return True

    def cancel(self):
        self.cancelled = True
        self._free()

    def close(self):
        self.closed = True
        self._free()


class SteppingClock:
    """``time`` for the executor and the adapters: ``monotonic()`` moves 10 ms per call, so a
    timeout derived from a statement's deadline is checked exactly, whatever the machine load."""

    def __init__(self) -> None:
        self.now = time.monotonic()  # never behind the real clock (the watchdog reads that one)

    def monotonic(self) -> float:
        self.now += 0.01
        return self.now

    def __getattr__(self, name):  # perf_counter, time, sleep: the real ones
        return getattr(time, name)


@pytest.fixture()
def stepping_clock(monkeypatch) -> SteppingClock:
    from sqlrl.db import executor

    clock = SteppingClock()
    for module in (executor, mssql, oracle):
        monkeypatch.setattr(module, "time", clock)
    return clock


def mssql_session(conn, **limits):
    adapter = get_dialect("mssql")
    url = "mssql+pyodbc://u:p@fake/db?driver=FreeTDS"
    return Session(adapter, conn, adapter.begin(conn, parse_url(url)), url, Limits(**limits))


def test_mssql_state_persists_and_each_statement_gets_a_savepoint(stepping_clock):
    conn = FakeODBC()
    s = mssql_session(conn, timeout_s=2.5)
    r = s.execute("INSERT INTO t VALUES (4); SELECT x FROM t")
    assert r.ok and r.columns == ("x",) and r.rows == ((1,), (2,), (3,), (4,))
    assert s.execute("INSERT INTO t VALUES (5)").affected_rows == 1
    assert conn.log.count(mssql._GUARD) == 3 and len(conn.savepoints) == 3
    assert set(conn.timeouts[1:]) == {3}  # ceil of the remaining 2.5 s, set before each cursor
    s.close()
    assert conn.t == [1, 2, 3] and conn.trancount == 0 and conn.closed


def test_mssql_failed_statement_is_rolled_back_to_its_savepoint():
    err = pyodbc.IntegrityError("23000", "[23000] [FreeTDS][SQL Server]Violation of PRIMARY KEY (2627) (SQLExecDirectW)")
    conn = FakeODBC({"INSERT BAD": (err, "partial")})
    s = mssql_session(conn)
    r = s.execute("INSERT INTO t VALUES (4); INSERT BAD; INSERT INTO t VALUES (5)")
    assert r.error.kind is ErrorKind.RUNTIME and r.error.statement_index == 1
    assert r.error.message == "Violation of PRIMARY KEY (error 2627, SQLSTATE 23000)"
    assert conn.log[-2:] == ["SELECT @@TRANCOUNT, XACT_STATE()", "ROLLBACK TRANSACTION sqlrl_sp"]
    assert s.execute("SELECT x FROM t").rows == ((1,), (2,), (3,), (4,))  # 99 undone, 4 kept
    assert not s.lost
    s.close()


def test_mssql_timeout_keeps_the_session_usable():
    hyt00 = pyodbc.OperationalError("HYT00", "[HYT00] [FreeTDS][SQL Server]Timeout expired (0) (SQLExecDirectW)")
    conn = FakeODBC({"WAITFOR DELAY '00:00:10'": (hyt00, None)})
    s = mssql_session(conn, timeout_s=1)
    s.execute("INSERT INTO t VALUES (4)")
    r = s.execute("WAITFOR DELAY '00:00:10'")
    assert r.error.kind is ErrorKind.TIMEOUT
    assert s.execute("SELECT x FROM t").rows[-1] == (4,)
    s.close()


@pytest.mark.parametrize("effect, detail", [("abort", "@@TRANCOUNT=0"), ("doom", "XACT_STATE()=-1")])
def test_mssql_transaction_ended_by_the_server_loses_the_session(effect, detail):
    deadlock = pyodbc.Error("40001", "[40001] [FreeTDS][SQL Server]Transaction was deadlocked (1205) (SQLExecDirectW)")
    conn = FakeODBC({"UPDATE t SET x = 1": (deadlock, effect)})
    s = mssql_session(conn)
    s.execute("INSERT INTO t VALUES (4)")
    r = s.execute("UPDATE t SET x = 1")
    assert r.error.kind is ErrorKind.SESSION_LOST and detail in r.error.message
    assert "1205" in r.error.message and s.lost
    n = len(conn.log)
    assert s.execute("SELECT x FROM t").error.kind is ErrorKind.SESSION_LOST
    assert len(conn.log) == n  # nothing more reaches the server
    s.close()
    assert conn.closed  # a lost session's connection is not reused


def test_mssql_guard_stops_statements_outside_the_transaction():
    conn = FakeODBC()
    s = mssql_session(conn)
    conn.trancount, conn.xact = 0, 0  # the transaction vanished between calls
    r = s.execute("INSERT INTO t VALUES (4)")
    assert r.error.kind is ErrorKind.SESSION_LOST and s.lost
    assert "INSERT INTO t VALUES (4)" not in conn.log and conn.t == [1, 2, 3]


def test_mssql_disconnect_skips_recovery():
    link = pyodbc.OperationalError("08S01", "[08S01] [FreeTDS][SQL Server]Communication link failure (0) (SQLExecDirectW)")
    conn = FakeODBC({"SELECT 2": (link, None)})
    s = mssql_session(conn)
    assert s.execute("SELECT 2").error.kind is ErrorKind.SESSION_LOST
    assert conn.log[-1] == "SELECT 2" and s.lost


def test_mssql_batches_return_their_first_result_set_and_surface_later_errors():
    later = pyodbc.DataError("22012", "[22012] [FreeTDS][SQL Server]Divide by zero error encountered. (8134) (SQLExecDirectW)")
    conn = FakeODBC({
        "UPDATE t SET x = 2 SELECT 7 AS a": [ResultSet(rowcount=3), ResultSet(["a"], [(7,)])],
        "UPDATE t SET x = 2 DELETE FROM t": [ResultSet(rowcount=3), ResultSet(rowcount=2)],
        "SELECT 1 AS a SELECT 1/0": [ResultSet(["a"], [(1,)]), later, ResultSet(["b"], [(2,)])],
        "SELECT 1/0 SELECT 2": [later, ResultSet(["b"], [(2,)])],
        "SELECT big": [ResultSet(["v"], [(i,) for i in range(100)])],
        "SELECT typed": [ResultSet(["d", "n", "b"], [(decimal.Decimal("2.50"), dt.date(2024, 1, 2), b"\x00\xff")])],
    })
    s = mssql_session(conn, max_rows=10)
    r = s.execute("UPDATE t SET x = 2 SELECT 7 AS a")
    assert r.columns == ("a",) and r.rows == ((7,),)
    assert s.execute("UPDATE t SET x = 2 DELETE FROM t").affected_rows == 2
    r = s.execute("SELECT 1 AS a SELECT 1/0")
    assert r.error.kind is ErrorKind.RUNTIME and "8134" in r.error.message
    assert conn.log[-1] == "ROLLBACK TRANSACTION sqlrl_sp"
    r = s.execute("SELECT 1/0 SELECT 2")
    assert r.error.kind is ErrorKind.RUNTIME and conn.log[-1] == "ROLLBACK TRANSACTION sqlrl_sp"
    r = s.execute("SELECT big")
    assert r.truncated and r.row_count == 10
    big_cursor = next(c for c in reversed(conn.cursors) if c.closed and c.cancelled)
    assert big_cursor is not None  # the rest of a capped batch is cancelled
    r = s.execute("SELECT typed")
    assert r.rows == ((2.5, "2024-01-02", "0x00ff"),) and type(r.rows[0]) is tuple
    s.close()


def test_mssql_connection_reuse_only_when_clean():
    adapter = get_dialect("mssql")
    conn = FakeODBC()
    state = adapter.begin(conn, None)
    assert adapter.end(conn, state) is True
    state = adapter.begin(conn, None)
    conn.script["SET NOCOUNT ON"] = [ResultSet()]
    adapter.run(conn, state, "SET NOCOUNT ON", time.monotonic() + 5).close()
    assert adapter.end(conn, state) is False  # SET options outlive ROLLBACK
    assert adapter.ping(conn)


def test_mssql_connect_sets_up_the_session_and_refuses_sysadmin(monkeypatch):
    made = []

    class SetupConn(FakeODBC):
        def __init__(self, privileged):
            super().__init__()
            self.privileged, self.converters = privileged, {}

        def add_output_converter(self, sqltype, fn):
            self.converters[sqltype] = fn

        def handle(self, sql):
            if sql.startswith("SELECT IS_SRVROLEMEMBER"):
                self.log.append(sql)
                return [ResultSet(["", ""], [(self.privileged, 0)])]
            if sql.startswith("SET IMPLICIT_TRANSACTIONS OFF"):
                self.log.append(sql)
                return [ResultSet()]
            return super().handle(sql)

    def fake_connect(privileged):
        def connect(connstr, autocommit, timeout):
            made.append((connstr, autocommit, timeout))
            conn = SetupConn(privileged)
            made.append(conn)
            return conn
        return connect

    monkeypatch.setattr(mssql.pyodbc, "connect", fake_connect(1))
    with pytest.raises(SessionError, match="sysadmin"):
        open_session("mssql+pyodbc://sa:pw@h/db?driver=FreeTDS")
    assert made[-1].closed
    monkeypatch.setattr(mssql.pyodbc, "connect", fake_connect(1))
    open_session("mssql+pyodbc://sa:pw@h/db?driver=FreeTDS&allow_superuser=1").close()
    monkeypatch.setattr(mssql.pyodbc, "connect", fake_connect(0))
    with open_session("mssql+pyodbc://u:pw@h/db?driver=FreeTDS&connect_timeout=4",
                      limits=Limits(timeout_s=2.5)) as s:
        conn = made[-1]
        assert made[-2][1:] == (True, 4)  # driver autocommit on, login timeout
        assert conn.log[0] == ("SET IMPLICIT_TRANSACTIONS OFF; SET XACT_ABORT OFF; "
                               "SET LOCK_TIMEOUT 2500; SET TEXTSIZE 67108864")
        assert conn.timeout == 3 and mssql.SQL_SS_TIMESTAMPOFFSET in conn.converters
        assert s.execute("SELECT x FROM t").rows == ((1,), (2,), (3,))


# --- Oracle transaction logic on a scripted connection ---------------------------------------------

class FakeOracle:
    """A python-oracledb connection to a pretend Oracle: table ``t``, one savepoint name, and
    ``user_private_temp_tables``. ``script`` maps statements to rows or ``(exception, effect)``."""

    def __init__(self, script=None, ptts=(), ptt_view=True):
        self.t, self.base, self.script, self.log = [1, 2, 3], [1, 2, 3], dict(script or {}), []
        self.savepoint, self.ptts, self.ptt_view = None, list(ptts), ptt_view
        self.call_timeout, self.call_timeouts, self.closed = 0, [], False
        self.autocommit, self.outputtypehandler = False, None

    def cursor(self):
        return FakeOraCursor(self)

    def rollback(self):
        self.log.append("<rollback>")
        self.t, self.savepoint = list(self.base), None

    def ping(self):
        if self.closed:
            raise _create_exception(ora_errors.ERR_NOT_CONNECTED)

    def close(self):
        self.closed = True

    def handle(self, sql):
        self.log.append(sql)
        self.call_timeouts.append(self.call_timeout)
        if sql == "SAVEPOINT sqlrl_sp":
            self.savepoint = list(self.t)
            return None
        if sql == "ROLLBACK TO SAVEPOINT sqlrl_sp":
            if self.savepoint is None:
                raise ora(1086, "savepoint 'SQLRL_SP' never established in this session or is invalid")
            self.t = list(self.savepoint)
            return None
        if sql == "SELECT table_name FROM user_private_temp_tables":
            if not self.ptt_view:
                raise ora(942, "table or view does not exist")
            return [(p,) for p in self.ptts]
        if sql.startswith('DROP TABLE "'):
            self.ptts.remove(sql.split('"')[1])
            return None
        if sql.startswith("INSERT INTO t VALUES"):
            self.t.append(int(sql.split("(")[1].rstrip(")")))
            return 1
        if sql == "SELECT x FROM t":
            return [(x,) for x in self.t]
        outcome = self.script[sql]
        if isinstance(outcome, tuple):
            exc, effect = outcome
            if effect == "partial":
                self.t.append(99)
            elif effect == "commit":  # something ended the transaction: the savepoint is gone
                self.base, self.savepoint = list(self.t), None
            raise exc
        return outcome


class FakeOraCursor:
    def __init__(self, conn):
        self.conn, self.rows, self.description, self.rowcount = conn, [], None, -1
        self.arraysize = self.prefetchrows = 0

    def execute(self, sql):
        out = self.conn.handle(sql)
        if isinstance(out, list):
            self.rows, self.description = list(out), [("X",)]
        else:
            self.description, self.rowcount = None, (out or 0)
        return self

    def fetchone(self):
        return self.rows.pop(0) if self.rows else None

    def fetchall(self):
        out, self.rows = self.rows, []
        return out

    def fetchmany(self, n):
        out, self.rows = self.rows[:n], self.rows[n:]
        return out

    def close(self):
        pass


def oracle_session(conn, **limits):
    adapter = get_dialect("oracle")
    url = "oracle://u:p@fake/?service_name=X"
    return Session(adapter, conn, adapter.begin(conn, parse_url(url)), url, Limits(**limits))


def test_oracle_savepoints_timeouts_and_rollback_on_error(stepping_clock):
    timeout = _create_exception(ora_errors.ERR_CALL_TIMEOUT_EXCEEDED, timeout=1500)
    conn = FakeOracle({"UPDATE BAD": (ora(1, "unique constraint violated"), "partial"),
                       "SELECT slow FROM dual": (timeout, None)})
    s = oracle_session(conn, timeout_s=1.5)
    assert s.execute("INSERT INTO t VALUES (4)").affected_rows == 1
    r = s.execute("UPDATE BAD")
    assert r.error.kind is ErrorKind.RUNTIME and conn.log[-1] == "ROLLBACK TO SAVEPOINT sqlrl_sp"
    r = s.execute("SELECT slow FROM dual")
    assert r.error.kind is ErrorKind.TIMEOUT
    assert s.execute("SELECT x FROM t").rows == ((1,), (2,), (3,), (4,))
    # from the deadline, in ms (on the stepping clock some of the 1.5 s is gone)
    assert conn.call_timeouts and all(1400 <= ms < 1500 for ms in conn.call_timeouts)
    s.close()
    assert conn.t == [1, 2, 3] and conn.closed


def test_oracle_lost_transaction_or_connection_loses_the_session():
    conn = FakeOracle({"UPDATE x": (ora(60, "deadlock detected"), "commit")})
    s = oracle_session(conn)
    r = s.execute("UPDATE x")
    assert r.error.kind is ErrorKind.SESSION_LOST and "ORA-01086" in r.error.message and s.lost
    conn = FakeOracle({"SELECT 1 FROM dual": (ora(3113, "end-of-file on communication channel"), None)})
    s = oracle_session(conn)
    assert s.execute("SELECT 1 FROM dual").error.kind is ErrorKind.SESSION_LOST
    assert conn.log[-1] == "SELECT 1 FROM dual"  # no recovery attempt on a dead connection
    assert s.execute("SELECT x FROM t").error.kind is ErrorKind.SESSION_LOST


def test_oracle_end_drops_leftover_private_temp_tables():
    adapter = get_dialect("oracle")
    conn = FakeOracle(ptts=["ORA$PTT_A"])
    assert adapter.end(conn, adapter.begin(conn, None)) is True and conn.ptts == []
    assert conn.log[-1] == 'DROP TABLE "ORA$PTT_A"'
    conn = FakeOracle(ptt_view=False)  # before 18c: no private temporary tables at all
    assert adapter.end(conn, adapter.begin(conn, None)) is True
    assert adapter.ping(conn) and (conn.close() or not adapter.ping(conn))


def test_oracle_connect_sets_up_the_session_and_refuses_dba(monkeypatch):
    made = []

    class SetupConn(FakeOracle):
        def __init__(self, roles):
            super().__init__()
            self.roles = roles

        def handle(self, sql):
            if sql.startswith("SELECT USER, SYS_CONTEXT"):
                return [("APP", "FALSE")]
            if sql == "SELECT role FROM session_roles":
                return [(r,) for r in self.roles]
            if sql == "SELECT privilege FROM session_privs":
                return [("CREATE SESSION",)]
            return super().handle(sql)

    def fake_connect(roles):
        def connect(**kw):
            made.append(kw)
            conn = SetupConn(roles)
            made.append(conn)
            return conn
        return connect

    monkeypatch.setattr(oracle.oracledb, "connect", fake_connect(["CONNECT", "DBA"]))
    with pytest.raises(SessionError, match="role DBA"):
        open_session("oracle://app:pw@h/?service_name=X")
    assert made[-1].closed
    monkeypatch.setattr(oracle.oracledb, "connect", fake_connect(["CONNECT", "RESOURCE"]))
    with open_session("oracle://app:pw@h/?service_name=X", limits=Limits(timeout_s=2)) as s:
        conn = made[-1]
        assert made[-2]["service_name"] == "X" and conn.autocommit is False
        assert conn.outputtypehandler is oracle.output_type_handler
        assert s.execute("SELECT x FROM t").rows == ((1,), (2,), (3,))
