"""sqlrl.db.provisioning.provision and the scratch roles against real servers: what the servers enforce.

Bases are reachable by no agent account; every session runs as a role/user made for it alone,
with rights on its own clone only, and both are gone after the session. All provisioning calls
are idempotent.
"""

import os

import pytest

from sqlrl.db import SessionError, open_session
from sqlrl.db.provisioning import provision
from sqlrl.db.dialects.postgresql_admin import OWNER_ROLE
from sqlrl.db.provisioning.scratch import SCRATCH
from sqlrl.db.url import parse_url
from tests.dialects.server_cases import mysql_admin_query, pg_admin_query

PID = os.getpid()
pg_query, my_query = pg_admin_query, mysql_admin_query  # as the admin, autocommit


# --- PostgreSQL ----------------------------------------------------------------------------------

@pytest.fixture
def pg_db(pg_admin_url):
    name = f"sqlrl_p_{PID}"
    yield name
    provision.drop_database(pg_admin_url, name)


@pytest.mark.postgres
def test_pg_bases_are_sealed_and_sessions_run_as_their_own_role(pg_admin_url, pg_db):
    pg_query(pg_admin_url, f"DO $$BEGIN CREATE ROLE {OWNER_ROLE} NOLOGIN; EXCEPTION WHEN "
                           f"duplicate_object THEN NULL; END$$; GRANT pg_read_server_files TO {OWNER_ROLE}")
    for _ in range(2):  # idempotent; takes escalating roles away from the owner role
        provision.prepare_server(pg_admin_url)
    (attrs,) = pg_query(pg_admin_url, "SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, "
                        "rolreplication, rolbypassrls FROM pg_roles WHERE rolname = %s", (OWNER_ROLE,))
    assert attrs == (False, False, False, False, False, False)
    assert pg_query(pg_admin_url, "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON "
                    "r.oid = m.member WHERE r.rolname = %s", (OWNER_ROLE,)) == [(0,)]

    url = provision.create_database(pg_admin_url, pg_db)
    assert url == provision.create_database(pg_admin_url, pg_db)
    assert parse_url(url).database == pg_db and parse_url(url).username == "postgres"
    pg_query(url, "CREATE TABLE t (id serial PRIMARY KEY, x int GENERATED ALWAYS AS IDENTITY, "
                  "name text); CREATE SEQUENCE free_seq; CREATE VIEW v AS SELECT id FROM t; "
                  "CREATE MATERIALIZED VIEW mv AS SELECT 1 AS one; CREATE SCHEMA extra; "
                  "CREATE TABLE extra.e (a int)")
    for _ in range(2):
        provision.seal_database(pg_admin_url, pg_db)
    owners = dict(pg_query(url, "SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class c "
                                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                                "WHERE n.nspname IN ('public', 'extra') AND c.relkind IN "
                                "('r', 'v', 'm', 'S')"))
    assert set(owners) == {"t", "t_id_seq", "t_x_seq", "free_seq", "v", "mv", "e"}
    assert set(owners.values()) == {OWNER_ROLE}
    # PUBLIC (so every agent role) has no right on the base at all
    assert pg_query(url, "SELECT count(*) FROM pg_database d, aclexplode(d.datacl) a "
                         "WHERE d.datname = %s AND a.grantee = 0", (pg_db,)) == [(0,)]

    session_url = provision.session_url(pg_admin_url, pg_db)
    assert session_url == url  # the admin's credentials, the base as database
    with open_session(session_url) as s:
        ((role, database),) = s.execute("SELECT current_user, current_database()").rows
        assert role.startswith("sqlrl_s_") and database == role
        assert s.execute("ALTER TABLE t ADD COLUMN y int").error is None  # owner's rights: DDL
        assert s.execute("DROP VIEW v").error is None
        assert s.execute("SELECT setval('free_seq', 99)").error is None  # its own sequence
        (attrs,) = pg_query(pg_admin_url, "SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, "
                            "rolreplication, rolbypassrls, rolconnlimit FROM pg_roles "
                            "WHERE rolname = %s", (role,))
        assert attrs == (True, False, False, False, False, False, 2)
        # a member of no role (it could SET ROLE to it); the clone's tables are its own instead
        assert pg_query(pg_admin_url, "SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r "
                        "ON r.oid = m.roleid WHERE m.member = %s::regrole", (role,)) == []
        assert pg_query(url.rsplit("/", 1)[0] + "/" + database,
                        "SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class c JOIN pg_namespace n "
                        "ON n.oid = c.relnamespace WHERE n.nspname IN ('public', 'extra')") == [(role,)]
        assert s.execute("CREATE TABLE extra.mine (x int); DROP TABLE extra.e").error is None
        (privs,) = pg_query(url, "SELECT has_database_privilege(%s, %s, 'CONNECT'), "
                            "has_database_privilege(%s, %s, 'CONNECT'), "
                            "has_database_privilege(%s, %s, 'TEMP'), "
                            "has_database_privilege(%s, %s, 'CREATE')",
                            (role, pg_db, role, role, role, role, role, role))
        assert privs == (False, True, True, False)  # not the base; its own clone, no CREATE
        revoked = pg_query(url, "SELECT has_function_privilege(%s, p.oid, 'EXECUTE') FROM pg_proc p "
                           "WHERE p.proname IN ('pg_terminate_backend', 'pg_cancel_backend', "
                           "'pg_read_file', 'lo_export', 'set_config', 'pg_reload_conf')", (role,))
        assert len(revoked) >= 6 and not any(allowed for (allowed,) in revoked)
    assert SCRATCH.settle()
    assert pg_query(pg_admin_url, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)) == [(0,)]
    assert pg_query(pg_admin_url, "SELECT count(*) FROM pg_database WHERE datname = %s",
                    (role,)) == [(0,)]
    assert pg_query(url, "SELECT last_value FROM free_seq") == [(1,)]  # the base's is untouched
    with open_session(session_url) as s:  # a later session sees the base as it was
        assert s.execute("SELECT count(*) FROM v").rows == ((0,),)

    pg_query(url, "INSERT INTO t (name) VALUES ('kept?')")
    provision.create_database(pg_admin_url, pg_db, replace=True)
    assert pg_query(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]
    provision.drop_database(pg_admin_url, pg_db)
    provision.drop_database(pg_admin_url, pg_db)
    assert pg_query(pg_admin_url, "SELECT count(*) FROM pg_database WHERE datname = %s",
                    (pg_db,)) == [(0,)]


