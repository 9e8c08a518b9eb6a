"""Test-suite execution match: database variants, distillation, the reward option, fail-closed
rules and the caches (sqlrl/synth/variants.py, sqlrl/suites/test_suite.py, the Judge's suites)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sqlrl.db import Limits
from sqlrl.eval.compare import spider_ex
from sqlrl.eval.spider import Outcome, QueryRunner, eval_limits
from sqlrl.suites.test_suite import SuiteCheck, TestSuites, distil, literals, neighbours
from sqlrl.rewards import Judge, RewardConfig, batch_means, compute
from sqlrl.synth import variants as V
from sqlrl.synth.domains import build_domain_db
from sqlrl.tasks.types import CriticTask, Text2SQLTask

SCHEMA = """
CREATE TABLE dept (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, budget REAL);
CREATE TABLE emp (id INTEGER PRIMARY KEY, name TEXT NOT NULL, age INTEGER, salary REAL,
                  dept_id INTEGER NOT NULL REFERENCES dept(id));
CREATE TABLE project (dept_id INTEGER NOT NULL, code TEXT NOT NULL, lead INTEGER REFERENCES emp(id),
                      PRIMARY KEY (dept_id, code), FOREIGN KEY (dept_id) REFERENCES dept(id));
CREATE INDEX emp_age ON emp(age);
CREATE VIEW old AS SELECT name FROM emp WHERE age > 50;
CREATE TABLE audit (emp_id INTEGER);
CREATE TRIGGER hired AFTER INSERT ON emp BEGIN INSERT INTO audit VALUES (new.id); END;
"""
GOLD = "SELECT name FROM emp WHERE age > 30"
NEAR_MISS = "SELECT name FROM emp WHERE age >= 30"  # same rows on the original: nobody is 30


def make_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    conn.executemany("INSERT INTO dept VALUES (?, ?, ?)",
                     [(1, "ops", 10.5), (2, "lab", None), (3, "hr", 3.0)])
    conn.executemany("INSERT INTO emp VALUES (?, ?, ?, ?, ?)",
                     [(i, f"e{i}", [22, 25, 41, 55, 28, 33][i % 6], 1000.0 + i, 1 + i % 3)
                      for i in range(1, 13)])
    conn.executemany("INSERT INTO project VALUES (?, ?, ?)", [(1, "a", 1), (1, "b", None), (2, "a", 4)])
    conn.execute("DELETE FROM audit")  # what the trigger wrote while emp was filled above
    conn.commit()
    conn.close()
    return path


@pytest.fixture()
def db(tmp_path) -> Path:
    return make_db(tmp_path / "co.sqlite")


def url(p: Path) -> str:
    return f"sqlite:///{p.resolve()}"


def master(p: Path) -> list[tuple]:
    with sqlite3.connect(p) as c:
        return c.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name").fetchall()


def column_types(p: Path) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    with sqlite3.connect(p) as c:
        for (t,) in c.execute("SELECT name FROM sqlite_master WHERE type='table'"):
            for col in [r[1] for r in c.execute(f"PRAGMA table_info({t})")]:
                out[(t, col)] = {r[0] for r in c.execute(f"SELECT DISTINCT typeof({col}) FROM {t}")}
    return out


# -- variants --------------------------------------------------------------------------------------

def test_fuzzed_variants_keep_schema_keys_foreign_keys_not_null_and_types(db, tmp_path) -> None:
    paths = V.build_variants(db, tmp_path / "cache", k=10)
    assert len(paths) == 10
    source_types = column_types(db)
    contents = set()
    for p in paths:
        assert master(p) == master(db)  # tables, index, view, trigger: the same statements
        with sqlite3.connect(p) as c:
            assert c.execute("PRAGMA foreign_key_check").fetchall() == []
            assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert c.execute("SELECT count(*) FROM emp WHERE name IS NULL OR dept_id IS NULL").fetchone() == (0,)
            assert c.execute("SELECT count(*) - count(DISTINCT name) FROM dept").fetchone() == (0,)
            assert c.execute("SELECT count(*) FROM (SELECT dept_id, code FROM project "
                             "GROUP BY 1, 2 HAVING count(*) > 1)").fetchone() == (0,)
            contents.add(tuple(c.execute("SELECT * FROM emp ORDER BY id").fetchall()))
            # empty in the source, so empty here: the trigger did not fire while emp was filled
            assert c.execute("SELECT count(*) FROM audit").fetchone() == (0,)
        for key, kinds in column_types(p).items():
            assert kinds - {"null"} <= source_types[key] - {"null"} or not kinds - {"null"}, key
    assert len(contents) > 5  # the profiles really differ


def test_profiles_make_nulls_duplicates_and_empty_tables(db, tmp_path) -> None:
    def fuzz(profile: str, seed: int) -> sqlite3.Connection:
        return sqlite3.connect(V.fuzz_sqlite(db, tmp_path / f"{profile}{seed}.sqlite", profile, seed))

    assert any(fuzz("nulls", s).execute("SELECT count(*) FROM emp WHERE age IS NULL").fetchone()[0]
               for s in range(3))
    c = fuzz("duplicates", 0)
    assert c.execute("SELECT count(DISTINCT age) FROM emp").fetchone()[0] <= 2 < c.execute(
        "SELECT count(*) FROM emp").fetchone()[0]
    emptied = set()
    for s in range(6):
        c = fuzz("empty", s)
        counts = {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("dept", "emp", "project")}
        emptied |= {t for t, n in counts.items() if n == 0}
        if counts["dept"] == 0:  # every table referencing an emptied one is empty too
            assert counts["emp"] == counts["project"] == 0
    assert emptied


def test_synthetic_domains_get_reseeded_builds_among_their_variants(tmp_path) -> None:
    src = Path(build_domain_db("library", str(tmp_path / "library.sqlite"), seed=0, scale=0.3))
    plan = V.variant_plan(6, domain="library")
    assert [s.kind for s in plan].count("reseed") == 2
    for p in V.build_variants(src, tmp_path / "cache", k=6, domain="library"):
        assert master(p) == master(src)
        with sqlite3.connect(p) as c:
            assert c.execute("PRAGMA foreign_key_check").fetchall() == []


def test_variants_are_built_once_and_cached_by_content(db, tmp_path) -> None:
    before = V.builds
    first = V.build_variants(db, tmp_path / "cache", k=3)
    again = V.build_variants(db, tmp_path / "cache", k=3)
    assert first == again and V.builds == before + 1
    with sqlite3.connect(db) as c:  # new contents: a new key, a new set
        c.execute("UPDATE emp SET age = 99 WHERE id = 1")
    assert V.build_variants(db, tmp_path / "cache", k=3) != first and V.builds == before + 2


def test_bad_database_files_get_clear_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        V.build_variants(tmp_path / "missing.sqlite", tmp_path / "cache")
    (tmp_path / "text.sqlite").write_text("hello")
    with pytest.raises(ValueError, match="not a SQLite database"):
        V.build_variants(tmp_path / "text.sqlite", tmp_path / "cache")
    with pytest.raises(ValueError, match="unknown variant profile"):
        V.fuzz_sqlite(tmp_path / "text.sqlite", tmp_path / "o.sqlite", "nope", 0)
    with pytest.raises(ValueError, match="SQLite file it was loaded from"):
        TestSuites(tmp_path).variants("x", "postgresql://u:secret@localhost/db")


# -- neighbours and distillation ------------------------------------------------------------------

def test_generic_neighbours_drop_predicates_flip_comparisons_toggle_distinct_and_limit() -> None:
    near = neighbours("SELECT name FROM emp WHERE age > 30 AND salary < 2000 ORDER BY name LIMIT 5")
    assert "SELECT name FROM emp WHERE salary < 2000 ORDER BY name LIMIT 5" in near
    assert "SELECT name FROM emp ORDER BY name LIMIT 5" in near
    assert "SELECT name FROM emp WHERE age >= 30 AND salary < 2000 ORDER BY name LIMIT 5" in near
    assert "SELECT DISTINCT name FROM emp WHERE age > 30 AND salary < 2000 ORDER BY name LIMIT 5" in near
    assert "SELECT name FROM emp WHERE age > 30 AND salary < 2000 ORDER BY name" in near
    assert "SELECT name FROM emp WHERE age > 30 AND salary < 2000 ORDER BY name LIMIT 6" in near
    assert neighbours("SELEC nonsense") == []
    assert set(literals("SELECT a FROM t WHERE b > 30 AND c = 'x' AND d < 1.5")) == {30, "x", 1.5}


def test_distillation_catches_a_near_miss_that_single_instance_ex_accepts(db, tmp_path) -> None:
    suites = TestSuites(tmp_path / "ts")
    with QueryRunner(eval_limits(5.0)) as runner:
        gold, near = runner.run(url(db), GOLD), runner.run(url(db), NEAR_MISS)
        assert spider_ex(near.rows, gold.rows, False)  # the lucky match
        suite = suites.suite("co", url(db), GOLD, runner.run)
        assert suite.variants and suite.caught_by_suite >= 1 and suite.neighbours >= suite.caught
        assert NEAR_MISS in neighbours(GOLD)
        same = lambda p, g: spider_ex(p, g, False)  # noqa: E731
        assert check_ok(suite, runner, GOLD, same) == (True, None)
        ok, where = check_ok(suite, runner, NEAR_MISS, same)
        assert not ok and where in suite.variants


def check_ok(suite, runner, sql, same):
    from sqlrl.suites.test_suite import check_suite

    return check_suite(suite, runner.run, sql).passes(same)


def test_a_variant_the_gold_fails_on_is_dropped_never_rewarding() -> None:
    rows = {"orig": ((1,),), "a": ((1,), (2,)), "b": ((3,),)}

    def run(u: str, sql: str) -> Outcome:
        if sql == "gold" and u == "b":
            return Outcome(error="gold broke here")
        if sql == "near" and u != "orig":
            return Outcome(rows=((9,),))
        return Outcome(rows=rows[u])

    suite = distil("orig", "gold", ["a", "b"], ["near"], run)
    assert suite.variants == ("a",) and suite.dropped == 1 and suite.caught_by_suite == 1
    same = lambda p, g: spider_ex(p, g, False)  # noqa: E731
    # at check time a variant whose gold fails counts neither way; the others still decide
    check = SuiteCheck((("b", Outcome(error="x"), Outcome(rows=((3,),))),
                        ("a", Outcome(rows=((1,),)), Outcome(rows=((1,),)))))
    assert check.passes(same) == (True, None) and check.dropped == 1
    check = SuiteCheck((("b", Outcome(error="x"), Outcome(rows=((3,),))),
                        ("a", Outcome(rows=((1,),)), Outcome(error="pred broke"))))
    assert check.passes(same) == (False, "a")


def test_a_gold_that_errors_on_the_original_is_a_clear_error(db, tmp_path) -> None:
    with QueryRunner(eval_limits(5.0)) as runner:
        with pytest.raises(ValueError, match="gold query fails on the original"):
            distil(url(db), "SELECT nope FROM emp", [], [], runner.run)
        with pytest.raises(FileNotFoundError):
            TestSuites(tmp_path / "ts").suite("x", url(tmp_path / "missing.sqlite"), GOLD, runner.run)


def test_suites_are_distilled_once_and_read_back_from_the_run_dir(db, tmp_path) -> None:
    with QueryRunner(eval_limits(5.0)) as runner:
        first = TestSuites(tmp_path / "ts")
        a = first.suite("co", url(db), GOLD, runner.run)
        assert first.suite("co", url(db), GOLD, runner.run) is a and first.distilled == 1
        second = TestSuites(tmp_path / "ts")  # another process, same run dir
        assert second.suite("co", url(db), GOLD, runner.run) == a and second.distilled == 0


# -- the reward option ------------------------------------------------------------------------------

def single(sql: str) -> str:
    return f"<thought>t</thought>\n<solution>{sql}</solution>"


@pytest.fixture()
def suite_judge(db, tmp_path):
    return Judge({"co": {"sqlite": url(db)}}, limits=Limits(timeout_s=5.0, max_rows=1000),
                 suites=TestSuites(tmp_path / "ts"))


def task(gold: str = GOLD) -> Text2SQLTask:
    return Text2SQLTask(task_id="t", db_id="co", question="who is over 30?", gold_sql=gold)


def test_the_suite_reward_gives_a_lucky_match_no_result_credit(suite_judge, tmp_path) -> None:
    cfg = RewardConfig(test_suite=True, test_suite_dir=str(tmp_path / "ts"))
    for name in ("spider_ex_single", "bird_ex_single", "hybrid_single", "sqlr1"):
        response = single(NEAR_MISS) if name != "sqlr1" else \
            f"<think>t</think><answer>```sql\n{NEAR_MISS}\n```</answer>"
        plain = compute(name, task(), response, suite_judge)
        lucky = compute(name, task(), response, suite_judge, cfg)
        assert plain.parts["result"] > 0 and "lucky_match" not in plain.parts, name
        assert lucky.parts["lucky_match"] == 1.0 and lucky.parts["result"] <= 0, name
        assert lucky.score < plain.score and lucky.reason.startswith("lucky-match"), name
        assert not lucky.excluded
    right = compute("spider_ex_single", task(), single("SELECT name FROM emp WHERE 30 < age"),
                    suite_judge, cfg)
    assert right.score == 1.0 and right.parts["lucky_match"] == 0.0
    wrong = compute("spider_ex_single", task(), single("SELECT name FROM emp"), suite_judge, cfg)
    assert wrong.score == 0.0 and wrong.parts["lucky_match"] == 0.0 and wrong.reason == "wrong-result"
    means = batch_means([right, wrong, compute("spider_ex_single", task(), single(NEAR_MISS),
                                               suite_judge, cfg)])
    assert means["lucky_match"] == pytest.approx(1 / 3)


def test_the_suite_reward_stays_fail_closed(suite_judge, tmp_path) -> None:
    cfg = RewardConfig(test_suite=True, test_suite_dir=str(tmp_path / "ts"))
    broken = compute("spider_ex_single", task("SELECT nope FROM emp"), single(GOLD), suite_judge, cfg)
    assert broken.excluded and broken.score == 0.0 and broken.reason.startswith("gold-error")
    error = compute("spider_ex_single", task(), single("SELECT nope"), suite_judge, cfg)
    assert error.score == 0.0 and error.parts == {"format": 1.0, "executed": 0.0, "result": 0.0,
                                                  "lucky_match": 0.0}
    # a debugging task under a hybrid reward: the part is there, and 0
    critic = CriticTask(instance_id="c", db_id="co", query="fix", issue_sql=["SELECT 1"],
                        sol_sql=["SELECT 1"])
    b = compute("hybrid_single", critic, single("SELECT 1"), suite_judge, cfg)
    assert b.parts["lucky_match"] == 0.0 and b.parts["is_critic"] == 1.0


def test_the_option_is_a_clear_configuration_error_when_half_set(db, tmp_path) -> None:
    with pytest.raises(ValueError, match="test_suite_dir"):
        RewardConfig(test_suite=True)
    plain_judge = Judge({"co": {"sqlite": url(db)}})
    cfg = RewardConfig(test_suite=True, test_suite_dir=str(tmp_path))
    with pytest.raises(ValueError, match="no test suites"):
        compute("spider_ex_single", task(), single(GOLD), plain_judge, cfg)
    assert compute("spider_ex_single", task(), single(NEAR_MISS), plain_judge).score == 1.0  # default: EX


def test_reward_actors_build_their_judge_with_suites_when_the_option_is_on(db, tmp_path) -> None:
    from actors.reward import RewardGroup, RewardGroupConfig, RewardRequest

    cfg = RewardConfig(test_suite=True, test_suite_dir=str(tmp_path / "run" / "test_suite"))
    group = RewardGroup({"co": {"sqlite": url(db)}}, RewardGroupConfig(in_process=True, reward=cfg))
    try:
        lucky, right = group.score([RewardRequest("spider_ex_single", task(), single(NEAR_MISS)),
                                    RewardRequest("spider_ex_single", task(), single(GOLD))])
    finally:
        group.shutdown()
    assert lucky.parts["lucky_match"] == 1.0 and lucky.score == 0.0
    assert right.parts["lucky_match"] == 0.0 and right.score == 1.0
    assert list((tmp_path / "run" / "test_suite" / "suites").glob("*.json"))  # cached in the run dir


class _Recording:
    """A session source that records each ``open_many`` and can refuse the variants' sessions."""

    def __init__(self, refuse: str | None = None) -> None:
        from sqlrl.db.source import LocalSessions

        self.inner, self.refuse, self.batches = LocalSessions(), refuse, []

    def open_many(self, requests):
        self.batches.append([r.db for r in requests])
        if self.refuse and any(self.refuse in r.db for r in requests):
            raise RuntimeError("lease refused")
        return self.inner.open_many(requests)

    def close_many(self, sessions) -> None:
        self.inner.close_many(sessions)


