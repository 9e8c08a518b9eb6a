"""PostgreSQL clones are finished on the session's own login (``PostgresAdmin.hand_over``): the
role is a member of the owner role only while it takes ownership of its clone, and nothing of
that membership is usable once the connection is handed out.

Attacked here: every way a session could use the temporary membership afterwards (``SET ROLE``,
``RESET ROLE``, a ``DO`` block, ``SET SESSION AUTHORIZATION``, ``REASSIGN``, granting it again,
``pg_has_role``), with the text filter on and off; a login left switched to the owner role, or a
member of any role, is refused and its clone dropped; a base sealed by an older sqlrl and a
membership taken away mid-preparation (another process's ``prepare_server``) are finished by the
admin instead, with the same result.
"""

from __future__ import annotations

import os
import secrets

import psycopg2
import pytest

from sqlrl.db import ErrorKind, Limits, open_session
from sqlrl.db.dialects import postgresql_admin
from sqlrl.db.dialects.base import get_dialect
from sqlrl.db.provisioning import provision
from sqlrl.db.provisioning.admin import admin_ops
from sqlrl.db.types import SessionError
from sqlrl.db.url import parse_url
from tests.conftest import sealed_base
from tests.dialects.server_cases import PG_BASE_SQL, pg_admin_query

PID = os.getpid()


@pytest.fixture(scope="module")
def base(pg_admin_url):
    for admin_db, url in sealed_base(pg_admin_url, f"sqlrl_handover_{PID}", PG_BASE_SQL):
        yield f"sqlrl_handover_{PID}", admin_db, url


@pytest.fixture
def admin_connections_to_clones(monkeypatch):
    """How many admin connections were opened to a clone (the fallback's hand-over)."""
    opened = []
    real = postgresql_admin._connect_like

    def counted(conn, database):
        opened.append(database)
        return real(conn, database)

    monkeypatch.setattr(postgresql_admin, "_connect_like", counted)
    return opened


class Clone:
    """One clone prepared step by step as ``scratch`` does it (create, log in, hand over), so
    a test can act between the steps; dropped at the end."""

    def __init__(self, admin_url: str, base: str) -> None:
        self.ops = admin_ops("postgresql")
        self.admin = self.ops.connect(parse_url(admin_url))
        self.name = f"sqlrl_s_{secrets.token_hex(6)}"
        self.url = parse_url(admin_url).set(username=self.name, database=self.name,
                                            password=secrets.token_urlsafe(18))
        self.ops.create_scratch(self.admin, base, self.name, self.url.password, 0)
        self.agent = get_dialect("postgresql").open_agent(self.url, Limits())

    def hand_over(self) -> None:
        self.ops.hand_over(self.admin, self.agent, self.name)

    def query(self, sql: str):
        with self.agent.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()

    def drop(self) -> None:
        self.agent.close()
        self.ops.drop_scratch(self.admin, self.name)
        self.admin.close()


@pytest.fixture
def clone(pg_admin_url, base):
    made = []

    def make() -> Clone:
        made.append(Clone(pg_admin_url, base[0]))
        return made[-1]

    yield make
    for c in made:
        c.drop()


def _refused(result):
    assert result.error is not None and result.error.kind in (ErrorKind.PERMISSION,
                                                               ErrorKind.RUNTIME), result


@pytest.mark.postgres
def test_a_session_cannot_use_the_membership_it_had_while_its_clone_was_prepared(
        base, text_filter, admin_connections_to_clones):
    from sqlrl.db.provisioning.scratch import SCRATCH

    SCRATCH.forget(base[2], base[0])  # no clone made before this test's counter
    with open_session(base[2]) as s:
        (own,), = s.execute("SELECT current_database()").rows
        for sql in ("SET ROLE sqlrl_owner",
                    "RESET ROLE; SET ROLE sqlrl_owner",
                    "SET SESSION AUTHORIZATION sqlrl_owner",
                    "DO $$ BEGIN EXECUTE 'SET ROLE sqlrl_owner'; END $$",
                    "DO $$ BEGIN EXECUTE 'RESET ROLE'; EXECUTE 'SET ROLE sqlrl_owner'; END $$",
                    "REASSIGN OWNED BY sqlrl_owner TO CURRENT_USER",
                    "DROP OWNED BY sqlrl_owner",
                    "GRANT sqlrl_owner TO CURRENT_USER",
                    "ALTER ROLE sqlrl_owner SET work_mem = '64kB'",
                    "CREATE TABLE theirs (x int); ALTER TABLE theirs OWNER TO sqlrl_owner"):
            _refused(s.execute(sql))
        rows = s.execute(
            "SELECT current_user = session_user, current_setting('role'), "
            "pg_has_role('sqlrl_owner', 'MEMBER'), pg_has_role('sqlrl_owner', 'USAGE'), "
            "(SELECT count(*) FROM pg_auth_members WHERE member = current_user::text::regrole), "
            "(SELECT count(*) FROM pg_class WHERE relowner = 'sqlrl_owner'::regrole)").rows
        assert rows == ((True, "none", False, False, 0, 0),)
        # what the membership was for is the session's own: its clone's tables
        assert s.execute("ALTER TABLE orders ADD COLUMN note text; DROP VIEW big_orders; "
                         "CREATE TABLE mine (x int)").error is None
    # prepared on the login: no admin connection to it (a sweep may connect to other clones)
    assert own not in admin_connections_to_clones