@pytest.mark.postgres
def test_pg_an_account_that_cannot_create_roles_gets_a_clear_error(pg_admin_url, pg_db):
    plain = f"sqlrl_plain_{PID}"
    pg_query(pg_admin_url, f"DROP ROLE IF EXISTS {plain}; CREATE ROLE {plain} LOGIN PASSWORD 'pw'")
    try:
        provision.prepare_server(pg_admin_url)  # a fresh server has no owner role yet
        provision.create_database(pg_admin_url, pg_db)
        provision.seal_database(pg_admin_url, pg_db)
        url = parse_url(provision.session_url(pg_admin_url, pg_db)).set(username=plain, password="pw")
        with pytest.raises(SessionError, match="cannot create roles and databases"):
            open_session(url.render_as_string(hide_password=False))
        with pytest.raises(SessionError, match="allow_superuser is not supported"):
            open_session(provision.session_url(pg_admin_url, pg_db) + "?allow_superuser=1")
    finally:
        pg_query(pg_admin_url, f"DROP ROLE IF EXISTS {plain}")


# --- MariaDB / MySQL -----------------------------------------------------------------------------

@pytest.fixture
def my_db(mysql_admin_url):
    name = f"sqlrl_p_{PID}_x"
    yield name
    provision.drop_database(mysql_admin_url, name)


