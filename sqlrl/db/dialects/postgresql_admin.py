"""PostgreSQL administration on an admin connection: bases, and per-session scratch databases.

Used by ``sqlrl.db.provisioning.provision`` (bases) and ``sqlrl.db.provisioning.scratch`` (per-session scratch databases);
the agent's SQL never runs on these connections.

What the server enforces (docs/sessions.md, "Isolation"):

- **The server** (``prepare_server``): ``OWNER_ROLE`` is NOLOGIN, has no password, no settings
  (``ALTER ROLE … RESET ALL``, in every database too), no member and no escalating built-in role;
  ``max_locks_per_transaction`` must be at least ``MIN_LOCKS_PER_TRANSACTION`` (the shared lock
  table holds that many locks per connection slot), or the server is refused.
- **Bases** are loaded by the admin, then sealed (``seal``): PUBLIC loses CONNECT and TEMPORARY
  on the base, so no agent role can reach it; its schemas' USAGE/CREATE go to ``OWNER_ROLE`` and
  to PUBLIC (in a clone PUBLIC is its session's role alone: no other agent role may connect to
  it), the ownership of its tables, views and sequences to ``OWNER_ROLE`` (NOLOGIN), and
  EXECUTE on file, signal and admin functions (``REVOKED_FUNCTIONS``) and on the advisory-lock functions
  (``ADVISORY_FUNCTIONS``: a session could fill the server's shared lock table with session-level
  advisory locks) is revoked from PUBLIC in the base (so in every clone).
- **A scratch database per session** is ``CREATE DATABASE <name> TEMPLATE <base>`` (the base's
  catalog, data, sequences and revocations come along), with ``WAL_LOG`` for bases up to
  ``FILE_COPY_ABOVE_BYTES`` and ``FILE_COPY`` above. PUBLIC has no rights on it; its own role
  ``<name>`` (LOGIN, NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS, at most
  ``CONNECTION_LIMIT`` connections) gets CONNECT and TEMPORARY on that database only. The role
  is created a member of ``OWNER_ROLE`` for its preparation only (``hand_over``, on the
  session's own login, before ``scratch`` hands it out): the login takes ownership of everything
  ``OWNER_ROLE`` owns in the clone (``REASSIGN OWNED … TO CURRENT_USER``), the admin revokes the
  membership, and the login is verified to be a member of no role, with ``current_user =
  session_user`` and no ``SET ROLE`` in effect, and ``OWNER_ROLE`` to own no relation there; a
  login that fails the check is closed and its clone dropped. No agent SQL runs before. (In a
  clone of a base sealed by an older sqlrl the admin connects to the clone, grants the role
  ``OWNER_ROLE``'s schema privileges and revokes from PUBLIC any function of the lists above the
  base still allowed.) So the session owns its cloned tables (ALTER/DROP) and is a member of no
  shared role it could ``SET ROLE`` to (PostgreSQL 15 has no membership without SET). A role
  sees other roles' query texts in ``pg_stat_activity`` and may cancel or terminate their backends only if it has their
  privileges: one role per session, so no session reaches another.
- **Drop**: ``DROP DATABASE … WITH (FORCE)`` (ends any backend still on it), then ``DROP ROLE``.
  A role another session granted something to (``GRANT … TO <role>`` in that session's clone,
  which its owner may do) cannot be dropped while the grant exists: ``DROP OWNED BY <role>`` is
  run in every database ``pg_shdepend`` names for it, then ``DROP ROLE`` again.
- **Liveness**: the process that creates a scratch database holds a session-level advisory lock
  named after it on its admin connection for the scratch database's life; ``orphans`` lists the
  scratch databases and roles whose lock is free (their process died) — they are dropped by the
  next process that sweeps the server.
"""

from __future__ import annotations

from typing import Any

import psycopg2
from psycopg2 import errors, sql
from psycopg2.extras import execute_values
from sqlalchemy.engine import URL

from ..types import SessionError
from .contract import SCRATCH_PREFIX
from .postgresql_connect import connect_kwargs

