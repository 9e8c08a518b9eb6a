"""The built-in engines: one ``Dialect`` descriptor per engine, next to its adapter module.

**Adding an engine** = its adapter module in this folder (``@register_dialect("name")``, the
``DialectAdapter`` Protocol and the optional capabilities of ``contract.py``, checked when the
class registers) + one ``register(Dialect(...))`` below, whose ``storage`` says where a database
lives (``FileCopy``, ``ServerClone``: then an admin class, ``contract.ServerAdmin``). Nothing else
names engines: every other module reads these descriptors (``descriptor.py``), and
tests/unit/test_dialect_registry.py both fails on a per-dialect map anywhere else and shows a
test-only engine working end to end with no other edit.

Importing this module imports no driver: adapter, lexer and admin modules are named, not imported.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from .descriptor import Dialect, FileCopy, LoadTypes, ServerClone, ServerTransaction, register

_INFORMATION_SCHEMA_COLUMNS = (
    "SELECT table_name, column_name, data_type, is_nullable = 'NO' FROM information_schema.columns "
    "WHERE table_schema = {schema} ORDER BY table_name, ordinal_position")


def _one_per_statement(run: Callable[[str], Any], sql: str) -> float:
    """BIRD-CRITIC's SQLite plan cost: 1.0 per DML statement (nothing is explained)."""
    return 1.0


def _explain_json_total_cost(run: Callable[[str], Any], sql: str) -> float:
    """PostgreSQL's estimate: ``Total Cost`` of ``EXPLAIN (FORMAT JSON)``, as BIRD-CRITIC sums it."""
    rows = run("EXPLAIN (FORMAT JSON) " + sql)
    plan = json.loads(rows[0][0]) if isinstance(rows[0][0], str) else rows[0][0]
    return float(plan[0]["Plan"]["Total Cost"])


SQLITE = register(Dialect(
    name="sqlite", display_name="SQLite", sqlglot="sqlite",
    adapter="sqlrl.db.dialects.sqlite", lexer="sqlrl.db.dialects.sqlite_lex",
    storage=FileCopy(suffixes=(".sqlite", "_template.sqlite"), sqlite_file=True),
    declared_types=True, one_statement_per_call=True,
    columns_sql=("SELECT m.name, p.name, p.type, p.\"notnull\" FROM sqlite_master AS m "
                 "JOIN pragma_table_info(m.name) AS p WHERE m.type IN ('table', 'view') "
                 "AND m.name NOT LIKE 'sqlite_%' ORDER BY m.name, p.cid"),
    plan_cost=_one_per_statement))

POSTGRESQL = register(Dialect(
    name="postgresql", display_name="PostgreSQL", sqlglot="postgres", aliases=("postgres", "pg"),
    adapter="sqlrl.db.dialects.postgresql", lexer="sqlrl.db.dialects.postgresql_lex",
    storage=ServerClone(),
    admin="sqlrl.db.dialects.postgresql_admin:PostgresAdmin", admin_url_env="SQLRL_PG_ADMIN_URL",
    load=LoadTypes(types={"integer": "BIGINT", "real": "DOUBLE PRECISION", "text": "TEXT",
                          "blob": "BYTEA", "date": "DATE", "timestamp": "TIMESTAMP"}),
    columns_sql=_INFORMATION_SCHEMA_COLUMNS.format(schema="current_schema()"),
    plan_cost=_explain_json_total_cost))

MYSQL = register(Dialect(
    name="mysql", display_name="MySQL", sqlglot="mysql", aliases=("mariadb",),
    adapter="sqlrl.db.dialects.mysql", lexer="sqlrl.db.dialects.mysql_lex", storage=ServerClone(),
    quotes=("`", "`"), sqlglot_reserved=True, one_statement_per_call=True,
    admin="sqlrl.db.dialects.mysql_admin:MySQLAdmin", admin_url_env="SQLRL_MYSQL_ADMIN_URL",
    load=LoadTypes(types={"integer": "BIGINT", "real": "DOUBLE", "text": "LONGTEXT",
                          "blob": "LONGBLOB", "date": "DATE", "timestamp": "DATETIME(6)"},
                   table_suffix=" DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
                   key_varchar_max=768),
    columns_sql=_INFORMATION_SCHEMA_COLUMNS.format(schema="DATABASE()")))

MSSQL = register(Dialect(
    name="mssql", display_name="SQL Server (T-SQL)", sqlglot="tsql",
    aliases=("sqlserver", "sql server", "tsql"), adapter="sqlrl.db.dialects.mssql",
    lexer="sqlrl.db.dialects.glot_lex:TSQL", storage=ServerTransaction(),
    quotes=("[", "]"), admin_url_env="SQLRL_MSSQL_ADMIN_URL", verified=False,
    reserved_words=frozenset(
        "BACKUP BREAK BROWSE BULK CLUSTERED COMPUTE CONTAINS DENY DISK DUMP ERRLVL EXEC EXECUTE "
        "EXIT FILE FILLFACTOR FREETEXT IDENTITY KILL LINENO LOAD MERGE NATIONAL OPEN OPTION OVER "
        "PERCENT PIVOT PRINT PROC PROCEDURE PUBLIC READ RETURN REVERT REVOKE RULE SCHEMA SHUTDOWN "
        "STATISTICS TOP TRAN TRUNCATE UNPIVOT USE WAITFOR WHILE".split())))

ORACLE = register(Dialect(
    name="oracle", display_name="Oracle", sqlglot="oracle", adapter="sqlrl.db.dialects.oracle",
    lexer="sqlrl.db.dialects.glot_lex:ORACLE", storage=ServerTransaction(),
    admin_url_env="SQLRL_ORACLE_ADMIN_URL", verified=False,
    reserved_words=frozenset("ACCESS COMMENT DATE FILE LEVEL MODE NUMBER RESOURCE ROWID ROWNUM "
                             "SIZE START UID".split())))
