"""The filter's lexers against the real servers: hundreds of seeded calls mixing comments (``--``
followed by every ASCII control character, ``#``, nested and executable ``/* */``), quotes,
dollar-quotes and separators, each run twice on a scratch database:

- **as the server splits it**: the whole call in one round trip (MariaDB with multi-statements on;
  PostgreSQL's simple query protocol);
- **as sqlrl splits it**: each statement of ``mysql_lex.split`` / ``postgresql_lex.split`` sent on
  its own, as the executor does.

Every statement is an INSERT into a probe table or a SELECT (MariaDB: its result set; PostgreSQL:
``probe_sel(v)``, which records the call), with distinct values, and decoys (statements hidden in
comments and strings) insert values of their own. The two runs must have the same effects in the
same order, and each of sqlrl's statements must have the effect of its first keyword / parse
node (a SELECT-classified statement never inserts; an INSERT-classified one does). A statement the
filter misreads — a hidden second statement, a comment that is code, a wrong first keyword — shows
up as an extra, missing or misattributed probe row.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import pymysql
import pymysql.constants.CLIENT as CLIENT
import pytest

from sqlrl.db.provisioning import provision
from sqlrl.db.dialects import mysql_lex, postgresql_lex
from sqlrl.db.dialects.mysql import SQL_MODE
from sqlrl.db.url import parse_url

CALLS = 1000
CONTROL = [chr(c) for c in range(0x01, 0x20)] + [" ", "\x7f"]  # NUL: MariaDB only, at the end
NAME = f"sqlrl_lexdiff_{os.getpid()}"
VERSIONS = ["", "40101", "50700", "99999", "100000", "101100", "101199", "110000"]  # /*!NNNNN


@dataclass
class Generator:
    """Random calls; ``next_id`` numbers every statement and decoy so effects are attributable."""

    rng: random.Random
    engine: str  # "mysql" | "postgres"
    next_id: int = 1
    stats: dict = field(default_factory=lambda: {"calls": 0, "statements": 0, "errors": 0})

    def id(self) -> int:
        self.next_id += 1
        return self.next_id

    def decoy(self) -> str:
        return f"INSERT INTO probe (v) VALUES ({self.id()})"  # k defaults to 'D'; no quotes

    def pick(self, options: list) -> str:
        choice = self.rng.choice(options)
        return choice() if callable(choice) else choice

    def junk(self) -> str:
        """Text that is harmless inside a comment or string but would matter as code."""
        return self.pick(["", "x", lambda: f"; {self.decoy()}; ", "'", '"', "`", "*/", "/*", ";",
                          lambda: f"\r; {self.decoy()}; ", "$$", "$q$", "--", "#", "\\"])

    def comment(self) -> str:
        c = self.rng.choice(CONTROL)
        ends = "\n" if self.engine == "mysql" else "\n\r"  # where a -- comment ends at once
        block = lambda: self.junk().replace("*/", "").replace("/*", "" if self.engine == "postgres"
                                                              else "/*")  # PG: /* nests
        forms = [lambda: f"--{c}{self.junk() if c not in ends else ''}\n",
                 lambda: f"/*{block()} {block()}*/"]
        if self.engine == "mysql":
            forms += [lambda: f"#{self.junk()}\n", "/*+ hint */",
                      lambda: f"/*!99999 /* {self.decoy()}; */ {self.decoy()}; */",
                      lambda: f"/*M!999999 {self.decoy()}; */", "/*!50701 x */"]
        else:
            forms += [lambda: f"/* /* {block()} */ {self.decoy()}; */",
                      lambda: f"-- x\r; {self.decoy()}; -- y\n"]  # PostgreSQL ends -- at CR
        return self.pick(forms)

    def decor(self) -> str:
        return "".join(self.pick([" ", "\n", "\t", "\r\n", self.comment, self.comment])
                       for _ in range(self.rng.randint(0, 3)))

    def string(self, last: bool = False) -> str:
        """A literal; with ``last``, also ones after which one engine ends the statement."""
        forms = ["'a;b'", "'it''s; -- x'", "'/*'", "'*/'", "'#'", "'--\x01; x'"]
        if last:
            forms += [lambda: f"'\\'; {self.decoy()} -- '\n",  # MariaDB: \' is escaped; PG: it ends
                      lambda: f"'\\\\'; {self.decoy()} -- '\n"]
        if self.engine == "mysql":
            forms += ['"a;b"', '"d\\"q; x"', "_utf8mb4'a;b'", "x'41'", "N'a;b'"]
        else:
            forms += [lambda: f"E'\\'; {self.decoy()}; --'", "U&'\\0041;'",
                      lambda: f"$$ ; {self.decoy()}; $$", lambda: f"$q$ $$ ; {self.decoy()} $q$"]
        return self.pick(forms)

    def alias(self) -> str:
        forms = ['"a;b"'] if self.engine == "postgres" else ["`a``;b`", "`--`", "`/*`"]
        return self.pick(forms + ["x"])

    def core(self) -> str:
        i = self.id()
        select = f"SELECT {i}" if self.engine == "mysql" else f"SELECT probe_sel({i})"
        forms = [select, lambda: f"{select}, {self.string(last=True)}",
                 lambda: f"{select} AS {self.alias()}",
                 f"INSERT INTO probe (v, k) VALUES ({i}, 'I')",
                 lambda: f"INSERT INTO probe (v, k, note) VALUES ({i}, 'I', {self.string()})",
                 lambda: f"--{self.rng.choice(CONTROL[:9] + CONTROL[10:])}INSERT INTO probe (v, k)\n"
                         f"SELECT {i}, 'I'"]
        if self.engine == "mysql":
            forms += [f"{select} --0", f"{select} /*! + 0 */",
                      lambda: f"/*!{self.rng.choice(VERSIONS)} INSERT INTO probe (v, k) */ "
                              f"SELECT {i}, 'I'",
                      lambda: f"/*M!{self.rng.choice(['', '50700', '100000', '999999'])}"
                              f" INSERT INTO probe (v, k) */ SELECT {i}, 'I'",
                      f"#INSERT INTO probe (v, k)\nSELECT {i}, 'I'",
                      f"/*!99999 /* x */ INSERT INTO probe (v, k) */ SELECT {i}, 'I'",
                      f"/* /* */ INSERT INTO probe (v, k) /* */ SELECT {i}, 'I'",
                      f"/*! INSERT INTO probe (v, k) -- */\n */ SELECT {i}, 'I'"]
        else:
            forms += [lambda: f"{select} AS a$q$; INSERT INTO probe (v, k) VALUES ({self.id()}, 'I') "
                              "--$q$\n",
                      f"/* /* */ INSERT INTO probe (v, k) */ SELECT probe_sel({i})",
                      f"{select} -- x\r, {self.id()}"]
        return self.pick(forms)

    def call(self) -> str:
        statements = [self.decor() + self.core() + self.decor()
                      for _ in range(self.rng.randint(1, 4))]
        text = ";".join(statements)
        tail = self.pick(["", ";", lambda: ";" + self.decor(), "--", "-- x"])
        if self.engine == "mysql" and self.rng.random() < 0.05:
            tail = " --\x00"  # a NUL ends the text for MariaDB: only at the very end
        return text + tail


# --- MariaDB --------------------------------------------------------------------------------------

def _my_connect(admin_url: str, multi: bool) -> pymysql.connections.Connection:
    u = parse_url(admin_url)
    conn = pymysql.connect(host=u.host, port=u.port, user=u.username, password=u.password or "",
                           database=NAME, autocommit=True, ssl_disabled=True, charset="utf8mb4",
                           client_flag=CLIENT.MULTI_STATEMENTS if multi else 0)
    with conn.cursor() as cur:
        cur.execute(f"SET SESSION sql_mode = '{SQL_MODE}'")
    return conn


def _my_events(conn, outcomes: list) -> list:
    """``outcomes``: per statement, ("S", value) | ("I", None) | None (no effect); the I's take
    the probe rows' (k, v) in insertion order."""
    with conn.cursor() as cur:
        cur.execute("SELECT k, v FROM probe ORDER BY seq")
        rows = iter(cur.fetchall())
        cur.execute("DELETE FROM probe")
    return [next(rows, ("missing", None)) if o[0] == "I" else o for o in outcomes if o]


