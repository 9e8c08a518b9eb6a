"""SQL Server sandbox rules: the reason a T-SQL batch is refused before it reaches the server.
UNVERIFIED, like the adapter (``mssql.py``): written from the vendor's documentation and run only
on fakes, never against a SQL Server; see docs/unverified_dialects.md.

``mssql_denial(statement)`` reads the tokens the call was split into (sqlglot's T-SQL tokenizer,
``glot_lex.TSQL``: strings and nested comments dropped, the text after command words such as PRINT
read again). T-SQL runs several statements in one batch without semicolons, so the rules look at
every token of the batch, not only the first word. ``mssql.py`` imports the names back
(``MSSQLDialect.denial``).

Guarantees:
- Refused: transaction control anywhere in the batch (COMMIT, ROLLBACK, SAVE TRAN, BEGIN TRAN,
  BEGIN DISTRIBUTED); EXEC of anything but read-only catalog procedures (so no dynamic SQL,
  xp_cmdshell, sp_executesql) and a batch that starts with a procedure name (a misspelled keyword
  included); USE, SHUTDOWN, RECONFIGURE, BACKUP/RESTORE, DBCC, KILL, CHECKPOINT;
  OPENROWSET/OPENDATASOURCE/OPENQUERY and BULK (remote and file access); GRANT/REVOKE/DENY;
  impersonation (EXECUTE AS, SETUSER, REVERT); CREATE/ALTER/DROP of logins, users, roles,
  databases and other server objects; UPDATE STATISTICS; SET options that change the transaction
  or the sandbox (only ``ALLOWED_SET_OPTIONS`` and ``SET @variable`` may start a statement);
  global temporary tables (``##t``); ODBC escapes (``{call ...}``).
- The rules are a friendly early error (a readable reason instead of a server error or a broken
  session), not the wall: the server is, with an unprivileged login (the adapter refuses sysadmin
  and CONTROL SERVER unless ``?allow_superuser=1``) inside one transaction that is rolled back
  at the session's end.
- Pure: imports no driver (only ``Statement`` and ``glot_lex``).
"""

from __future__ import annotations

from ..statements import Statement
from .glot_lex import TSQL


