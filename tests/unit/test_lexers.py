"""The per-engine lexers behind splitting and the keyword sandbox (no servers: the rules asserted
here are the ones found on the real servers; tests/dialects/test_lexer_differential.py checks
them against the servers themselves)."""

from __future__ import annotations

import pytest

from sqlrl.db.dialects import mysql_lex, postgresql_lex, sqlite_lex
from sqlrl.db.dialects.base import common_denial
from sqlrl.db.statements import split, split_statements

MARIADB_10_11 = mysql_lex.Flavor(mariadb=True, version=101119)
CONTROL = [chr(c) for c in range(0x00, 0x21)] + ["\x7f"]


def my_split(sql):
    return [(s.text, s.words[:1]) for s in mysql_lex.split(sql, MARIADB_10_11)]


def refused(dialect, sql):
    """The sandbox reason for the first statement that has one (common rules + the engine's)."""
    engine = {"postgres": postgresql_lex, "mysql": mysql_lex}.get(dialect)
    for s in split(sql, dialect):
        reason = common_denial(s) or (engine.denial(s) if engine else None)
        if reason:
            return reason
    return None


# --- MariaDB / MySQL ---------------------------------------------------------------------------

@pytest.mark.parametrize("c", CONTROL, ids=[f"0x{ord(c):02x}" for c in CONTROL])
def test_mariadb_double_dash_and_any_control_character_starts_a_comment(c):
    assert "--" not in mysql_lex.lex(f"SELECT 1 --{c}", MARIADB_10_11).code
    if c not in "\n\x00":  # these two also end the comment at once
        statements = mysql_lex.split(f"SELECT 1 --{c}x\nKILL 5", MARIADB_10_11)
        assert [s.words[:2] for s in statements] == [("SELECT", "KILL")]  # 'x' was comment
        assert mysql_lex.split(f"--{c}x\nKILL 5", MARIADB_10_11)[0].words[0] == "KILL"


@pytest.mark.parametrize("c", [chr(c) for c in range(0x21, 0x7f)] + ["\xa0", "\u2028", "é"])
def test_mariadb_double_dash_before_anything_else_is_two_minus_signs(c):
    s = mysql_lex.lex(f"--{c}x\nKILL 5", MARIADB_10_11)
    assert "--" in s.code  # code, not comment: the sandbox reads what follows as code too


def test_mariadb_line_comments_end_at_lf_or_nul_not_cr():
    assert my_split("SELECT 1 -- a\rKILL 5") == [("SELECT 1 -- a\rKILL 5", ("SELECT",))]
    assert mysql_lex.lex("SELECT 1 # a\r; KILL 5").parts == 1
    assert mysql_lex.lex("SELECT 1 # a\n; KILL 5").parts == 2
    assert mysql_lex.lex("SELECT 1 -- a\x00; KILL 5").parts == 2
    assert mysql_lex.lex("SELECT 1 --").code.strip() == "SELECT 1"  # '--' at the end


@pytest.mark.parametrize("text, runs", [
    ("/*! KILL 5 */", True), ("/*!40101 KILL 5 */", True), ("/*!50700 KILL 5 */", False),
    ("/*!99999 KILL 5 */", False), ("/*!100000 KILL 5 */", True), ("/*!101100 KILL 5 */", True),
    ("/*!101199 KILL 5 */", False), ("/*!110000 KILL 5 */", False), ("/*!1234567 KILL 5 */", False),
    ("/*M! KILL 5 */", True), ("/*M!50700 KILL 5 */", True), ("/*M!100000 KILL 5 */", True),
    ("/*M!999999 KILL 5 */", False), ("/*m! KILL 5 */", False), ("/*+ KILL 5 */", False),
    ("/* KILL 5 */", False),
])
def test_mariadb_executable_comments_by_version(text, runs):
    """As MariaDB 10.11.19 ran each of these (``SELECT 5 <comment>``: the contents ran or not)."""
    words = mysql_lex.lex(f"{text} SELECT 1", MARIADB_10_11).words
    assert (words[0] == "KILL") is runs


