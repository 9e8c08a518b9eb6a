"""Test-suite match on Spider's own databases: fuzzed variants keep each schema, every dev gold
passes its own suite (no false negative for a correct query), and the evaluate job reports
test-suite accuracy beside EX with the lucky matches (skips when ../shared/data is absent)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from jobs.evaluate import main
from sqlrl.eval.compare import spider_prepare
from sqlrl.eval.spider import QueryRunner, eval_limits
from sqlrl.suites.test_suite import TestSuites, check_suite
from sqlrl.eval.compare import spider_ex, spider_order_matters
from sqlrl.synth.variants import build_variants

DBS = ("concert_singer", "pets_1", "car_1", "world_1", "flight_2")


def _master(p: Path) -> list[tuple]:
    with sqlite3.connect(p) as c:
        return c.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def _fk_problems(p: Path) -> list | str:
    with sqlite3.connect(p) as c:
        try:
            return c.execute("PRAGMA foreign_key_check").fetchall()
        except sqlite3.DatabaseError as exc:  # a declared FK whose parent key is not unique
            return f"error: {exc}"


@pytest.mark.parametrize("db_id", DBS)
def test_variants_of_spider_databases_keep_the_schema_and_the_keys(spider_dir, tmp_path, db_id) -> None:
    src = spider_dir / "database" / db_id / f"{db_id}.sqlite"
    source_fk = _fk_problems(src)
    for p in build_variants(src, tmp_path, k=5):
        assert _master(p) == _master(src)
        with sqlite3.connect(p) as c:
            assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        problems = _fk_problems(p)
        assert problems == [] or problems == source_fk, (p, problems)


def test_every_dev_gold_of_two_databases_passes_its_own_suite(spider_dir, tmp_path) -> None:
    dev = [q for q in json.loads((spider_dir / "dev.json").read_text())
           if q["db_id"] in ("concert_singer", "pets_1")]
    suites = TestSuites(tmp_path)
    caught = made = 0
    with QueryRunner(eval_limits(30.0)) as runner:
        for q in dev:
            url = f"sqlite:///{(spider_dir / 'database' / q['db_id'] / (q['db_id'] + '.sqlite')).resolve()}"
            gold = spider_prepare(q["query"])
            suite = suites.suite(q["db_id"], url, gold, runner.run)
            order = spider_order_matters(q["query"])
            assert check_suite(suite, runner.run, gold).passes(
                lambda p, g: spider_ex(p, g, order)) == (True, None), q["query"]
            caught, made = caught + suite.caught, made + suite.neighbours
    assert made > 0 and caught / made > 0.5


def test_the_evaluate_job_reports_test_suite_accuracy_and_lucky_matches(spider_dir, tmp_path) -> None:
    labels = spider_dir.parent / "spider_dev_predictions" / "exec_labels_official_testsuite.jsonl"
    if not labels.is_file():
        pytest.skip(f"official Spider labels not found at {labels}")
    gold = "select max(mpg) from cars_data where cylinders  =  8 or year  <  1980"
    lucky = "SELECT MAX(mpg) FROM cars_data WHERE cylinders = 8 AND year < 1980"  # EX-correct on dev
    (tmp_path / "g.sql").write_text(f"{gold}\tcar_1\n{gold}\tcar_1\n")
    (tmp_path / "p.sql").write_text(f"{lucky}\n{gold}\n")
    assert main(["spider", "--gold", str(tmp_path / "g.sql"), "--pred", str(tmp_path / "p.sql"),
                 "--db", str(spider_dir / "database"), "--out", str(tmp_path / "o"),
                 "--test-suite", "--processes", "1"]) == 0
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["ex"] == 1.0 and report["test_suite"] == {"ts": 0.5, "matched": 1, "lucky": 1}
    verdicts = [json.loads(l) for l in (tmp_path / "o" / "verdicts.jsonl").read_text().splitlines()]
    assert [v["suite_match"] for v in verdicts] == [False, True]
    assert "lucky matches): 1" in (tmp_path / "o" / "report.md").read_text()
    assert (tmp_path / "o" / "test_suite" / "suites").is_dir()  # cached in the run's folder