def _my_outcome(cur) -> tuple | None:
    if cur.description is not None:
        rows = cur.fetchall()
        return ("S", rows[0][0] if rows else None)
    return ("I", None) if cur.rowcount and cur.rowcount > 0 else None


@pytest.mark.mysql
def test_mariadb_lexer_agrees_with_the_server(mysql_admin_url):
    u = parse_url(mysql_admin_url)
    admin = pymysql.connect(host=u.host, port=u.port, user=u.username, password=u.password or "",
                            autocommit=True, ssl_disabled=True)
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {NAME}")
        cur.execute(f"CREATE DATABASE {NAME}")
        cur.execute(f"CREATE TABLE {NAME}.probe (seq INT AUTO_INCREMENT PRIMARY KEY, v INT, "
                    "k CHAR(1) DEFAULT 'D', note TEXT)")
    single, multi = _my_connect(mysql_admin_url, False), _my_connect(mysql_admin_url, True)
    flavor = mysql_lex.server_flavor(single.get_server_info())
    gen = Generator(random.Random(13), "mysql")
    try:
        for _ in range(CALLS):
            _check_mysql_call(gen, gen.call(), single, multi, flavor)
    finally:
        single.close()
        multi.close()
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {NAME}")
        admin.close()
    assert gen.stats["errors"] < CALLS * 0.1, gen.stats  # the generator makes valid SQL


