"""Oracle sandbox rules: the reason a statement is refused before it reaches the server.
UNVERIFIED, like the adapter (``oracle.py``): written from the vendor's documentation and run only
on fakes, never against an Oracle server; see docs/unverified_dialects.md.

``oracle_denial(statement)`` reads the tokens the call was split by (sqlglot's Oracle tokenizer,
``glot_lex.ORACLE``). Oracle commits implicitly before and after every DDL statement, which would
make the session's changes permanent, so of Oracle's statement types only queries, DML and private
temporary tables pass. ``oracle.py`` imports the names back (``OracleDialect.denial``).

Guarantees:
- Allowed: SELECT/WITH, INSERT, UPDATE, DELETE, MERGE, EXPLAIN PLAN FOR one of those, CREATE
  PRIVATE TEMPORARY TABLE (not ON COMMIT PRESERVE DEFINITION) and DROP TABLE ora$ptt_name [PURGE].
  Refused: every other DDL (it commits), ALTER SESSION/SYSTEM, PL/SQL blocks, CALL/EXEC, LOCK
  TABLE, SET ROLE/CONSTRAINTS, ADMINISTER KEY MANAGEMENT. A first word that starts no Oracle
  statement is left to the server (ORA-00900).
- Refused anywhere in a statement: inline PL/SQL (WITH FUNCTION/PROCEDURE, PRAGMA), EXECUTE
  IMMEDIATE, UTL_* and DBMS_* packages (except DBMS_RANDOM, DBMS_LOB), URI types and BFILENAME
  (network and file access), database links (``table@link``).
- The rules are a friendly early error (a readable reason instead of a server error or an
  implicit commit), not the wall: the server is, with an unprivileged account (the adapter refuses
  SYS/SYSTEM, SYSDBA, DBA roles and system privileges unless ``?allow_superuser=1``) inside one
  transaction that is rolled back at the session's end.
- Pure: imports no driver (only ``Statement`` and ``glot_lex``).
"""

from __future__ import annotations

from ..statements import Statement
from .glot_lex import ORACLE

PTT_PREFIX = "ORA$PTT_"  # the default private_temp_table_prefix
DML = {"SELECT", "WITH", "INSERT", "UPDATE", "DELETE", "MERGE"}
DDL = {"CREATE", "ALTER", "DROP", "TRUNCATE", "RENAME", "GRANT", "REVOKE", "COMMENT", "ANALYZE",
       "AUDIT", "NOAUDIT", "PURGE", "FLASHBACK", "ASSOCIATE", "DISASSOCIATE"}
ALLOWED_PACKAGES = {"DBMS_RANDOM", "DBMS_LOB"}
DENIED_NAMES = {"HTTPURITYPE", "DBURITYPE", "XDBURITYPE", "URIFACTORY", "BFILENAME"}
_DDL_REASON = ("Oracle commits the transaction implicitly on DDL, which would make the session's "
               "changes permanent; only queries, DML and private temporary tables (CREATE PRIVATE "
               "TEMPORARY TABLE ora$ptt_name ..., DROP TABLE ora$ptt_name) are allowed")
def oracle_denial(statement: Statement | str) -> str | None:
    """The reason the Oracle sandbox rejects ``statement``, or None.

    Of Oracle's SQL statements only these are allowed: SELECT/WITH, INSERT, UPDATE, DELETE, MERGE,
    EXPLAIN PLAN FOR one of those, CREATE PRIVATE TEMPORARY TABLE (not ON COMMIT PRESERVE
    DEFINITION) and DROP TABLE ora$ptt_name; every other statement type (DDL, which commits; ALTER
    SESSION/SYSTEM; PL/SQL blocks; CALL; LOCK TABLE; SET ROLE; ADMINISTER KEY MANAGEMENT) is
    refused. A first word that starts no Oracle statement is left to the server (ORA-00900).
    Denied everywhere in a statement: inline PL/SQL (WITH FUNCTION/PROCEDURE, PRAGMA), EXECUTE IMMEDIATE,
    UTL_* and DBMS_* packages (except DBMS_RANDOM, DBMS_LOB), URI types and BFILENAME (network
    and file access), and database links (``table@link``). Read on the tokens the call was split
    by (``glot_lex.ORACLE``).
    """
    tokens = list(ORACLE.tokens_of(statement))
    words = [text if kind != "IDENT" else "" for kind, text in tokens]  # never keywords if quoted
    names = [text for _, text in tokens]
    if not tokens:
        return None
    start = 0
    while start < len(words) and words[start] == "(":
        start += 1
    lead = words[start] if start < len(words) else ""
    nxt = words[start + 1:start + 4]
    if lead in DML:
        pass
    elif lead == "EXPLAIN":
        target = next((words[i + 1] for i in range(start, len(words) - 1) if words[i] == "FOR"), "")
        if target not in DML:
            return "EXPLAIN PLAN is allowed only FOR a query or DML statement"
    elif lead == "CREATE" and nxt[:3] == ["PRIVATE", "TEMPORARY", "TABLE"]:
        for i in range(start, len(words) - 1):
            if words[i] == "PRESERVE" and words[i + 1] == "DEFINITION":
                return ("ON COMMIT PRESERVE DEFINITION is not allowed: Oracle commits the transaction "
                        "when creating such a table; use the default ON COMMIT DROP DEFINITION")
    elif lead == "DROP":
        rest = names[start + 1:]
        if not (len(rest) in (2, 3) and rest[0] == "TABLE" and rest[1].startswith(PTT_PREFIX)
                and rest[2:] in ([], ["PURGE"])):
            return _DDL_REASON
    elif lead == "ALTER" and nxt[:1] in (["SESSION"], ["SYSTEM"]):
        return f"ALTER {nxt[0]} (changing session or system settings) is not allowed"
    elif lead in DDL:
        return _DDL_REASON
    elif lead in ("BEGIN", "DECLARE"):
        return "anonymous PL/SQL blocks are not allowed (they could commit or run dynamic SQL)"
    elif lead in ("CALL", "EXEC", "EXECUTE"):
        return "calling procedures is not allowed (a procedure could commit or run dynamic SQL)"
    elif lead == "LOCK":
        return "LOCK TABLE is not allowed"
    elif lead == "SET":
        return "changing session settings (SET ROLE, SET CONSTRAINTS) is not allowed"
    elif lead == "ADMINISTER":
        return "ADMINISTER KEY MANAGEMENT is not allowed"
    # Any other first word is none of Oracle's SQL statements: the server rejects it (ORA-00900,
    # a syntax error), so it is left to the server to say so.
    for i, (kind, text) in enumerate(tokens):
        word = words[i]
        following = words[i + 1] if i + 1 < len(words) else ""
        if word == "WITH" and following in ("FUNCTION", "PROCEDURE"):
            return "inline PL/SQL (WITH FUNCTION/PROCEDURE) is not allowed"
        if word == "PRAGMA":
            return "PL/SQL pragmas (autonomous transactions) are not allowed"
        if word == "EXECUTE" and following == "IMMEDIATE":
            return "dynamic SQL (EXECUTE IMMEDIATE) is not allowed"
        if (text.startswith("UTL_") or text.startswith("DBMS_")) and text not in ALLOWED_PACKAGES:
            return f"the {text} package is not allowed (file, network, scheduler or dynamic SQL access)"
        if text in DENIED_NAMES:
            return f"{text} is not allowed (file or network access)"
        if "@" in word:
            return "database links (name@link) are not allowed"
    return None