def test_mariadb_comment_nesting_and_markers():
    # an ignored version comment may hold one regular comment; regular comments do not nest
    assert mysql_lex.lex("/*!99999 /* x */ KILL */ SELECT 1", MARIADB_10_11).words[0] == "SELECT"
    assert "KILL" in mysql_lex.lex("/* /* x */ KILL */ SELECT 1", MARIADB_10_11).words
    # inside an executable comment, a -- comment hides a */ until the end of its line
    assert mysql_lex.lex("SELECT 1 /*! -- */ KILL\n */", MARIADB_10_11).words == ("SELECT",)
    # '*/' outside a comment is code; its '/' may open a comment
    assert mysql_lex.lex("SELECT 1 */* KILL */", MARIADB_10_11).words == ("SELECT",)


def test_mariadb_strings_names_and_terminators():
    assert my_split("SELECT '\\'; COMMIT; --'") == [("SELECT '\\'; COMMIT; --'", ("SELECT",))]
    assert my_split('SELECT "a\\"; KILL 5"; SELECT 2') == [
        ('SELECT "a\\"; KILL 5"', ("SELECT",)), ("SELECT 2", ("SELECT",))]
    assert my_split("SELECT 'it''s;'; SELECT `a``;b`; SELECT x'41' ; SELECT b'1'") == [
        ("SELECT 'it''s;'", ("SELECT",)), ("SELECT `a``;b`", ("SELECT",)),
        ("SELECT x'41'", ("SELECT",)), ("SELECT b'1'", ("SELECT",))]
    assert my_split("SELECT 1 /*! ; KILL 5 */") == [  # ';' inside an executable comment ends it
        ("SELECT 1 /*!", ("SELECT",)), ("KILL 5 */", ("KILL",))]
    assert my_split("SELECT 1;;; -- x\n; /* y */") == [("SELECT 1", ("SELECT",))]
    no_escapes = mysql_lex.Flavor(backslash_escapes=False)
    assert len(mysql_lex.split("SELECT '\\'; KILL 5; -- '", no_escapes)) == 2
    assert len(mysql_lex.split("SELECT '\\'; KILL 5; --'", no_escapes)) == 1  # --' opens a string


def test_mariadb_unterminated_text_is_one_statement():
    for sql in ("SELECT 1; SELECT 'x", "SELECT 1; /* x", "SELECT 1; /*! x", "SELECT 1; `x"):
        assert len(mysql_lex.split(sql)) == 1, sql


def test_mariadb_server_flavor():
    assert mysql_lex.server_flavor("5.5.5-10.11.19-MariaDB-0+deb12u1") == MARIADB_10_11
    assert mysql_lex.server_flavor("8.0.36") == mysql_lex.Flavor(False, 80036)


@pytest.mark.parametrize("sql", [
    "SELECT 1; --\x01x\nKILL 5", "--\x1fx\nPREPARE s FROM 'SELECT 1'", "--\x7f\nSET max_statement_time = 0",
    "/*!COMMIT*/", "/*M!100000 KILL 5 */", "#\nCREATE DATABASE evil", "--\x0b\nSET PASSWORD = PASSWORD('x')",
    "/*!40101 SET GLOBAL max_connections = 1 */", "SELECT 1 /*!; KILL 5 */",
    "-- \x02 ; \n START TRANSACTION", "/*!99999 x */ EXECUTE s",
])
def test_mariadb_smuggling_is_refused(sql):
    assert refused("mysql", sql), sql


@pytest.mark.parametrize("sql", [
    "SELECT 5 --1", "SELECT '--\x01\nKILL 5'", "SELECT 1 /*!99999 KILL 5 */", "SELECT `KILL`",
    "SELECT 1 /* ; COMMIT */", "SELECT 'COMMIT; KILL 5'", "SELECT 1 -- ; COMMIT",
])
def test_mariadb_harmless_text_is_not_refused(sql):
    assert refused("mysql", sql) is None, sql


# --- PostgreSQL -----------------------------------------------------------------------------------

def test_postgresql_comments_end_at_cr_too():
    statements = postgresql_lex.split("SELECT 1 -- x\r; COMMIT")
    assert [s.kind for s in statements] == ["SelectStmt", "TransactionStmt"]
    assert refused("postgres", "SELECT 1 -- x\r; COMMIT")
    assert postgresql_lex.split("SELECT 1 -- x\x0b; COMMIT")[0].kind == "SelectStmt"  # VT: no


