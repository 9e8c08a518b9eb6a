"""Shared fixtures.

Server URLs come from the environment that scripts/dbservers.sh writes (SQLRL_PG_ADMIN_URL,
SQLRL_MYSQL_ADMIN_URL). Without them the server tests skip and say why — unless
SQLRL_REQUIRE_SERVERS=1 (set by scripts/test.sh, so CI), where a missing server is a failure.
Tests run in a random order (pytest-randomly); the seed is printed first and last, so an order
that fails can be repeated. Fixtures prepare what they use: no test relies on an earlier one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sqlrl.tasks.demo_db import build_demo_database

ROOT = Path(__file__).resolve().parents[1]
# Ray (actor tests): bind the local head, GCS and dashboard to loopback; no usage reporting.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
SHARED_DATA = Path(os.environ.get("SQLRL_SHARED_DATA", ROOT.parent / "shared" / "data"))


def _order_line(config: pytest.Config) -> str | None:
    """The line that repeats this run's test order (pytest-randomly shuffles modules, then the tests
    in each; its own header line is hidden under ``-q``, which scripts/test.sh uses)."""
    if not config.pluginmanager.hasplugin("randomly"):
        return None
    seed = config.getoption("randomly_seed")
    return (f"random test order: --randomly-seed={seed} repeats it "
            f"(-p no:randomly runs the files in order)")


def pytest_sessionstart(session: pytest.Session) -> None:
    line = _order_line(session.config)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if line and reporter is not None:
        reporter.write_line(line)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    line = _order_line(config)
    if line:
        terminalreporter.write_line(line)


# Every test in these folders starts a Ray cluster, a model or a whole job: all are in the slow tier.
SLOW_FOLDERS = ("actors", "e2e", "integration")


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = ROOT / "tests"
    for item in items:
        if item.path.is_relative_to(tests) and item.path.relative_to(tests).parts[0] in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)


def ray_can_stop(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    """Whether the actor tests' Ray instance may be shut down once ``item`` is torn down: no test
    follows, or the next one is in another module and does not use ``ray_session``. Never while
    the next test is in the same module: that module's fixtures are still set up and may hold
    actors on the instance (tests/actors/test_learner_fsdp.py's module-scoped FSDP group: in a
    random order a test without Ray ran between two that use the group, the shutdown killed its
    ranks, and the tests after it found them gone)."""
    if nextitem is None:
        return True
    return nextitem.path != item.path and "ray_session" not in nextitem.fixturenames


@pytest.hookimpl(trylast=True)  # after the module's fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Shut the actor tests' Ray instance (tests/actors/conftest.py) down after the last module in
    a row that uses it (``ray_can_stop``): an idle local cluster (dashboard agent, log monitor,
    GCS, idle workers) costs about a third of a core, which the rest of the suite would pay on a
    2-core machine. The next test that asks for ``ray_session`` starts it again. Stopping when Ray
    is not up (or is another instance) does nothing and imports nothing."""
    if "ray" not in sys.modules or not ray_can_stop(item, nextitem):
        return
    from tests.actors.conftest import stop_ours

    stop_ours()


def _server_url(var: str, what: str) -> str:
    url = os.environ.get(var)
    if url:
        return url
    message = f"{what} not available: {var} is unset (run scripts/dbservers.sh start and source its env.sh)"
    if os.environ.get("SQLRL_REQUIRE_SERVERS") == "1":
        pytest.fail(message)
    pytest.skip(message)


def agent_database(admin_url: str, name: str):
    """An empty base `name` on the server (replaced if it exists), sealed: yields its session URL
    (every session gets its own clone), drops the base afterwards. For module fixtures."""
    from sqlrl.db.provisioning import provision

    provision.prepare_server(admin_url)
    provision.create_database(admin_url, name, replace=True)
    provision.seal_database(admin_url, name)
    try:
        yield provision.session_url(admin_url, name)
    finally:
        provision.drop_database(admin_url, name)


def scratch_names(admin_url: str) -> set[str]:
    """The per-session scratch databases and roles/users on the server now (any process's).
    Tests compare against a baseline taken first: other processes (Ray actors of earlier tests,
    killed subprocesses) may hold or have left clones of their own."""
    from sqlrl.db.dialects.contract import SCRATCH_PREFIX
    from sqlrl.db.provisioning.admin import admin_ops
    from sqlrl.db.url import dialect_name, parse_url
    url = parse_url(admin_url)
    ops = admin_ops(dialect_name(url))
    conn = ops.connect(url)
    try:
        return set(ops.scratch_names(conn, SCRATCH_PREFIX))
    finally:
        conn.close()


def sealed_base(admin_url: str, name: str, statements: list[str]):
    """A base `name` (replaced if it exists) built by the admin with `statements`, then sealed:
    yields (the admin URL of the base, its session URL); drops the base afterwards. Prepares the
    server first (PostgreSQL's owner role), so it works on a fresh server in any test order."""
    from sqlrl.db.provisioning import provision
    from sqlrl.db.provisioning.admin import admin_ops
    from sqlrl.db.url import dialect_name, parse_url

    provision.prepare_server(admin_url)
    admin_db = provision.create_database(admin_url, name, replace=True)
    ops = admin_ops(dialect_name(parse_url(admin_url)))
    conn = ops.connect(parse_url(admin_url), name)
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()  # sessions clone the base: PostgreSQL needs it free of connections
    provision.seal_database(admin_url, name)
    try:
        yield admin_db, provision.session_url(admin_url, name)
    finally:
        provision.drop_database(admin_url, name)


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    return _server_url("SQLRL_PG_ADMIN_URL", "PostgreSQL server")


@pytest.fixture(scope="session")
def mysql_admin_url() -> str:
    return _server_url("SQLRL_MYSQL_ADMIN_URL", "MariaDB/MySQL server")


@pytest.fixture(scope="session")
def spider_dir() -> Path:
    path = SHARED_DATA / "spider"
    if not (path / "database").is_dir():
        pytest.skip(f"Spider data not found at {path} (the tests read ../shared/data/spider)")
    return path


@pytest.fixture(scope="session")
def demo_db_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_demo_database(str(tmp_path_factory.mktemp("demo") / "shop.sqlite"), seed=0)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a test module, as a rollout worker or learner rank gets (num_cpus=1):
    on a 2-core machine shared with other work, two threads mostly synchronise (seen: 4-40x
    slower for tiny-model steps). Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