def _check_mysql_call(gen: Generator, text: str, single, multi, flavor) -> None:
    gen.stats["calls"] += 1
    server, server_error = [], False
    with multi.cursor() as cur:
        try:
            cur.execute(text)
            server.append(_my_outcome(cur))
            while cur.nextset():
                server.append(_my_outcome(cur))
        except pymysql.Error:
            server_error = True
    truth = _my_events(multi, server)
    pieces = mysql_lex.split(text, flavor)
    gen.stats["statements"] += len(pieces)
    ours, our_error = [], False
    with single.cursor() as cur:
        for piece in pieces:
            try:
                cur.execute(piece.text)
            except pymysql.Error:
                our_error = True
                break
            outcome = _my_outcome(cur)
            first = piece.words[0] if piece.words else ""
            assert (outcome is not None and outcome[0] == "S") == (first == "SELECT"), (text, piece)
            assert (outcome is not None and outcome[0] == "I") == (first == "INSERT"), (text, piece)
            ours.append(outcome)
    gen.stats["errors"] += our_error
    assert (_my_events(single, ours), our_error) == (truth, server_error), (text, pieces)


# --- PostgreSQL -----------------------------------------------------------------------------------

@pytest.mark.postgres
def test_postgresql_lexer_agrees_with_the_server(pg_admin_url):
    import psycopg2

    admin_db = provision.create_database(pg_admin_url, NAME, replace=True)
    conn = psycopg2.connect(admin_db)
    conn.autocommit = True
    gen = Generator(random.Random(15), "postgres")
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE probe (seq serial PRIMARY KEY, v int, k text DEFAULT 'D', "
                        "note text)")
            cur.execute("CREATE FUNCTION probe_sel(x int) RETURNS int LANGUAGE sql AS "
                        "$$ INSERT INTO probe (v, k) VALUES (x, 'S') RETURNING v $$")
        for _ in range(CALLS):
            _check_pg_call(gen, gen.call(), conn, psycopg2.Error)
    finally:
        conn.close()
        provision.drop_database(pg_admin_url, NAME)
    assert gen.stats["errors"] < CALLS * 0.1, gen.stats