@pytest.mark.mysql
def test_mysql_bases_are_granted_to_nobody_and_sessions_run_as_their_own_user(mysql_admin_url, my_db):
    for _ in range(2):
        provision.prepare_server(mysql_admin_url)
    # MariaDB's default PUBLIC grants on test / test_% are gone; symbolic links are off
    assert my_query(mysql_admin_url, "SELECT count(*) FROM mysql.db WHERE User = 'PUBLIC'") == ((0,),)
    assert my_query(mysql_admin_url, "SELECT @@have_symlink") == (("DISABLED",),)
    url = provision.create_database(mysql_admin_url, my_db)
    assert url == provision.create_database(mysql_admin_url, my_db)
    my_query(mysql_admin_url, f"CREATE TABLE {my_db}.t (id INT PRIMARY KEY)")
    my_query(mysql_admin_url, f"CREATE VIEW {my_db}.v AS SELECT id FROM {my_db}.t")
    for _ in range(2):
        provision.seal_database(mysql_admin_url, my_db)
    assert my_query(mysql_admin_url, "SELECT count(*) FROM mysql.db WHERE Db = %s",
                    (my_db.replace("_", "\\_"),)) == ((0,),)  # granted to nobody

    session_url = provision.session_url(mysql_admin_url, my_db)
    with open_session(session_url) as s:
        ((user, database),) = s.execute("SELECT CURRENT_USER(), DATABASE()").rows
        name = user.split("@")[0]
        assert name.startswith("sqlrl_s_") and database == name and user.endswith("@%")
        assert s.execute("SELECT count(*) FROM t").rows == ((0,),)
        assert s.execute("SELECT count(*) FROM v").rows == ((0,),)  # the view was cloned
        text = "\n".join(row[0] for row in s.execute("SHOW GRANTS").rows)
        for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER", "INDEX",
                          "CREATE TEMPORARY TABLES", "CREATE VIEW", "SHOW VIEW", "REFERENCES"):
            assert privilege in text
        for forbidden in ("FILE", "SUPER", "ALL PRIVILEGES", "CREATE ROUTINE", "EXECUTE", "EVENT",
                          "TRIGGER", "GRANT OPTION", "PROCESS", "LOCK TABLES", "CREATE USER"):
            assert forbidden not in text, (forbidden, text)
        assert my_db not in text and my_db.replace("_", "\\_") not in text
        assert "ON *.*" in text and "GRANT USAGE ON *.*" in text  # nothing global but USAGE
    assert SCRATCH.settle()
    assert my_query(mysql_admin_url, "SELECT count(*) FROM mysql.user WHERE User = %s",
                    (name,)) == ((0,),)
    assert my_query(mysql_admin_url, "SHOW DATABASES LIKE %s", (name,)) == ()
    with pytest.raises(SessionError, match="allow_superuser is not supported"):
        open_session(session_url + "?allow_superuser=1")

    my_query(mysql_admin_url, f"INSERT INTO {my_db}.t VALUES (1)")
    provision.create_database(mysql_admin_url, my_db, replace=True)
    assert my_query(mysql_admin_url, f"SHOW TABLES FROM {my_db}") == ()
    provision.drop_database(mysql_admin_url, my_db)
    provision.drop_database(mysql_admin_url, my_db)
    assert my_query(mysql_admin_url, "SHOW DATABASES LIKE %s", (my_db,)) == ()


# --- validation ----------------------------------------------------------------------------------

@pytest.mark.postgres
def test_names_are_validated_and_dialects_dispatched(pg_admin_url):
    for bad in ("", "a b", "x;DROP", "a" * 64, "quo`te", "é"):
        with pytest.raises(ValueError):
            provision.create_database(pg_admin_url, bad)
        with pytest.raises(ValueError):
            provision.session_url(pg_admin_url, bad)
    with pytest.raises(ValueError, match="reserved"):
        provision.create_database(pg_admin_url, "sqlrl_s_mine")
    with pytest.raises(SessionError, match="no provisioning"):
        provision.create_database("sqlite:///tmp/x.sqlite", "x")
    assert provision.session_url("mariadb://root:pw@db.example:3306/mysql?ssl=1", "shop") \
        == "mariadb://root:pw@db.example:3306/shop?ssl=1"