# Words that start a T-SQL statement. A batch that starts with any other name is a stored
# procedure call (EXEC is optional for the first statement of a batch).
STATEMENT_KEYWORDS = {
    "SELECT", "WITH", "INSERT", "UPDATE", "DELETE", "MERGE", "CREATE", "ALTER", "DROP", "TRUNCATE",
    "DECLARE", "SET", "IF", "WHILE", "PRINT", "RAISERROR", "THROW", "WAITFOR", "EXEC", "EXECUTE",
    "RETURN", "BREAK", "CONTINUE", "GOTO", "OPEN", "FETCH", "CLOSE", "DEALLOCATE", "ENABLE",
    "DISABLE", "BEGIN", "END", "COMMIT", "ROLLBACK", "SAVE",
}
# Read-only catalog procedures the agent may call (EXEC sp_help 'orders', sp_columns orders).
CATALOG_PROCEDURES = {
    "SP_HELP", "SP_HELPTEXT", "SP_HELPINDEX", "SP_HELPCONSTRAINT", "SP_COLUMNS", "SP_TABLES",
    "SP_PKEYS", "SP_FKEYS", "SP_STORED_PROCEDURES", "SP_SPECIAL_COLUMNS", "SP_DATATYPE_INFO",
}
# Reserved T-SQL words denied wherever they appear unquoted (they cannot be plain identifiers).
DENIED_WORDS = {
    "COMMIT": "transaction control is not allowed: the session manages its own transaction",
    "ROLLBACK": "transaction control is not allowed: the session manages its own transaction",
    "SAVE": "transaction control (SAVE TRANSACTION) is not allowed: the session manages its own "
            "savepoints",
    "DISTRIBUTED": "distributed transactions are not allowed",
    "USE": "USE (switching databases) is not allowed in a session",
    "SHUTDOWN": "SHUTDOWN is not allowed",
    "RECONFIGURE": "RECONFIGURE is not allowed",
    "BACKUP": "BACKUP is not allowed",
    "RESTORE": "RESTORE is not allowed",
    "DBCC": "DBCC commands are not allowed",
    "KILL": "KILL is not allowed",
    "CHECKPOINT": "CHECKPOINT is not allowed",
    "OPENROWSET": "OPENROWSET (ad hoc remote or file access) is not allowed",
    "OPENDATASOURCE": "OPENDATASOURCE (ad hoc remote access) is not allowed",
    "OPENQUERY": "OPENQUERY (linked servers) is not allowed",
    "BULK": "BULK INSERT / OPENROWSET(BULK ...) (file access) is not allowed",
    "SETUSER": "SETUSER (impersonation) is not allowed",
    "REVERT": "REVERT (impersonation) is not allowed",
    "GRANT": "changing permissions (GRANT) is not allowed",
    "REVOKE": "changing permissions (REVOKE) is not allowed",
    "DENY": "changing permissions (DENY) is not allowed",
    "WRITETEXT": "WRITETEXT is not allowed",
    "UPDATETEXT": "UPDATETEXT is not allowed",
}
# SET options that change how the session's transaction or the sandbox behave.
DENIED_SET_OPTIONS = {
    "IMPLICIT_TRANSACTIONS", "XACT_ABORT", "ANSI_DEFAULTS", "NOEXEC", "PARSEONLY", "FMTONLY",
    "SHOWPLAN_ALL", "SHOWPLAN_TEXT", "SHOWPLAN_XML", "REMOTE_PROC_TRANSACTIONS",
    "CURSOR_CLOSE_ON_COMMIT", "CONTEXT_INFO", "QUERY_GOVERNOR_COST_LIMIT", "TEXTSIZE", "FORCEPLAN",
    "OFFSETS", "LOCK_TIMEOUT",
}
# SET options a statement may start with (SET @variable = ... is allowed too).
ALLOWED_SET_OPTIONS = {
    "NOCOUNT", "DATEFORMAT", "DATEFIRST", "LANGUAGE", "ANSI_NULLS", "ANSI_PADDING", "ANSI_WARNINGS",
    "ANSI_NULL_DFLT_ON", "ANSI_NULL_DFLT_OFF", "CONCAT_NULL_YIELDS_NULL", "ARITHABORT",
    "ARITHIGNORE", "NUMERIC_ROUNDABORT", "QUOTED_IDENTIFIER", "ROWCOUNT", "IDENTITY_INSERT",
    "STATISTICS", "DEADLOCK_PRIORITY",
}
# Server-level objects: CREATE/ALTER/DROP of these is denied.
SERVER_OBJECTS = {
    "LOGIN", "USER", "ROLE", "DATABASE", "SERVER", "ASSEMBLY", "ENDPOINT", "CREDENTIAL",
    "CERTIFICATE", "MASTER", "SYMMETRIC", "ASYMMETRIC", "EVENT", "AVAILABILITY", "RESOURCE",
    "WORKLOAD", "CRYPTOGRAPHIC", "EXTERNAL", "BROKER", "APPLICATION", "SERVICE", "QUEUE", "ROUTE",
    "REMOTE", "FULLTEXT", "AUDIT", "SECURITY",
}
DENIED_PROCEDURES = {
    "XP_CMDSHELL", "XP_REGREAD", "XP_REGWRITE", "XP_REGDELETEVALUE", "XP_REGDELETEKEY", "XP_DIRTREE",
    "XP_FILEEXIST", "XP_SUBDIRS", "XP_FIXEDDRIVES", "XP_AVAILABLEMEDIA", "XP_SERVICECONTROL",
    "XP_INSTANCE_REGREAD", "XP_INSTANCE_REGWRITE", "XP_LOGINCONFIG", "XP_GETNETNAME",
    "SP_CONFIGURE", "SP_EXECUTESQL", "SP_EXECUTE_EXTERNAL_SCRIPT", "SP_ADDLINKEDSERVER",
    "SP_ADDLINKEDSRVLOGIN", "SP_ADDSRVROLEMEMBER", "SP_ADDLOGIN", "SP_PASSWORD", "SP_SETAPPROLE",
    "SP_START_JOB", "SP_ADD_JOB", "SP_ADD_JOBSTEP", "SP_SEND_DBMAIL", "SP_PREPARE", "SP_EXECUTE",
    "SP_PREPEXEC", "SP_RESET_CONNECTION",
}

def _procedure_at(tokens: list[tuple[str, str]], i: int) -> tuple[str | None, int]:
    """The (last part of the) procedure name starting at ``tokens[i]`` and the index after it."""
    name = None
    while i < len(tokens):
        kind, text = tokens[i]
        if text == ".":
            i += 1
            continue
        if kind == "IDENT" or (kind == "WORD" and not text.startswith("@")):
            name = text
            i += 1
            if i < len(tokens) and tokens[i][1] == ".":
                continue
        break
    return name, i


