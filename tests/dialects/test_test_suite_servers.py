"""Test-suite match on PostgreSQL and MariaDB: a server base loaded from SQLite gets its variants
fuzzed from that file and loaded as sealed bases on the same server; the reward takes the result
part from a lucky match there too, and no credentials are written to the run dir."""

from __future__ import annotations

import uuid

import pytest

from sqlrl.db import Limits
from sqlrl.db.provisioning import provision
from sqlrl.db.provisioning.loader import load_sqlite
from sqlrl.db.url import parse_url
from sqlrl.suites.test_suite import TestSuites
from sqlrl.rewards import Judge, RewardConfig, compute
from sqlrl.synth.variants import drop_server_variants
from sqlrl.tasks.types import Text2SQLTask
from tests.unit.test_test_suite import GOLD, NEAR_MISS, make_db, single


@pytest.fixture(params=[pytest.param("postgresql", marks=pytest.mark.postgres),
                        pytest.param("mysql", marks=pytest.mark.mysql)])
def server_co(request, tmp_path):
    admin = request.getfixturevalue("pg_admin_url" if request.param == "postgresql"
                                    else "mysql_admin_url")
    db = make_db(tmp_path / "co.sqlite")
    name = f"t_co_{uuid.uuid4().hex[:8]}"
    report = load_sqlite(str(db), admin, name, replace=True)
    yield request.param, db, report.session_url
    provision.drop_database(admin, name)
    dropped = drop_server_variants(admin, tmp_path / "ts" / "servers")
    assert not list((tmp_path / "ts" / "servers").glob("*/*.loaded"))
    assert all(n.startswith("tsv_") for n in dropped)


def test_server_variants_catch_a_lucky_match_and_keep_credentials_out_of_the_run_dir(server_co, tmp_path) -> None:
    dialect, db, url = server_co
    catalog = {"co": {"sqlite": f"sqlite:///{db.resolve()}", dialect: url}}
    judge = Judge(catalog, limits=Limits(timeout_s=10.0, max_rows=1000),
                  suites=TestSuites(tmp_path / "ts"))
    cfg = RewardConfig(test_suite=True, test_suite_dir=str(tmp_path / "ts"))
    task = Text2SQLTask(task_id="t", db_id="co", question="over 30?", gold_sql=GOLD, dialect=dialect)
    plain = compute("spider_ex_single", task, single(NEAR_MISS), judge)
    lucky = compute("spider_ex_single", task, single(NEAR_MISS), judge, cfg)
    right = compute("spider_ex_single", task, single(GOLD), judge, cfg)
    assert plain.score == 1.0  # single-instance EX is fooled on the server too
    assert lucky.parts["lucky_match"] == 1.0 and lucky.score == 0.0
    assert right.score == 1.0 and right.parts["lucky_match"] == 0.0
    assert lucky.reason.startswith("lucky-match")
    loaded = list((tmp_path / "ts" / "servers").glob("*/*.loaded"))
    assert loaded  # variants were loaded as bases on the server, once each
    password = parse_url(url).password
    for f in (tmp_path / "ts" / "suites").glob("*.json"):
        assert not password or password not in f.read_text()
    # a second Judge (another actor) reads the suite back and reaches the same server variants
    again = Judge(catalog, limits=Limits(timeout_s=10.0, max_rows=1000),
                  suites=TestSuites(tmp_path / "ts"))
    assert compute("spider_ex_single", task, single(NEAR_MISS), again, cfg).parts["lucky_match"] == 1.0
    assert len(list((tmp_path / "ts" / "servers").glob("*/*.loaded"))) == len(loaded)


def test_a_server_task_without_a_sqlite_copy_is_a_clear_error(server_co, tmp_path) -> None:
    dialect, _, url = server_co
    judge = Judge({"co": {dialect: url}}, suites=TestSuites(tmp_path / "ts"))
    task = Text2SQLTask(task_id="t", db_id="co", question="over 30?", gold_sql=GOLD, dialect=dialect)
    cfg = RewardConfig(test_suite=True, test_suite_dir=str(tmp_path / "ts"))
    with pytest.raises(ValueError, match="SQLite file it was loaded from"):
        compute("spider_ex_single", task, single(NEAR_MISS), judge, cfg)


def _server_databases(dialect: str, admin: str) -> set[str]:
    from tests.dialects.server_cases import mysql_admin_query, pg_admin_query

    if dialect == "postgresql":
        return {r[0] for r in pg_admin_query(admin, "SELECT datname FROM pg_database")}
    return {r[0] for r in mysql_admin_query(admin, "SHOW DATABASES")}


@pytest.mark.parametrize("dialect", [pytest.param("postgresql", marks=pytest.mark.postgres),
                                     pytest.param("mysql", marks=pytest.mark.mysql)])
def test_a_stage_leaves_no_variant_base_on_the_server_and_a_later_one_loads_them_again(dialect, request, tmp_path) -> None:
    """The stage's pre-step loads the variant bases its suites need; closing the stage's
    ``Runtime`` drops every one of them; a later stage reading the same suites back loads them
    again, and still catches the lucky match."""
    from types import SimpleNamespace as NS

    from curriculum.config import load_stage_config
    from jobs.runtime import Runtime

    admin = request.getfixturevalue("pg_admin_url" if dialect == "postgresql" else "mysql_admin_url")
    db = make_db(tmp_path / "co.sqlite")
    name = f"t_co_{uuid.uuid4().hex[:8]}"
    base = load_sqlite(str(db), admin, name, replace=True).session_url
    catalog = {"co": {"sqlite": f"sqlite:///{db.resolve()}", dialect: base}}
    suites = tmp_path / "run" / "test_suite"
    cfg = load_stage_config("jobs/configs/stage3.yaml", ["reward.test_suite=true", f"reward.test_suite_dir={suites}",
                                                         f"run_dir={tmp_path / 'run'}"])
    task = Text2SQLTask(task_id="t", db_id="co", question="over 30?", gold_sql=GOLD, dialect=dialect)
    try:
        before = {n for n in _server_databases(dialect, admin) if n.startswith("tsv_")}
        with Runtime(cfg, NS(catalog=catalog, schemas={})) as rt:
            report = rt.prebuild_suites([task])
            assert report.distilled == 1 and report.variants >= 1 and not report.failed
            loaded = {n for n in _server_databases(dialect, admin) if n.startswith("tsv_")} - before
            assert loaded  # the variants are bases on the server while the stage runs
        assert sorted(rt.dropped_variants) and set(rt.dropped_variants) >= loaded
        assert not loaded & _server_databases(dialect, admin)  # none left after the stage
        again = Judge(catalog, limits=Limits(timeout_s=10.0, max_rows=1000), suites=TestSuites(suites))
        cfg_r = RewardConfig(test_suite=True, test_suite_dir=str(suites))
        lucky = compute("spider_ex_single", task, single(NEAR_MISS), again, cfg_r)
        assert again.suites.distilled == 0  # read back, its bases loaded again
        assert lucky.parts["lucky_match"] == 1.0 and lucky.score == 0.0
    finally:
        drop_server_variants(admin, suites / "servers")
        provision.drop_database(admin, name)
    assert not {n for n in _server_databases(dialect, admin) if n.startswith("tsv_")} - before
