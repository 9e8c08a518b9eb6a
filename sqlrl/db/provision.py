"""Admin operations on database servers: the unprivileged agent role, databases, grants.

Every function takes an **admin** URL (a role that may create roles and databases) and dispatches
on its dialect through a small registry (``_PROVISIONERS``). Sessions then connect with
``agent_url(admin_url, name)``; they refuse admin/superuser URLs.

    ensure_agent_role(admin_url)                       # once per server
    url = create_database(admin_url, "shop")           # admin URL of database "shop"
    ... load tables with `url` ...
    grant_database(admin_url, "shop")                  # after loading
    open_session(agent_url(admin_url, "shop"))

All functions are idempotent (safe to repeat, and to race with another process doing the same).

PostgreSQL: role ``LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS``. On a
database: CONNECT and TEMP; USAGE and CREATE on its schemas; the role owns its tables, views,
materialized views, foreign tables and sequences (so in-session ALTER/DROP work — the session's
transaction is rolled back anyway); EXECUTE on file, signal and admin functions
(``REVOKED_PG_FUNCTIONS``) is revoked from PUBLIC in that database.

MariaDB/MySQL: user ``role``@'127.0.0.1' and @'localhost'; SELECT, SHOW VIEW on ``name``.*; on the
scratch pattern ``sqlrl\\_s\\_%``.* only SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX,
CREATE TEMPORARY TABLES, CREATE VIEW, SHOW VIEW, REFERENCES (no routines, events, triggers, FILE,
SUPER). ``ensure_agent_role`` also revokes MariaDB's default grants to PUBLIC on ``test``/``test\\_%``
(they would let any session create databases and tables that outlive it).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Protocol

from sqlalchemy.engine import URL

from .types import SessionError
from .url import dialect_name, parse_url

AGENT_ROLE = "sqlrl_agent"
AGENT_PASSWORD = "sqlrl-agent"
SCRATCH_PREFIX = "sqlrl_s_"  # MariaDB/MySQL per-session scratch databases

REVOKED_PG_FUNCTIONS = (
    "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf", "pg_rotate_logfile",
    "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_ls_logdir",
    "pg_ls_waldir", "pg_ls_tmpdir", "pg_ls_archive_statusdir", "pg_current_logfile",
    "lo_import", "lo_export", "pg_promote", "pg_switch_wal", "pg_create_restore_point",
    "pg_backup_start", "pg_backup_stop", "pg_start_backup", "pg_stop_backup",
    "pg_log_backend_memory_contexts", "set_config",
)
SCRATCH_GRANT_TARGET = "`sqlrl\\_s\\_%%`.*"  # (%% : the GRANT texts go through pymysql's % formatting)
SCRATCH_PRIVILEGES = ("SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, "
                      "CREATE TEMPORARY TABLES, CREATE VIEW, SHOW VIEW, REFERENCES")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_$-]{0,62}$")


class _Provisioner(Protocol):
    def ensure_agent_role(self, url: URL, role: str, password: str) -> None: ...
    def create_database(self, url: URL, name: str, replace: bool) -> None: ...
    def grant_database(self, url: URL, name: str, role: str) -> None: ...
    def drop_database(self, url: URL, name: str) -> None: ...


_PROVISIONERS: dict[str, Callable[[], _Provisioner]] = {}


def _register(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        _PROVISIONERS[name] = cls
        return cls
    return deco


# --- public API ----------------------------------------------------------------------------------

def ensure_agent_role(admin_url: str, role: str = AGENT_ROLE, password: str = AGENT_PASSWORD) -> None:
    """Create (or reset the password and attributes of) the unprivileged login role."""
    url, prov = _resolve(admin_url)
    prov.ensure_agent_role(url, _check_name(role, "role"), password)


def create_database(admin_url: str, name: str, *, replace: bool = False) -> str:
    """Create database ``name`` if missing (``replace=True``: drop it first); returns the admin URL
    of that database."""
    url, prov = _resolve(admin_url)
    prov.create_database(url, _check_db_name(url, name), replace)
    return url.set(database=name).render_as_string(hide_password=False)


def grant_database(admin_url: str, name: str, role: str = AGENT_ROLE) -> None:
    """Grant ``role`` everything sessions on database ``name`` need (run after loading tables)."""
    url, prov = _resolve(admin_url)
    prov.grant_database(url, _check_db_name(url, name), _check_name(role, "role"))


def agent_url(admin_url: str, name: str, role: str = AGENT_ROLE, password: str = AGENT_PASSWORD) -> str:
    """The URL sessions use for database ``name``: same server, the agent role's credentials."""
    url = parse_url(admin_url)
    query = {k: v for k, v in url.query.items() if k != "allow_superuser"}
    return url.set(username=role, password=password, database=name, query=query).render_as_string(
        hide_password=False)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` if it exists (closing other connections to it on PostgreSQL)."""
    url, prov = _resolve(admin_url)
    prov.drop_database(url, _check_db_name(url, name))


def _resolve(admin_url: str) -> tuple[URL, _Provisioner]:
    url = parse_url(admin_url)
    name = dialect_name(url)
    factory = _PROVISIONERS.get(name)
    if factory is None:
        raise SessionError(f"no provisioning for dialect {name!r}; known: {', '.join(_PROVISIONERS)}")
    return url, factory()


def _check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"invalid {what} name {name!r}: use letters, digits, _ $ - (at most 63)")
    return name


def _check_db_name(url: URL, name: str) -> str:
    _check_name(name, "database")
    if name.lower().startswith(SCRATCH_PREFIX):
        raise ValueError(f"database names starting with {SCRATCH_PREFIX!r} are reserved for "
                         "session scratch databases")
    return name


# --- PostgreSQL ----------------------------------------------------------------------------------

@_register("postgresql")
class _PostgresProvisioner:
    def _connect(self, url: URL, database: str | None = None) -> Any:
        import psycopg2

        from .dialects.postgresql import connect_kwargs
        try:
            conn = psycopg2.connect(**connect_kwargs(url, database))
        except psycopg2.Error as exc:
            raise SessionError(f"cannot connect to PostgreSQL as admin: {exc}".strip()) from exc
        conn.autocommit = True
        return conn

    def ensure_agent_role(self, url: URL, role: str, password: str) -> None:
        from psycopg2 import errors, sql
        attrs = sql.SQL("LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
                        "PASSWORD {}").format(sql.Literal(password))
        conn = self._connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
                if cur.fetchone() is None:
                    try:
                        cur.execute(sql.SQL("CREATE ROLE {} ").format(sql.Identifier(role)) + attrs)
                        return
                    except (errors.DuplicateObject, errors.UniqueViolation):
                        pass  # created concurrently: fall through to ALTER
                cur.execute(sql.SQL("ALTER ROLE {} ").format(sql.Identifier(role)) + attrs)
        finally:
            conn.close()

    def create_database(self, url: URL, name: str, replace: bool) -> None:
        from psycopg2 import errors, sql
        conn = self._connect(url)
        try:
            with conn.cursor() as cur:
                if replace:
                    cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(name)))
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    try:
                        cur.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8'")
                                    .format(sql.Identifier(name)))
                    except (errors.DuplicateDatabase, errors.UniqueViolation):
                        pass  # created concurrently
        finally:
            conn.close()

    def grant_database(self, url: URL, name: str, role: str) -> None:
        from psycopg2 import sql
        ident = sql.Identifier(role)
        conn = self._connect(url, name)
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("GRANT CONNECT, TEMPORARY ON DATABASE {} TO {}").format(
                    sql.Identifier(name), ident))
                cur.execute("SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
                            "AND nspname <> 'information_schema'")
                for (schema,) in cur.fetchall():
                    cur.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(
                        sql.Identifier(schema), ident))
                self._hand_over_relations(cur, role)
                cur.execute("SELECT p.oid::regprocedure::text FROM pg_proc p "
                            "JOIN pg_namespace n ON n.oid = p.pronamespace "
                            "WHERE n.nspname = 'pg_catalog' AND p.proname = ANY(%s)",
                            (list(REVOKED_PG_FUNCTIONS),))
                for (signature,) in cur.fetchall():
                    cur.execute(f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC")
        finally:
            conn.close()

    def _hand_over_relations(self, cur: Any, role: str) -> None:
        from psycopg2 import sql
        kinds = {"r": "TABLE", "p": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW",
                 "f": "FOREIGN TABLE", "S": "SEQUENCE"}
        # Tables first: ALTER TABLE … OWNER also moves the sequences their columns own.
        for relkinds in (("r", "p", "v", "m", "f"), ("S",)):
            cur.execute(
                "SELECT n.nspname, c.relname, c.relkind FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind = ANY(%s) AND n.nspname NOT LIKE 'pg\\_%%' "
                "AND n.nspname <> 'information_schema' "
                "AND pg_get_userbyid(c.relowner) <> %s "
                "AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass "
                "  AND d.objid = c.oid AND d.deptype IN ('a', 'i') AND c.relkind = 'S')",
                (list(relkinds), role))
            for schema, rel, kind in cur.fetchall():
                cur.execute(sql.SQL("ALTER {} {}.{} OWNER TO {}").format(
                    sql.SQL(kinds[kind]), sql.Identifier(schema), sql.Identifier(rel),
                    sql.Identifier(role)))

    def drop_database(self, url: URL, name: str) -> None:
        from psycopg2 import sql
        conn = self._connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)))
        finally:
            conn.close()


# --- MariaDB / MySQL -----------------------------------------------------------------------------

def _my_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _my_grant_target(name: str) -> str:
    """A database name in GRANT … ON `db`.*, where _ and % are wildcards unless escaped."""
    return _my_ident(name.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%"))


@_register("mysql")
class _MySQLProvisioner:
    HOSTS = ("127.0.0.1", "localhost")

    def _connect(self, url: URL) -> Any:
        import pymysql

        from .dialects.mysql import connect_kwargs
        try:
            return pymysql.connect(**connect_kwargs(url, database=None))
        except pymysql.Error as exc:
            raise SessionError(f"cannot connect to MariaDB/MySQL as admin: {exc}") from exc

    def _run(self, url: URL, statements: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        conn = self._connect(url)
        try:
            with conn.cursor() as cur:
                out = []
                for text, args in statements:
                    cur.execute(text, args or None)
                    out.append(cur.fetchall())
                return out
        finally:
            conn.close()

    def ensure_agent_role(self, url: URL, role: str, password: str) -> None:
        statements: list[tuple[str, tuple[Any, ...]]] = []
        for host in self.HOSTS:
            statements += [
                ("CREATE USER IF NOT EXISTS %s@%s IDENTIFIED BY %s", (role, host, password)),
                ("ALTER USER %s@%s IDENTIFIED BY %s", (role, host, password)),
                (f"GRANT {SCRATCH_PRIVILEGES} ON {SCRATCH_GRANT_TARGET} TO %s@%s", (role, host)),
            ]
        self._run(url, statements)
        self._revoke_public_test_grants(url)

    def _revoke_public_test_grants(self, url: URL) -> None:
        import pymysql
        conn = self._connect(url)
        try:
            with conn.cursor() as cur:
                try:
                    cur.execute("SELECT Db FROM mysql.db WHERE User = 'PUBLIC' AND Host = ''")
                except pymysql.Error:
                    return  # not MariaDB >= 10.11: no PUBLIC grants
                for (db,) in cur.fetchall():
                    cur.execute(f"REVOKE ALL PRIVILEGES ON {_my_ident(db)}.* FROM PUBLIC")
        finally:
            conn.close()

    def create_database(self, url: URL, name: str, replace: bool) -> None:
        statements: list[tuple[str, tuple[Any, ...]]] = []
        if replace:
            statements.append((f"DROP DATABASE IF EXISTS {_my_ident(name)}", ()))
        statements.append((f"CREATE DATABASE IF NOT EXISTS {_my_ident(name)} "
                           "CHARACTER SET utf8mb4", ()))
        self._run(url, statements)

    def grant_database(self, url: URL, name: str, role: str) -> None:
        statements: list[tuple[str, tuple[Any, ...]]] = []
        for host in self.HOSTS:
            statements += [
                (f"GRANT SELECT, SHOW VIEW ON {_my_grant_target(name).replace('%', '%%')}.* "
                 "TO %s@%s", (role, host)),
                (f"GRANT {SCRATCH_PRIVILEGES} ON {SCRATCH_GRANT_TARGET} TO %s@%s", (role, host)),
            ]
        self._run(url, statements)

    def drop_database(self, url: URL, name: str) -> None:
        self._run(url, [(f"DROP DATABASE IF EXISTS {_my_ident(name)}", ())])