def mssql_denial(statement: Statement | str) -> str | None:
    """The reason the SQL Server sandbox rejects ``statement``, or None.

    Denied: transaction control anywhere in the batch (COMMIT/ROLLBACK/SAVE TRAN/BEGIN TRAN), EXEC
    of anything but read-only catalog procedures (so no dynamic SQL, xp_cmdshell, sp_executesql),
    a batch that starts with a procedure name, USE, SHUTDOWN, RECONFIGURE, BACKUP/RESTORE, DBCC,
    KILL, CHECKPOINT, OPENROWSET/OPENDATASOURCE/OPENQUERY, BULK INSERT, GRANT/REVOKE/DENY,
    impersonation (EXECUTE AS, SETUSER, REVERT), CREATE/ALTER/DROP of logins, users, roles,
    databases and other server objects (so ALTER SERVER/DATABASE), UPDATE STATISTICS, ``SET``
    options that change the transaction or the sandbox (IMPLICIT_TRANSACTIONS, XACT_ABORT,
    ANSI_DEFAULTS, NOEXEC, TEXTSIZE, ...), global temp tables (``##t``, visible to other sessions)
    and ODBC escapes (``{call ...}``). Read on the tokens the call was split by (``glot_lex.TSQL``).
    """
    tokens = list(TSQL.tokens_of(statement))
    # unquoted words and punctuation; "" for quoted identifiers (never keywords)
    words = [text if kind != "IDENT" else "" for kind, text in tokens]
    # 1. the first word: a statement keyword, or else a stored procedure call
    start = 0
    while start < len(tokens) and words[start] == "(":
        start += 1
    if start < len(tokens) and tokens[start][0] != "PUNCT":
        first_kind, first = tokens[start]
        if first_kind != "WORD" or first not in STATEMENT_KEYWORDS:
            if first in DENIED_WORDS and first_kind == "WORD":
                return DENIED_WORDS[first]
            name, _ = _procedure_at(tokens, start)
            if name is None or name not in CATALOG_PROCEDURES:
                return (f"{first.lower()} is not a T-SQL statement keyword, so the batch is a "
                        "stored procedure call; only read-only catalog procedures (sp_help, "
                        "sp_columns, sp_tables, ...) may be called")
        elif first == "SET":
            nxt = words[start + 1] if start + 1 < len(words) else ""
            if not nxt.startswith("@") and nxt not in ALLOWED_SET_OPTIONS:
                return f"SET {nxt or '(nothing)'} is not allowed in a session"
    # 2. every token of the batch (T-SQL runs several statements without semicolons)
    for i, (kind, text) in enumerate(tokens):
        if text in DENIED_PROCEDURES or text.startswith("SP_OA"):
            return f"{text.lower()} is not allowed"
        if kind == "IDENT":
            continue
        nxt = words[i + 1] if i + 1 < len(words) else ""
        prev = words[i - 1] if i > 0 else ""
        if text in DENIED_WORDS:
            return DENIED_WORDS[text]
        if text == "BEGIN" and nxt in ("TRAN", "TRANSACTION"):
            return ("transaction control (BEGIN TRANSACTION) is not allowed: the session manages "
                    "its own transaction")
        if text in ("EXEC", "EXECUTE"):
            if nxt == "AS":
                return "EXECUTE AS (impersonation) is not allowed"
            name, _ = _procedure_at(tokens, i + 1)
            if name is None or name not in CATALOG_PROCEDURES:
                return ("EXEC/EXECUTE is not allowed (no dynamic SQL or stored procedures), "
                        "except read-only catalog procedures such as sp_help and sp_columns")
        if text in DENIED_SET_OPTIONS:
            return f"SET {text} is not allowed in a session"
        if text in ("CREATE", "ALTER", "DROP") and nxt in SERVER_OBJECTS:
            return f"{text} {nxt} is not allowed in a session"
        if text == "ALTER" and nxt == "AUTHORIZATION":
            return "ALTER AUTHORIZATION is not allowed"
        if text == "UPDATE" and nxt == "STATISTICS":
            return "UPDATE STATISTICS is not allowed"
        if text == "SERVER" and prev == "ALL":
            return "server-level triggers and objects (ON ALL SERVER) are not allowed"
        if text.startswith("##"):
            return "global temporary tables (##name) are visible to other sessions; use #name"
        if text == "{":
            return "ODBC escape sequences ({call ...}, {fn ...}) are not allowed"
    return None
