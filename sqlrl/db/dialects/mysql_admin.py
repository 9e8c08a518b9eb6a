"""MariaDB/MySQL administration on an admin connection: bases, and per-session scratch databases.

Used by ``sqlrl.db.provisioning.provision`` (bases) and ``sqlrl.db.provisioning.scratch`` (per-session scratch databases);
the agent's SQL never runs on these connections.

What the server enforces (docs/sessions.md, "Isolation"):

- **The server**: ``prepare_server`` refuses one whose InnoDB temporary tablespace can grow
  without bound (``innodb_temp_data_file_path`` without ``:max:``; ``temp_space_bound``): sessions'
  ``CREATE TEMPORARY TABLE … ENGINE=InnoDB`` share that file, which never shrinks while the server
  runs, so its ``max`` is the bound on all sessions' temporary tables together (MariaDB 10.11 has
  no per-session bound; ``scripts/dbservers.sh`` starts it with ``…:max:256M``). On MariaDB it also
  refuses one that does not enforce InnoDB for new tables (``enforce_storage_engine``: otherwise a
  temporary table of another engine escapes that bound) or lets a session raise
  ``tmp_disk_table_size`` without a ``--maximum-`` (``_temp_table_problem``).
- **Bases** are loaded by the admin and granted to nobody: no agent account has any privilege on
  them. ``prepare_server`` revokes MariaDB's default grants to PUBLIC on ``test``/``test\\_%`` and
  refuses a server with symbolic links enabled (``have_symlink``: then ``CREATE TABLE … DATA
  DIRECTORY`` writes files anywhere the server can; start it with ``--symbolic-links=0``, as
  ``scripts/dbservers.sh`` does, and those options are ignored with a warning).
- **A scratch database per session**, cloned by the admin: ``CREATE DATABASE`` with the base's
  character set, every table ``CREATE TABLE … LIKE`` + ``INSERT … SELECT`` (foreign-key checks
  off), every view from ``SHOW CREATE VIEW`` rewritten to the scratch database with
  ``DEFINER=<the session's account> SQL SECURITY INVOKER``. Its own account ``<name>``@'%' (a
  random password, at most ``MAX_CONNECTIONS`` connections) holds ``SCRATCH_PRIVILEGES`` on that
  database only: no FILE, PROCESS, SUPER or global privilege, so it sees and may KILL only its
  own connections, and cannot write files or create databases.
- **Drop**: the account's connections are killed, then ``DROP DATABASE`` and ``DROP USER``.
- **Liveness**: the creating process holds ``GET_LOCK(<name>)`` on its admin connection for the
  scratch database's life; ``orphans`` are scratch databases and accounts whose lock is free.
"""

from __future__ import annotations

import re
from typing import Any

import pymysql
from sqlalchemy.engine import URL

from ..types import SessionError
from .mysql_connect import connect_kwargs

SCRATCH_PRIVILEGES = ("SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, "
                      "CREATE TEMPORARY TABLES, CREATE VIEW, SHOW VIEW, REFERENCES")
MAX_CONNECTIONS = 2
_GENERATED_COLUMN_CODES = {1906, 3105}
_MISSING_TABLE = 1146
_DEFINER = re.compile(r"DEFINER=(`[^`]*`|'[^']*'|\S+)@(`[^`]*`|'[^']*'|\S+)\s*")
_SECURITY = re.compile(r"SQL SECURITY (DEFINER|INVOKER)\s*")
_SIZE = re.compile(r"^(\d+)([KMG]?)$", re.I)
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "": 2**20}  # no unit: megabytes


def temp_space_bound(path: str) -> int | None:
    """The most bytes an ``innodb_temp_data_file_path`` value lets the temporary tablespace take
    (``file:size[:autoextend[:max:size]]``, ``;``-separated), or None when it is unbounded."""
    total = 0
    for spec in str(path).split(";"):
        fields = spec.strip().split(":")
        sizes = [f for f in fields[1:] if _SIZE.match(f)]
        if not sizes:
            return None
        autoextend = "autoextend" in (f.lower() for f in fields)
        if autoextend and not any(f.lower() == "max" for f in fields):
            return None
        size = _SIZE.match(sizes[-1])
        total += int(size.group(1)) * _UNITS[size.group(2).upper()]
    return total