OWNER_ROLE = "sqlrl_owner"
CONNECTION_LIMIT = 2
FILE_COPY_ABOVE_BYTES = 256 * 2**20  # WAL_LOG copies block by block; FILE_COPY wins for big bases
LOCK_CLASS = 0x7371  # advisory locks (LOCK_CLASS, key): the first int4 marks them as sqlrl's
REVOKED_FUNCTIONS = (
    "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf", "pg_rotate_logfile",
    "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_ls_logdir",
    "pg_ls_waldir", "pg_ls_tmpdir", "pg_ls_archive_statusdir", "pg_current_logfile",
    "lo_import", "lo_export", "pg_promote", "pg_switch_wal", "pg_create_restore_point",
    "pg_backup_start", "pg_backup_stop", "pg_start_backup", "pg_stop_backup",
    "pg_log_backend_memory_contexts", "set_config",
)
ADVISORY_FUNCTIONS = (
    "pg_advisory_lock", "pg_advisory_lock_shared", "pg_advisory_unlock", "pg_advisory_unlock_shared",
    "pg_advisory_unlock_all", "pg_advisory_xact_lock", "pg_advisory_xact_lock_shared",
    "pg_try_advisory_lock", "pg_try_advisory_lock_shared", "pg_try_advisory_xact_lock",
    "pg_try_advisory_xact_lock_shared",
)
MIN_LOCKS_PER_TRANSACTION = 256
# EXECUTE on the listed pg_catalog functions revoked from PUBLIC where PUBLIC still has it (one
# round trip; nothing to do, and no catalog write, in a clone of a base sealed by this version).
_REVOKE_FROM_PUBLIC = (
    "DO $sqlrl$ DECLARE f text; BEGIN FOR f IN SELECT p.oid::regprocedure::text FROM pg_proc p "
    "WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname = ANY(ARRAY[{names}]) "
    "AND has_function_privilege('public', p.oid, 'EXECUTE') "
    "LOOP EXECUTE 'REVOKE EXECUTE ON FUNCTION ' || f || ' FROM PUBLIC'; END LOOP; END $sqlrl$"
).format(names=", ".join(f"'{n}'" for n in REVOKED_FUNCTIONS + ADVISORY_FUNCTIONS))
_SEALED_NOW = (  # the clone's base was sealed by this version: nothing for the admin to do in it
    "SELECT NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
    "AND nspname <> 'information_schema' "
    "AND has_schema_privilege('" + OWNER_ROLE + "', oid, 'CREATE') "
    "AND NOT (has_schema_privilege('public', oid, 'USAGE') AND has_schema_privilege('public', oid, "
    "'CREATE'))) AND NOT EXISTS (SELECT 1 FROM pg_proc p WHERE p.pronamespace = "
    "'pg_catalog'::regnamespace AND p.proname = ANY(ARRAY[{names}]) "
    "AND has_function_privilege('public', p.oid, 'EXECUTE'))"
).format(names=", ".join(f"'{n}'" for n in REVOKED_FUNCTIONS + ADVISORY_FUNCTIONS))
# On the session's own login, while its role is still a member of OWNER_ROLE (``hand_over``): its
# clone's objects become its own, and the base is checked for what only the admin could add.
_TAKE_OWNERSHIP = "REASSIGN OWNED BY " + OWNER_ROLE + " TO CURRENT_USER; " + _SEALED_NOW
# On the session's login after the admin took the membership back: nothing of it is left.
_VERIFY_HANDED_OVER = (
    "SELECT current_user = session_user AND current_setting('role') = 'none', "
    "EXISTS (SELECT 1 FROM pg_auth_members WHERE member = "
    "(SELECT oid FROM pg_roles WHERE rolname = current_user)), "
    "pg_has_role('" + OWNER_ROLE + "', 'MEMBER'), "
    "EXISTS (SELECT 1 FROM pg_class WHERE relowner = '" + OWNER_ROLE + "'::regrole)")