@pytest.mark.postgres
def test_hand_over_takes_the_membership_back_before_the_login_is_checked(clone):
    c = clone()
    assert c.query("SELECT pg_has_role('sqlrl_owner', 'MEMBER')") == [(True,)]  # while prepared
    c.hand_over()
    assert c.query("SELECT pg_has_role('sqlrl_owner', 'MEMBER'), "
                   "(SELECT count(*) FROM pg_auth_members WHERE member = current_user::text::regrole)") \
        == [(False, 0)]
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        c.query("SET ROLE sqlrl_owner")


@pytest.mark.postgres
def test_a_login_left_switched_to_the_owner_role_is_refused(clone):
    c = clone()
    c.query("SET ROLE sqlrl_owner; SELECT 1")  # possible while the role is still a member
    with pytest.raises(SessionError, match="role switched: True"):
        c.hand_over()


@pytest.mark.postgres
def test_a_login_that_is_a_member_of_any_role_is_refused(pg_admin_url, clone):
    c = clone()
    extra = f"sqlrl_handover_extra_{PID}"
    pg_admin_query(pg_admin_url, f'DROP ROLE IF EXISTS "{extra}"; CREATE ROLE "{extra}" NOLOGIN; '
                                 f'GRANT "{extra}" TO "{c.name}"')
    try:
        with pytest.raises(SessionError, match="a member of a role: True"):
            c.hand_over()
    finally:
        pg_admin_query(pg_admin_url, f'DROP ROLE "{extra}"')


@pytest.mark.postgres
def test_a_failed_hand_over_never_hands_the_login_out(pg_admin_url, base, monkeypatch):
    """Through ``scratch``: the clone of a refused login is dropped and the take fails."""
    from sqlrl.db.provisioning.scratch import ScratchManager

    monkeypatch.setattr(postgresql_admin, "_VERIFY_HANDED_OVER",
                        "SELECT false, false, false, false")  # as if the login were switched
    names = []
    real = postgresql_admin.PostgresAdmin.create_scratch

    def create_scratch(self, conn, base_name, name, *args):
        names.append(name)
        return real(self, conn, base_name, name, *args)

    monkeypatch.setattr(postgresql_admin.PostgresAdmin, "create_scratch", create_scratch)
    manager = ScratchManager(prefill=0)
    try:
        with pytest.raises(SessionError, match="not handed over cleanly"):
            manager.take(base[2], Limits(), get_dialect("postgresql"))
        assert manager.settle()
        assert manager.stats().live == 0 and manager.held_names() == set()
    finally:
        manager.shutdown()
    assert len(names) == 1
    assert pg_admin_query(pg_admin_url, "SELECT (SELECT count(*) FROM pg_roles WHERE rolname = %s), "
                          "(SELECT count(*) FROM pg_database WHERE datname = %s)",
                          (names[0], names[0])) == [(0, 0)]


@pytest.mark.postgres
def test_a_membership_taken_away_meanwhile_is_finished_by_the_admin(pg_admin_url, clone,
                                                                     admin_connections_to_clones):
    c = clone()
    provision.prepare_server(pg_admin_url)  # another process starting: revokes such memberships
    c.hand_over()
    assert admin_connections_to_clones.count(c.name) == 1
    assert c.query("SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class c JOIN pg_namespace n "
                   "ON n.oid = c.relnamespace WHERE n.nspname = 'public'") == [(c.name,)]
    assert c.query("SELECT pg_has_role('sqlrl_owner', 'MEMBER')") == [(False,)]


@pytest.mark.postgres
def test_a_base_sealed_by_an_older_sqlrl_is_finished_by_the_admin(pg_admin_url,
                                                                   admin_connections_to_clones):
    name = f"sqlrl_handover_old_{PID}"
    for admin_db, url in sealed_base(pg_admin_url, name, PG_BASE_SQL):
        # as an older sqlrl sealed it: schema rights for the owner role only, and the
        # advisory-lock functions still PUBLIC's
        pg_admin_query(admin_db, "REVOKE CREATE ON SCHEMA public FROM PUBLIC; "
                                 "GRANT EXECUTE ON FUNCTION pg_advisory_lock(bigint) TO PUBLIC")
        c = Clone(pg_admin_url, name)
        try:
            c.hand_over()
            assert admin_connections_to_clones.count(c.name) == 1
            assert c.query("SELECT has_schema_privilege('public', 'CREATE'), "
                           "has_function_privilege('pg_advisory_lock(bigint)', 'EXECUTE'), "
                           "pg_has_role('sqlrl_owner', 'MEMBER')") == [(True, False, False)]
            c.query("CREATE TABLE mine (x int); SELECT 1")
        finally:
            c.drop()