def _pg_rows(cur) -> list:
    cur.execute("SELECT k, v FROM probe ORDER BY seq")
    rows = cur.fetchall()
    cur.execute("DELETE FROM probe")
    return rows


def _check_pg_call(gen: Generator, text: str, conn, error) -> None:
    gen.stats["calls"] += 1
    with conn.cursor() as cur:
        try:  # the simple query protocol: one implicit transaction (an error undoes it all)
            cur.execute(text)
            server_error = False
        except error:
            server_error = True
        truth = _pg_rows(cur)
        pieces = postgresql_lex.split(text)
        gen.stats["statements"] += len(pieces)
        our_error = False
        for piece in pieces:
            try:
                cur.execute(piece.text)
            except error:
                our_error = True
                break
            cur.execute("SELECT k FROM probe WHERE seq > coalesce((SELECT max(seq) FROM probe "
                        "WHERE k = '-'), 0)")
            kinds = {k for (k,) in cur.fetchall()}
            assert piece.kind in ("SelectStmt", "InsertStmt"), (text, piece)
            inserted = bool(kinds & {"I", "D"})
            assert inserted == (piece.kind == "InsertStmt"), (text, piece, kinds)
            cur.execute("INSERT INTO probe (k) VALUES ('-')")  # marks the end of this piece
        ours = [row for row in _pg_rows(cur) if row[0] != "-"]
    gen.stats["errors"] += our_error
    if server_error:  # nothing of the call survived on the server: ours must fail too
        assert our_error, (text, pieces)
    else:
        assert (ours, our_error) == (truth, False), (text, pieces)


# --- the comment rules byte by byte -----------------------------------------------------------

def _server_value(run, text):
    try:
        return run(text)
    except Exception:
        return "error"


def _predicted(statement):
    """What ``SELECT 5 <comment-ish> +1`` returns by the lexer's reading: 5 if '+1' was comment."""
    return 6 if "+1" in statement.code else 5


@pytest.mark.mysql
def test_mariadb_comment_starts_and_ends_byte_by_byte(mysql_admin_url):
    conn = _my_connect_plain(mysql_admin_url)
    flavor = mysql_lex.server_flavor(conn.get_server_info())

    def run(text):
        with conn.cursor() as cur:
            cur.execute(text)
            return cur.fetchall()[0][0]

    try:
        for b in range(0x01, 0x80):
            c = chr(b)
            for text in (f"SELECT 5 --{c}+1\n", f"SELECT 5 -- a{c}+1\n", f"SELECT 5 # a{c}+1\n"):
                statement = mysql_lex.lex(text, flavor)
                got = _server_value(run, text)
                minus = _server_value(run, text.replace("--", "- -", 1))  # never a comment
                if "--" in statement.code:  # read as two minus signs
                    assert got == minus, (text, got, minus)
                else:
                    assert got == _predicted(statement), (text, got)
                    if got == 5 and not text.startswith("SELECT 5 #"):  # '+1' was comment
                        assert minus != 5, (text, minus)  # ... and not arithmetic
        assert _server_value(run, "SELECT 5 --\x00+1") == "error"  # NUL ends it; then code
    finally:
        conn.close()


def _my_connect_plain(admin_url):
    u = parse_url(admin_url)
    return pymysql.connect(host=u.host, port=u.port, user=u.username, password=u.password or "",
                           autocommit=True, ssl_disabled=True, charset="utf8mb4")


@pytest.mark.postgres
def test_postgresql_comment_ends_byte_by_byte(pg_admin_url):
    import psycopg2

    conn = psycopg2.connect(pg_admin_url)
    conn.autocommit = True

    def run(text):
        with conn.cursor() as cur:
            cur.execute(text)
            return cur.fetchall()[0][0]

    try:
        for b in range(0x01, 0x80):
            text = f"SELECT 5 -- a{chr(b)}+1\n"
            assert _server_value(run, text) == _predicted(postgresql_lex.lex(text)), repr(text)
    finally:
        conn.close()