# In a new clone of a base sealed by an older sqlrl (or when the login could not take ownership):
# what OWNER_ROLE owns and may do there goes to the session's role, on an admin connection.
_HAND_OVER_CLONE = (
    "REASSIGN OWNED BY " + OWNER_ROLE + " TO {role}; "
    "DO $sqlrl$ DECLARE s text; BEGIN FOR s IN SELECT quote_ident(nspname) FROM pg_namespace "
    "WHERE has_schema_privilege('" + OWNER_ROLE + "', oid, 'CREATE') AND nspname NOT LIKE 'pg\\_%' "
    "AND nspname <> 'information_schema' "
    "LOOP EXECUTE 'GRANT USAGE, CREATE ON SCHEMA ' || s || ' TO ' || quote_ident({role_literal}); "
    "END LOOP; "
    "END $sqlrl$; " + _REVOKE_FROM_PUBLIC)
_ROLE_DEPENDENCY_DBS = (
    "SELECT DISTINCT d.datname FROM pg_shdepend s JOIN pg_database d ON d.oid = s.dbid "
    "WHERE s.refclassid = 'pg_authid'::regclass "
    "AND s.refobjid = (SELECT oid FROM pg_roles WHERE rolname = %s)")
DROP_ROLE_ATTEMPTS = 3
_ROLE_ATTRS = "NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"


def _connect_like(conn: Any, database: str) -> Any:
    """An autocommit connection to ``database`` with the admin connection ``conn``'s parameters."""
    kw = {k: v for k, v in conn.get_dsn_parameters().items() if v}
    kw.update(dbname=database, password=conn.info.password)
    other = psycopg2.connect(**{k: v for k, v in kw.items() if v is not None})
    other.autocommit = True
    return other


def lock_key(name: str) -> int:
    """The advisory-lock key of scratch database ``name`` (its random hex part, as an int4)."""
    tail = name.rsplit("_", 1)[-1]
    value = int(tail[:8], 16)
    return value - 2**32 if value >= 2**31 else value


