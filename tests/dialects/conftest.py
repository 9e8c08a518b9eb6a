"""The demo "shop" database on each real server (PostgreSQL, MariaDB), loaded with
``sqlrl.db.provisioning.loader`` under a fresh name per test module and dropped after it."""

import uuid

import pytest

from sqlrl.db.provisioning import provision
from sqlrl.db.provisioning.loader import load_sqlite
from sqlrl.db.sessions.executor import set_text_filter


@pytest.fixture(scope="module", params=[pytest.param("postgresql", marks=pytest.mark.postgres),
                                        pytest.param("mysql", marks=pytest.mark.mysql)])
def shop_server(request, demo_db_path):
    """``(dialect, session_url)`` of the shop database on that server (skipped without it)."""
    admin = request.getfixturevalue("pg_admin_url" if request.param == "postgresql"
                                    else "mysql_admin_url")
    name = f"t_shop_{uuid.uuid4().hex[:8]}"
    report = load_sqlite(demo_db_path, admin, name, replace=True)
    yield request.param, report.session_url
    provision.drop_database(admin, name)


@pytest.fixture(params=["filter-on", "filter-off"])
def text_filter(request):
    """Each test that takes it runs twice: with the executor's text filter on, and switched off
    (test-only), so what it checks is shown to hold without the filter (the servers enforce it)."""
    previous = set_text_filter(request.param == "filter-on")
    yield request.param
    set_text_filter(previous)