@pytest.mark.parametrize("sql, kind", [
    ("COMMIT", "TransactionStmt"), ("END", "TransactionStmt"), ("ABORT", "TransactionStmt"),
    ("PREPARE TRANSACTION 'x'", "TransactionStmt"), ("SET statement_timeout = 0", "VariableSetStmt"),
    ("ALTER ROLE sqlrl_agent SET search_path = x", "AlterRoleSetStmt"),
    ("CREATE DATABASE evil", "CreatedbStmt"), ("(SELECT 1)", "SelectStmt"), ("VALUES (1)", "SelectStmt"),
    ("/* c */ -- d\n COPY t TO STDOUT", "CopyStmt"), ("SELEC 1", ""),
])
def test_postgresql_statements_are_classified_by_parse_node(sql, kind):
    assert postgresql_lex.lex(sql).kind == kind


@pytest.mark.parametrize("sql", [
    "SELECT 1 -- x\r; COMMIT", "SELECT 1 /* /* */ */; COMMIT", "SELECT $a$ ; $a$; END",
    "/* x */ ALTER ROLE CURRENT_USER SET statement_timeout = 0", "SET LOCAL ROLE postgres",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE", "ALTER DATABASE postgres RENAME TO x",
    "CREATE DATABASE evil", "CLOSE ALL", "PREPARE TRANSACTION 'x'", "ROLLBACK PREPARED 'x'",
    "SELECT '\\'; COMMIT; --'", "-- x\rCOMMIT", 'SET U&"statement\\005ftimeout" = 0',
    'SELECT U&"pg\\005fread\\005ffile"(\'/etc/passwd\')', 'SET U&"rol\\0065" = postgres',
    'CREATE FUNCTION f() RETURNS int LANGUAGE sql SET U&"lock\\005ftimeout" = 0 AS \'SELECT 1\'',
])
def test_postgresql_smuggling_is_refused(sql):
    assert refused("postgres", sql), sql


def test_postgresql_split_follows_the_grammar():
    atomic = ("CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END")
    assert split_statements(f"{atomic}; SELECT f()", "postgres") == [atomic, "SELECT f()"]
    # a statement the parser rejects is sent whole; the rest of the call is still split
    assert split_statements("SELECT 1; SELEC 2; SELECT 3", "postgres") == [
        "SELECT 1", "SELEC 2", "SELECT 3"]
    # text the scanner cannot read fails whole on the server: one statement
    assert split_statements("SELECT 1; SELECT 'x", "postgres") == ["SELECT 1; SELECT 'x"]
    assert split_statements("SELECT 1E'x'; COMMIT", "postgres") == ["SELECT 1E'x'; COMMIT"]
    assert split_statements(" ; -- c\n ; /* d */", "postgres") == []


def test_postgresql_streamable_queries():
    assert postgresql_lex.streamable("SELECT * FROM t")
    assert postgresql_lex.streamable("WITH x AS (SELECT 1) SELECT * FROM x")
    assert postgresql_lex.streamable("SELECT 'INSERT INTO t'")
    for sql in ("WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x", "SELECT 1 INTO t2",
                "SELECT * FROM t FOR UPDATE", "INSERT INTO t VALUES (1)", "SELEC 1"):
        assert not postgresql_lex.streamable(sql), sql


# --- SQLite and the rest ----------------------------------------------------------------------

def test_sqlite_keeps_trigger_bodies_whole():
    trigger = "CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = 1; DELETE FROM u; END"
    assert split_statements(f"{trigger}; SELECT 1", "sqlite") == [trigger, "SELECT 1"]


def test_sqlite_rules():
    assert split_statements("SELECT 1 -- a; b\r; SELECT 2", "sqlite") == ["SELECT 1 -- a; b\r; SELECT 2"]
    assert split_statements("SELECT [a;b], `c;d`, \"e;f\"; SELECT 2 /* ; ", "sqlite") == [
        "SELECT [a;b], `c;d`, \"e;f\"", "SELECT 2 /* ;"]
    assert sqlite_lex.lex("/* x */ -- y\n VACUUM").words == ("VACUUM",)
    assert split_statements("SELECT 1; SELECT 'unterminated", "sqlite") == [
        "SELECT 1; SELECT 'unterminated"]


def test_engines_without_a_lexer_of_their_own_use_sqlglot():
    assert split_statements("SELECT 1; SELECT [a;b]", "tsql") == ["SELECT 1", "SELECT [a;b]"]
    assert split("-- x\nBEGIN TRAN", "tsql")[0].words[:2] == ("BEGIN", "TRAN")