UNBOUNDED = 2**64 - 1  # tmp_disk_table_size's "no limit"


def _temp_table_problem(cur: Any) -> str | None:
    """Why a MariaDB server lets one session's temporary tables grow without a bound the session
    cannot lift, or None. Read on the admin connection: ``enforce_storage_engine`` (global; a
    session needs SUPER to change it) must be InnoDB, so every temporary table is in the bounded
    InnoDB temporary tablespace (an Aria/MyISAM/MEMORY one would be files in tmpdir or memory, with
    no bound); and ``tmp_disk_table_size`` must have a server-wide ``--maximum-`` (probed: a
    ``SET SESSION`` above it is cut to it, for every account) so each internal on-disk temporary
    table (GROUP BY, DISTINCT, UNION, derived tables) stops at it."""
    cur.execute("SELECT @@global.enforce_storage_engine")
    (engine,) = cur.fetchone()
    if str(engine or "").lower() != "innodb":
        return ("this MariaDB server does not enforce InnoDB for new tables (enforce_storage_engine = "
                f"{engine!r}): a session's CREATE TEMPORARY TABLE … ENGINE=Aria/MyISAM/MEMORY would "
                "take disk or memory with no bound. Start it with --enforce-storage-engine=InnoDB "
                "(scripts/dbservers.sh does; docs/sessions.md)")
    cur.execute(f"SET SESSION tmp_disk_table_size = {UNBOUNDED}")
    cur.execute("SELECT @@session.tmp_disk_table_size")
    (cap,) = cur.fetchone()
    cur.execute("SET SESSION tmp_disk_table_size = DEFAULT")
    if int(cap) >= UNBOUNDED:
        return ("this MariaDB server lets a session raise tmp_disk_table_size without bound: one "
                "statement's internal temporary table (GROUP BY, DISTINCT, a derived table) could "
                "fill the disk. Start it with --tmp-disk-table-size=256M "
                "--maximum-tmp-disk-table-size=256M (scripts/dbservers.sh does; docs/sessions.md)")
    return None


def q(name: str) -> str:
    """A quoted identifier."""
    return "`" + name.replace("`", "``") + "`"