class _FixedSuites:
    def __init__(self, suite) -> None:
        self.fixed = suite

    def suite(self, *args, **kwargs):
        return self.fixed


def _two_variant_suite(db, tmp_path):
    from sqlrl.suites.test_suite import Suite

    paths = [V.fuzz_sqlite(db, tmp_path / f"v{i}.sqlite", "resample", i) for i in range(2)]
    return Suite(url(db), GOLD, tuple(url(p) for p in paths), 1, 0, 1, 0, 2, 0)


def test_a_predictions_variant_sessions_open_in_one_batch(db, tmp_path) -> None:
    source = _Recording()
    suite = _two_variant_suite(db, tmp_path)
    judge = Judge({"co": {"sqlite": url(db)}}, sessions=source, suites=_FixedSuites(suite))
    verdict = judge.text2sql(task(), GOLD)
    assert verdict.suite_checked and verdict.spider_suite
    assert list(suite.variants) in source.batches  # both variants in one open_many


def test_a_lost_variant_session_excludes_the_sample_never_a_lucky_match(db, tmp_path) -> None:
    suite = _two_variant_suite(db, tmp_path)
    judge = Judge({"co": {"sqlite": url(db)}}, sessions=_Recording(refuse="/v0.sqlite"),
                  suites=_FixedSuites(suite))
    cfg = RewardConfig(test_suite=True, test_suite_dir=str(tmp_path))
    b = compute("spider_ex_single", task(), single(GOLD), judge, cfg)
    assert b.excluded and b.score == 0.0 and b.parts["lucky_match"] == 0.0
    assert "test suite unavailable" in b.reason