class PostgresAdmin:
    dialect = "postgresql"

    def connect(self, url: URL, database: str | None = None) -> Any:
        try:
            conn = psycopg2.connect(**connect_kwargs(url, database))
        except psycopg2.Error as exc:
            raise SessionError(f"cannot connect to PostgreSQL as admin: {exc}".strip()) from exc
        conn.autocommit = True
        return conn

    # -- bases -------------------------------------------------------------------------------------

    def prepare_server(self, url: URL) -> None:
        """Check the admin and the server's settings; create ``OWNER_ROLE`` or reset it (module
        doc: attributes, password, settings, members, escalating built-in roles)."""
        conn = self.connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT rolsuper, rolcreaterole, rolcreatedb, "
                            "current_setting('max_locks_per_transaction')::int FROM pg_roles "
                            "WHERE rolname = current_user")
                superuser, createrole, createdb, locks = cur.fetchone()
                if not (superuser or (createrole and createdb)):
                    raise SessionError(
                        f"the PostgreSQL account {conn.info.user!r} cannot create roles and "
                        "databases: sqlrl needs an admin URL (a superuser, or CREATEROLE and "
                        "CREATEDB) to give every session its own database and role")
                if locks < MIN_LOCKS_PER_TRANSACTION:
                    raise SessionError(
                        f"this PostgreSQL server has max_locks_per_transaction = {locks}; sqlrl "
                        f"needs at least {MIN_LOCKS_PER_TRANSACTION} so that one session's locks "
                        "cannot fill the shared lock table every session needs. Start it with "
                        f"-c max_locks_per_transaction={MIN_LOCKS_PER_TRANSACTION} "
                        "(scripts/dbservers.sh does; docs/sessions.md)")
                owner = sql.Identifier(OWNER_ROLE)
                try:
                    cur.execute(sql.SQL("CREATE ROLE {} NOLOGIN " + _ROLE_ATTRS).format(owner))
                except (errors.DuplicateObject, errors.UniqueViolation):
                    # only a superuser may name the SUPERUSER/REPLICATION/BYPASSRLS attributes
                    attrs = _ROLE_ATTRS if superuser else "NOCREATEDB NOCREATEROLE"
                    cur.execute(sql.SQL("ALTER ROLE {} NOLOGIN " + attrs
                                        + " PASSWORD NULL").format(owner))
                    cur.execute(sql.SQL("ALTER ROLE {} RESET ALL").format(owner))
                cur.execute("SELECT d.datname FROM pg_db_role_setting s JOIN pg_database d "
                            "ON d.oid = s.setdatabase WHERE s.setrole = "
                            "(SELECT oid FROM pg_roles WHERE rolname = %s)", (OWNER_ROLE,))
                for (database,) in cur.fetchall():
                    cur.execute(sql.SQL("ALTER ROLE {} IN DATABASE {} RESET ALL").format(
                        owner, sql.Identifier(database)))
                # what OWNER_ROLE was granted, and the session roles that are its members (older
                # sqlrl made them members; no session may SET ROLE to it now). Other members
                # (a CREATEROLE admin, below) are the admins' business.
                cur.execute("SELECT g.rolname, m.rolname FROM pg_auth_members a "
                            "JOIN pg_roles g ON g.oid = a.roleid JOIN pg_roles m ON m.oid = a.member "
                            "WHERE m.rolname = %s OR (g.rolname = %s AND m.rolname LIKE %s)",
                            (OWNER_ROLE, OWNER_ROLE, SCRATCH_PREFIX.replace("_", "\\_") + "%"))
                for granted, member in cur.fetchall():
                    cur.execute(sql.SQL("REVOKE {} FROM {}").format(
                        sql.Identifier(granted), sql.Identifier(member)))
                if not superuser:  # to hand tables to it (seal) and over to sessions (REASSIGN)
                    cur.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(owner))
        finally:
            conn.close()

    def create_database(self, url: URL, name: str, replace: bool) -> None:
        conn = self.connect(url)
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

    def seal(self, url: URL, name: str) -> None:
        ident, owner = sql.Identifier(name), sql.Identifier(OWNER_ROLE)
        conn = self.connect(url, name)
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(ident))
                cur.execute("SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
                            "AND nspname <> 'information_schema'")
                for (schema,) in cur.fetchall():
                    # PUBLIC, in a clone, is its session's role alone (nobody else may connect)
                    cur.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}, PUBLIC").format(
                        sql.Identifier(schema), owner))
                self._hand_over_relations(cur)
                cur.execute(_REVOKE_FROM_PUBLIC)
        finally:
            conn.close()

    @staticmethod
    def _hand_over_relations(cur: Any) -> None:
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
                (list(relkinds), OWNER_ROLE))
            for schema, rel, kind in cur.fetchall():
                cur.execute(sql.SQL("ALTER {} {}.{} OWNER TO {}").format(
                    sql.SQL(kinds[kind]), sql.Identifier(schema), sql.Identifier(rel),
                    sql.Identifier(OWNER_ROLE)))

    def load_connection(self, url: URL, database: str) -> Any:
        """A connection to ``database`` in one transaction, for ``sqlrl.db.provisioning.loader``."""
        conn = psycopg2.connect(**connect_kwargs(url, database))
        conn.autocommit = False
        return conn

    def insert_rows(self, conn: Any, table: str, columns: list[str],
                    rows: list[tuple[Any, ...]]) -> None:
        """INSERT ``rows`` into ``table`` (quoted names) in one round trip."""
        with conn.cursor() as cur:
            execute_values(cur, f"INSERT INTO {table} ({', '.join(columns)}) VALUES %s", rows,
                           page_size=max(len(rows), 1))

    def drop_database(self, url: URL, name: str) -> None:
        conn = self.connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)))
        finally:
            conn.close()

    # -- scratch databases (on one long-lived admin connection of sqlrl.db.provisioning.scratch) -------------

    def base_size(self, conn: Any, base: str) -> int:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_database_size(%s)", (base,))
            return int(cur.fetchone()[0])

    def hold(self, conn: Any, name: str) -> bool:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, lock_key(name)))
            return bool(cur.fetchone()[0])

    def unhold(self, conn: Any, name: str) -> None:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, lock_key(name)))

    def create_scratch(self, conn: Any, base: str, name: str, password: str,
                       base_bytes: int) -> None:
        ident = sql.Identifier(name)
        strategy = "FILE_COPY" if base_bytes > FILE_COPY_ABOVE_BYTES else "WAL_LOG"
        with conn.cursor() as cur:
            # a non-superuser admin (CREATEROLE) must be a member to REASSIGN and DROP OWNED
            admin = "" if conn.get_parameter_status("is_superuser") == "on" else " ROLE CURRENT_USER"
            # a member of OWNER_ROLE until ``hand_over`` (the login takes ownership of the clone)
            cur.execute(sql.SQL("CREATE ROLE {} LOGIN " + _ROLE_ATTRS + " CONNECTION LIMIT "
                                + str(CONNECTION_LIMIT) + " PASSWORD {} IN ROLE {}" + admin).format(
                ident, sql.Literal(password), sql.Identifier(OWNER_ROLE)))
            try:
                cur.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY " + strategy).format(
                    ident, sql.Identifier(base)))
            except errors.ObjectInUse as exc:
                raise SessionError(
                    f"cannot clone the base {base!r}: other connections are open on it "
                    f"({' '.join(str(exc).split())}). Sessions clone the base, which PostgreSQL "
                    "allows only while nobody is connected to it: close them") from exc
            cur.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC; "
                                "GRANT CONNECT, TEMPORARY ON DATABASE {} TO {}").format(
                ident, ident, ident))

    def hand_over(self, conn: Any, agent: Any, name: str) -> None:
        """Finish clone ``name`` on the session's login ``agent`` (module doc): the login takes
        ownership of what ``OWNER_ROLE`` owns there, the admin (``conn``) takes the role out of
        ``OWNER_ROLE``, and the login is then checked to be a member of no role, not switched to
        another role, and the only owner of the clone's relations. A base sealed by an older
        sqlrl (no schema rights for PUBLIC, or functions PUBLIC may still run), or a login that
        could not take ownership (its membership taken away meanwhile by another process's
        ``prepare_server``), is finished by the admin on a connection of its own, as before."""
        ident = sql.Identifier(name)
        try:
            with agent.cursor() as cur:
                cur.execute(_TAKE_OWNERSHIP)
                (finished,) = cur.fetchone()
        except psycopg2.Error:
            if agent.closed:
                raise
            finished = False  # nothing was changed (one implicit transaction): the admin does it
        with conn.cursor() as cur:
            cur.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(OWNER_ROLE), ident))
        if not finished:
            clone = _connect_like(conn, name)
            try:
                with clone.cursor() as cur:
                    cur.execute(sql.SQL(_HAND_OVER_CLONE).format(
                        role=ident, role_literal=sql.Literal(name)))
            finally:
                clone.close()
        with agent.cursor() as cur:
            cur.execute(_VERIFY_HANDED_OVER)
            same_role, member, owner_member, owner_owns = cur.fetchone()
        if not same_role or member or owner_member or owner_owns:
            raise SessionError(
                f"the clone {name!r} was not handed over cleanly (role switched: {not same_role}, "
                f"a member of a role: {member or owner_member}, relations left to "
                f"{OWNER_ROLE}: {owner_owns}); it is dropped")

    def drop_scratch(self, conn: Any, name: str) -> None:
        ident = sql.Identifier(name)
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
            for attempt in range(DROP_ROLE_ATTEMPTS):
                try:
                    cur.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))
                    return
                except errors.DependentObjectsStillExist:
                    if attempt == DROP_ROLE_ATTEMPTS - 1:
                        raise
                # another session granted this role something in its clone: revoke it there
                cur.execute(_ROLE_DEPENDENCY_DBS, (name,))
                for (database,) in cur.fetchall():
                    try:
                        other = _connect_like(conn, database)
                    except psycopg2.OperationalError:
                        continue  # dropped meanwhile: its grants are gone with it
                    try:
                        with other.cursor() as ocur:
                            ocur.execute(sql.SQL("DROP OWNED BY {}").format(ident))
                    finally:
                        other.close()

    def scratch_names(self, conn: Any, prefix: str) -> list[str]:
        pattern = prefix.replace("_", "\\_") + "%"
        with conn.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database WHERE datname LIKE %s UNION "
                        "SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (pattern, pattern))
            return sorted(row[0] for row in cur.fetchall())

    @staticmethod
    def is_lost(conn: Any) -> bool:
        """True when the admin connection is gone (after an error on it)."""
        return bool(conn.closed)
