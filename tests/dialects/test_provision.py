"""sqlrl.db.provision against real servers: roles, databases and grants, all idempotent."""

import os

import psycopg2
import pymysql
import pytest

from sqlrl.db import SessionError, open_session, provision
from sqlrl.db.url import parse_url

PID = os.getpid()


# --- PostgreSQL ----------------------------------------------------------------------------------

def _pg(url):
    conn = psycopg2.connect(url)
    conn.autocommit = True
    return conn


def pg_query(url, sql, args=None):
    conn = _pg(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


@pytest.fixture
def pg_db(pg_admin_url):
    name = f"sqlrl_p_{PID}"
    yield name
    provision.drop_database(pg_admin_url, name)


@pytest.mark.postgres
def test_pg_role_database_and_grants(pg_admin_url, pg_db):
    for _ in range(2):  # idempotent
        provision.ensure_agent_role(pg_admin_url)
    (attrs,) = pg_query(pg_admin_url, "SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, "
                        "rolreplication, rolbypassrls FROM pg_roles WHERE rolname = %s",
                        (provision.AGENT_ROLE,))
    assert attrs == (True, False, False, False, False, False)

    url = provision.create_database(pg_admin_url, pg_db)
    assert url == provision.create_database(pg_admin_url, pg_db)
    assert parse_url(url).database == pg_db and parse_url(url).username == "postgres"
    pg_query(url, "CREATE TABLE t (id serial PRIMARY KEY, x int GENERATED ALWAYS AS IDENTITY, "
                  "name text); CREATE SEQUENCE free_seq; CREATE VIEW v AS SELECT id FROM t; "
                  "CREATE MATERIALIZED VIEW mv AS SELECT 1 AS one; CREATE SCHEMA extra; "
                  "CREATE TABLE extra.e (a int)")
    for _ in range(2):
        provision.grant_database(pg_admin_url, pg_db)
    owners = dict(pg_query(url, "SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class c "
                                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                                "WHERE n.nspname IN ('public', 'extra') AND c.relkind IN "
                                "('r', 'v', 'm', 'S')"))
    assert set(owners) == {"t", "t_id_seq", "t_x_seq", "free_seq", "v", "mv", "e"}
    assert set(owners.values()) == {provision.AGENT_ROLE}
    role = provision.AGENT_ROLE
    (privs,) = pg_query(url, "SELECT has_database_privilege(%s, current_database(), 'CONNECT'), "
                        "has_database_privilege(%s, current_database(), 'TEMP'), "
                        "has_database_privilege(%s, current_database(), 'CREATE'), "
                        "has_schema_privilege(%s, 'public', 'USAGE, CREATE'), "
                        "has_schema_privilege(%s, 'extra', 'USAGE, CREATE')", (role,) * 5)
    assert privs == (True, True, False, True, True)
    revoked = pg_query(url, "SELECT p.oid::regprocedure::text, has_function_privilege(%s, p.oid, "
                       "'EXECUTE') FROM pg_proc p WHERE p.proname IN ('pg_terminate_backend', "
                       "'pg_cancel_backend', 'pg_read_file', 'lo_export', 'set_config', "
                       "'pg_reload_conf')", (role,))
    assert len(revoked) >= 6 and not any(allowed for _, allowed in revoked), revoked
    # revocations are per database: the server's other databases keep the defaults
    (elsewhere,) = pg_query(pg_admin_url, "SELECT has_function_privilege(%s, "
                            "'pg_cancel_backend(integer)', 'EXECUTE')", (role,))
    assert elsewhere == (True,)

    agent = provision.agent_url(pg_admin_url + "?allow_superuser=1", pg_db)
    assert agent == f"postgresql://sqlrl_agent:sqlrl-agent@127.0.0.1:{parse_url(url).port}/{pg_db}"
    with open_session(agent) as s:
        assert s.execute("SELECT current_user, count(*) FROM t").rows == (("sqlrl_agent", 0),)
        assert s.execute("ALTER TABLE t ADD COLUMN y int").error is None  # owner: DDL works
        assert s.execute("DROP VIEW v").error is None

    pg_query(url, "INSERT INTO t (name) VALUES ('kept?')")
    provision.create_database(pg_admin_url, pg_db, replace=True)
    assert pg_query(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]
    provision.drop_database(pg_admin_url, pg_db)
    provision.drop_database(pg_admin_url, pg_db)
    assert pg_query(pg_admin_url, "SELECT count(*) FROM pg_database WHERE datname = %s",
                    (pg_db,)) == [(0,)]


# --- MariaDB / MySQL -----------------------------------------------------------------------------

ROLE = f"sqlrl_p{PID}"


def my_query(url, sql, args=None):
    u = parse_url(url)
    conn = pymysql.connect(host=u.host, port=u.port, user=u.username, password=u.password or "",
                           autocommit=True, ssl_disabled=True)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall()
    finally:
        conn.close()


@pytest.fixture
def my_db(mysql_admin_url):
    name = f"sqlrl_p_{PID}_x"
    yield name
    provision.drop_database(mysql_admin_url, name)
    for host in ("127.0.0.1", "localhost"):
        my_query(mysql_admin_url, "DROP USER IF EXISTS %s@%s", (ROLE, host))


@pytest.mark.mysql
def test_mysql_role_database_and_grants(mysql_admin_url, my_db):
    for _ in range(2):
        provision.ensure_agent_role(mysql_admin_url, role=ROLE, password="pw-1")
    provision.ensure_agent_role(mysql_admin_url, role=ROLE, password="pw-2")  # password updated
    url = provision.create_database(mysql_admin_url, my_db)
    assert url == provision.create_database(mysql_admin_url, my_db)
    my_query(mysql_admin_url, f"CREATE TABLE {my_db}.t (id INT PRIMARY KEY)")
    for _ in range(2):
        provision.grant_database(mysql_admin_url, my_db, role=ROLE)
    for host in ("127.0.0.1", "localhost"):
        grants = sorted(r[0] for r in my_query(mysql_admin_url, "SHOW GRANTS FOR %s@%s", (ROLE, host)))
        text = "\n".join(grants)
        assert f"GRANT SELECT, SHOW VIEW ON `{my_db.replace('_', chr(92) + '_')}`.*" in text
        scratch = next(g for g in grants if "sqlrl\\_s\\_%" in g)
        for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER", "INDEX",
                          "CREATE TEMPORARY TABLES", "CREATE VIEW", "SHOW VIEW", "REFERENCES"):
            assert privilege in scratch
        for forbidden in ("FILE", "SUPER", "ALL PRIVILEGES", "CREATE ROUTINE", "EXECUTE", "EVENT",
                          "TRIGGER", "GRANT OPTION", "PROCESS", "LOCK TABLES"):
            assert forbidden not in text, (forbidden, text)
    # MariaDB's default PUBLIC grants on test / test_% are gone
    assert my_query(mysql_admin_url, "SELECT count(*) FROM mysql.db WHERE User = 'PUBLIC'") == ((0,),)

    agent = provision.agent_url(mysql_admin_url, my_db, role=ROLE, password="pw-2")
    assert agent.startswith(f"mysql://{ROLE}:pw-2@127.0.0.1:") and agent.endswith(f"/{my_db}")
    with open_session(agent) as s:
        assert s.execute("SELECT count(*) FROM t").rows == ((0,),)
    with pytest.raises(SessionError):
        open_session(provision.agent_url(mysql_admin_url, my_db, role=ROLE, password="pw-1"))

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
    with pytest.raises(ValueError, match="reserved"):
        provision.create_database(pg_admin_url, "sqlrl_s_mine")
    with pytest.raises(ValueError):
        provision.ensure_agent_role(pg_admin_url, role="bad role")
    with pytest.raises(SessionError, match="no provisioning"):
        provision.create_database("sqlite:///tmp/x.sqlite", "x")
    assert provision.agent_url("mariadb://root:pw@db.example:3306/mysql?allow_superuser=1", "shop") \
        == "mariadb://sqlrl_agent:sqlrl-agent@db.example:3306/shop"