def test_the_evaluate_job_reports_test_suite_accuracy_beside_ex(tmp_path) -> None:
    from jobs.evaluate import main

    (tmp_path / "db" / "co").mkdir(parents=True)
    make_db(tmp_path / "db" / "co" / "co.sqlite")
    (tmp_path / "g.sql").write_text(f"{GOLD}\tco\n{GOLD}\tco\n{GOLD}\tco\n")
    (tmp_path / "p.sql").write_text(f"{NEAR_MISS}\n{GOLD}\nSELECT name FROM emp\n")
    out = tmp_path / "out"
    assert main(["spider", "--gold", str(tmp_path / "g.sql"), "--pred", str(tmp_path / "p.sql"),
                 "--db", str(tmp_path / "db"), "--out", str(out), "--test-suite",
                 "--processes", "1"]) == 0
    import json

    report = json.loads((out / "report.json").read_text())
    assert report["matched"] == 2 and report["test_suite"] == {"ts": 1 / 3, "matched": 1, "lucky": 1}
    assert "| test-suite | 3 | 1 | 33.33 |" in (out / "report.md").read_text()
    assert list((out / "test_suite" / "suites").glob("*.json"))
    # without the flag: EX only, nothing built
    assert main(["spider", "--gold", str(tmp_path / "g.sql"), "--pred", str(tmp_path / "p.sql"),
                 "--db", str(tmp_path / "db"), "--out", str(tmp_path / "plain"),
                 "--processes", "1"]) == 0
    assert "test_suite" not in json.loads((tmp_path / "plain" / "report.json").read_text())
    assert not (tmp_path / "plain" / "test_suite").exists()


def test_a_gold_failing_during_distillation_excludes_the_sample(db, tmp_path) -> None:
    from sqlrl.suites.test_suite import GoldFailed

    class Failing:
        def suite(self, *args, **kwargs):
            raise GoldFailed("the gold query fails on the original database: timeout")

    judge = Judge({"co": {"sqlite": url(db)}}, suites=Failing())
    cfg = RewardConfig(test_suite=True, test_suite_dir=str(tmp_path))
    b = compute("spider_ex_single", task(), single(NEAR_MISS), judge, cfg)
    assert b.excluded and b.score == 0.0 and "test suite unavailable" in b.reason
    assert b.parts["lucky_match"] == 0.0