def grant_target(name: str) -> str:
    """A database name in GRANT … ON `db`.*, where _ and % are wildcards unless escaped."""
    return q(name.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%"))


class MySQLAdmin:
    dialect = "mysql"

    def connect(self, url: URL, database: str | None = None) -> Any:
        try:
            return pymysql.connect(**connect_kwargs(url, database=database))
        except pymysql.Error as exc:
            raise SessionError(f"cannot connect to MariaDB/MySQL as admin: {exc}") from exc

    def _run(self, url: URL, statements: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        conn = self.connect(url)
        try:
            with conn.cursor() as cur:
                out = []
                for text, args in statements:
                    cur.execute(text, args or None)
                    out.append(cur.fetchall())
                return out
        finally:
            conn.close()

    # -- bases -------------------------------------------------------------------------------------

    def prepare_server(self, url: URL) -> None:
        conn = self.connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT @@version, @@have_symlink, @@innodb_temp_data_file_path")
                version, symlink, temp_path = cur.fetchone()
                if "mariadb" in str(version).lower() and str(symlink).upper() == "YES":
                    raise SessionError(
                        "this MariaDB server has symbolic links enabled (have_symlink=YES): an "
                        "agent's CREATE TABLE … DATA DIRECTORY could write files outside the data "
                        "directory. Start it with --symbolic-links=0 (scripts/dbservers.sh does)")
                if temp_space_bound(temp_path) is None:
                    raise SessionError(
                        f"this MariaDB/MySQL server's InnoDB temporary tablespace is unbounded "
                        f"(innodb_temp_data_file_path = {temp_path!r}): one session's temporary "
                        "tables could fill the disk, and the file never shrinks while the server "
                        "runs. Start it with a max, e.g. "
                        "--innodb-temp-data-file-path=ibtmp1:12M:autoextend:max:256M "
                        "(scripts/dbservers.sh does; docs/sessions.md)")
                if "mariadb" in str(version).lower():
                    problem = _temp_table_problem(cur)
                    if problem:
                        raise SessionError(problem)
                cur.execute("SHOW GRANTS")
                grants = " ".join(row[0] for row in cur.fetchall()).upper()
                if "ALL PRIVILEGES ON *.*" not in grants and not (
                        "CREATE USER" in grants and "GRANT OPTION" in grants):
                    raise SessionError(
                        "the MariaDB/MySQL account cannot create users and grant privileges: sqlrl "
                        "needs an admin URL to give every session its own database and account")
                try:
                    cur.execute("SELECT Db FROM mysql.db WHERE User = 'PUBLIC' AND Host = ''")
                except pymysql.Error:
                    return  # not MariaDB >= 10.11: no PUBLIC grants
                for (db,) in cur.fetchall():
                    cur.execute(f"REVOKE ALL PRIVILEGES ON {q(db)}.* FROM PUBLIC")
        finally:
            conn.close()

    def create_database(self, url: URL, name: str, replace: bool) -> None:
        statements: list[tuple[str, tuple[Any, ...]]] = []
        if replace:
            statements.append((f"DROP DATABASE IF EXISTS {q(name)}", ()))
        statements.append((f"CREATE DATABASE IF NOT EXISTS {q(name)} CHARACTER SET utf8mb4", ()))
        self._run(url, statements)

    def seal(self, url: URL, name: str) -> None:
        """Nothing to grant: sessions read a clone. Checks the base exists."""
        out = self._run(url, [("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA "
                               "WHERE SCHEMA_NAME = %s", (name,))])
        if not out[0]:
            raise SessionError(f"no database {name!r} on this MariaDB/MySQL server")

    def load_connection(self, url: URL, database: str) -> Any:
        """A connection to ``database`` in one transaction, for ``sqlrl.db.provisioning.loader``."""
        kw = connect_kwargs(url, database)
        kw["autocommit"] = False
        return pymysql.connect(**kw)

    def insert_rows(self, conn: Any, table: str, columns: list[str],
                    rows: list[tuple[Any, ...]]) -> None:
        """INSERT ``rows`` into ``table`` (quoted names); pymysql batches them into one statement."""
        marks = ", ".join(["%s"] * len(columns))
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)

    def drop_database(self, url: URL, name: str) -> None:
        self._run(url, [(f"DROP DATABASE IF EXISTS {q(name)}", ())])

    # -- scratch databases (on one long-lived admin connection of sqlrl.db.provisioning.scratch) -------------

    def base_size(self, conn: Any, base: str) -> int:
        with conn.cursor() as cur:
            cur.execute("SELECT COALESCE(SUM(DATA_LENGTH + INDEX_LENGTH), 0) FROM "
                        "information_schema.TABLES WHERE TABLE_SCHEMA = %s", (base,))
            return int(cur.fetchone()[0])

    def hold(self, conn: Any, name: str) -> bool:
        with conn.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, 0)", (name,))
            return cur.fetchone()[0] == 1

    def unhold(self, conn: Any, name: str) -> None:
        with conn.cursor() as cur:
            cur.execute("SELECT RELEASE_LOCK(%s)", (name,))

    def create_scratch(self, conn: Any, base: str, name: str, password: str,
                       base_bytes: int) -> None:
        account = f"{q(name)}@'%'"
        with conn.cursor() as cur:
            cur.execute(f"CREATE USER {account.replace('%', '%%')} IDENTIFIED BY %s "
                        f"WITH MAX_USER_CONNECTIONS {MAX_CONNECTIONS}", (password,))
            cur.execute(f"SHOW CREATE DATABASE {q(base)}")
            charset = re.search(r"DEFAULT CHARACTER SET \w+( COLLATE \w+)?", cur.fetchone()[1])
            cur.execute(f"SHOW FULL TABLES FROM {q(base)}")
            objects = cur.fetchall()
            cur.execute(f"CREATE DATABASE {q(name)} {charset.group() if charset else ''}")
            # a base table of another engine (a user's MyISAM table) becomes InnoDB in the clone
            # where the server enforces InnoDB, instead of failing the clone
            cur.execute("SET @sqlrl_mode = @@session.sql_mode, SESSION foreign_key_checks=0, "
                        "SESSION sql_mode = REPLACE(@@session.sql_mode, 'NO_ENGINE_SUBSTITUTION', '')")
            try:
                for table, kind in objects:
                    if kind != "VIEW":
                        self._clone_table(cur, base, name, table)
                self._clone_views(cur, base, name, account,
                                  [t for t, kind in objects if kind == "VIEW"])
            finally:
                cur.execute("SET SESSION foreign_key_checks=1, SESSION sql_mode = @sqlrl_mode")
            cur.execute(f"GRANT {SCRATCH_PRIVILEGES} ON {grant_target(name)}.* TO {account}")

    @staticmethod
    def _clone_table(cur: Any, base: str, name: str, table: str) -> None:
        src, dst = f"{q(base)}.{q(table)}", f"{q(name)}.{q(table)}"
        cur.execute(f"CREATE TABLE {dst} LIKE {src}")
        try:
            cur.execute(f"INSERT INTO {dst} SELECT * FROM {src}")
        except pymysql.Error as exc:
            if exc.args[0] not in _GENERATED_COLUMN_CODES:
                raise
            cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                        "AND TABLE_NAME = %s AND COALESCE(GENERATION_EXPRESSION, '') = '' "
                        "ORDER BY ORDINAL_POSITION", (base, table))
            cols = ", ".join(q(c) for (c,) in cur.fetchall())
            cur.execute(f"INSERT INTO {dst} ({cols}) SELECT {cols} FROM {src}")

    @staticmethod
    def _clone_views(cur: Any, base: str, name: str, account: str, views: list[str]) -> None:
        """Views in dependency order: a view whose source view is missing waits for a later pass."""
        qualifier = re.compile(re.escape(q(base)) + r"\.", re.I)
        pending = {}
        for view in views:
            cur.execute(f"SHOW CREATE VIEW {q(base)}.{q(view)}")
            ddl = _SECURITY.sub("", _DEFINER.sub("", cur.fetchone()[1], count=1), count=1)
            ddl = qualifier.sub(f"{q(name)}.", ddl)
            pending[view] = re.sub(r"^CREATE\s+(ALGORITHM=\w+\s+)?", lambda m: (
                f"CREATE {m.group(1) or ''}DEFINER={account} SQL SECURITY INVOKER "), ddl, count=1)
            pending[view] = pending[view].replace(f"VIEW {q(view)}", f"VIEW {q(name)}.{q(view)}", 1)
        while pending:
            failed: dict[str, str] = {}
            error: Exception | None = None
            for view, ddl in pending.items():
                try:
                    cur.execute(ddl)
                except pymysql.Error as exc:
                    if exc.args[0] != _MISSING_TABLE:
                        raise
                    failed[view], error = ddl, exc
            if len(failed) == len(pending):
                raise error  # type: ignore[misc]
            pending = failed

    def drop_scratch(self, conn: Any, name: str) -> None:
        with conn.cursor() as cur:
            cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", (name,))
            for (thread,) in cur.fetchall():
                try:
                    cur.execute(f"KILL CONNECTION {int(thread)}")
                except pymysql.Error:
                    pass  # it ended meanwhile
            cur.execute(f"DROP DATABASE IF EXISTS {q(name)}")
            cur.execute(f"DROP USER IF EXISTS {q(name)}@'%'")

    def scratch_names(self, conn: Any, prefix: str) -> list[str]:
        pattern = prefix.replace("_", "\\_") + "%"
        with conn.cursor() as cur:
            cur.execute("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME "
                        "LIKE %s UNION SELECT User FROM mysql.user WHERE User LIKE %s",
                        (pattern, pattern))
            return sorted(row[0] for row in cur.fetchall())

    @staticmethod
    def is_lost(conn: Any) -> bool:
        """True when the admin connection is gone (after an error on it)."""
        return not conn.open
