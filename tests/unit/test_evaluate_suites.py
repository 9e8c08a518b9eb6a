"""``python -m jobs.evaluate bird|critic --test-suite`` on tiny datasets built here in BIRD's and
BIRD-CRITIC's layouts: test-suite accuracy beside EX/SR, the lucky matches it catches, the
benchmark's own comparator on every variant, the refusals, and bad input (sqlrl.suites.evaluation)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from jobs.evaluate import main
from sqlrl.eval.spider import Outcome
from sqlrl.suites.evaluation import BIRD_COMPARISON, critic_comparison, critic_program
from sqlrl.suites.neighbours import join_program, literals, neighbours
from sqlrl.suites.test_suite import TestSuites, distil, spider_comparison
from sqlrl.tasks.io import write_tasks
from sqlrl.tasks.types import CriticTask

GOLD = "SELECT id, name FROM emp WHERE age > 30"
LUCKY = "SELECT id, name FROM emp WHERE age >= 30"  # the same rows here: nobody is 30
WRONG = "SELECT id, name FROM emp WHERE age < 30"
# correct, and returns every row twice: equal as sets (BIRD's EX), never as bags (Spider's)
DOUBLED = f"{GOLD} UNION ALL {GOLD}"


def make_db(root: Path, db_id: str = "hr") -> Path:
    """``<root>/<db_id>/<db_id>.sqlite``, BIRD's layout."""
    path = root / db_id / f"{db_id}.sqlite"
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE dept (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
        CREATE TABLE emp (id INTEGER PRIMARY KEY, name TEXT NOT NULL, age INTEGER,
                          dept_id INTEGER NOT NULL REFERENCES dept(id));""")
    conn.executemany("INSERT INTO dept VALUES (?, ?)", [(1, "ops"), (2, "lab")])
    conn.executemany("INSERT INTO emp VALUES (?, ?, ?, ?)",
                     [(i, f"e{i}", [22, 25, 41, 55, 28, 33][i % 6], 1 + i % 2) for i in range(1, 41)])
    conn.commit()
    conn.close()
    return path


def write_bird(tmp: Path, preds: list[str], db_id: str = "hr") -> list[str]:
    """Predictions JSON, gold SQL and questions in the official mini-dev formats; the job's
    arguments for them."""
    (tmp / "pred.json").write_text(json.dumps(
        {str(i): f"{p}\t----- bird -----\t{db_id}" for i, p in enumerate(preds)}))
    (tmp / "gold.sql").write_text("".join(f"{GOLD}\t{db_id}\n" for _ in preds))
    (tmp / "q.json").write_text(json.dumps(
        [{"question_id": i, "db_id": db_id, "difficulty": "simple"} for i in range(len(preds))]))
    return ["bird", "--pred", str(tmp / "pred.json"), "--gold", str(tmp / "gold.sql"),
            "--db-root", str(tmp / "dbs"), "--questions", str(tmp / "q.json")]


def lines(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines()]


# -- BIRD ------------------------------------------------------------------------------------------

def test_bird_test_suite_catches_the_lucky_match_with_birds_set_comparison(tmp_path) -> None:
    make_db(tmp_path / "dbs")
    args = write_bird(tmp_path, [LUCKY, DOUBLED, WRONG])
    out = tmp_path / "out"
    assert main([*args, "--out", str(out), "--test-suite"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["overall"] == {"count": 3, "scored": 3, "matched": 2, "ex": pytest.approx(2 / 3)}
    assert report["test_suite"] == {"ts": pytest.approx(1 / 3), "matched": 1, "lucky": 1}
    verdicts = lines(out / "verdicts.jsonl")
    assert [v["match"] for v in verdicts] == [True, True, False]
    assert [v["suite_match"] for v in verdicts] == [False, True, False]
    assert verdicts[0]["suite_failed_on"].startswith("sqlite:///")  # the variant it missed
    assert verdicts[1]["suite_failed_on"] is None  # duplicates are no miss under set equality
    md = (out / "report.md").read_text()
    assert "| test-suite | 3 | 1 | 33.33 |" in md and "(lucky matches): 1" in md
    assert list((out / "test_suite" / "suites").glob("*.json"))  # cached in the run's folder

    again = tmp_path / "again"  # a second run on the same folder reads the suite back
    assert main([*args, "--out", str(again), "--test-suite", "--suite-dir",
                 str(out / "test_suite")]) == 0
    assert json.loads((again / "report.json").read_text())["test_suite"] == report["test_suite"]


def test_an_unreadable_cached_suite_is_a_clear_error_not_a_pass(tmp_path, capsys) -> None:
    make_db(tmp_path / "dbs")
    args = write_bird(tmp_path, [LUCKY])
    suites = tmp_path / "suites"
    assert main([*args, "--out", str(tmp_path / "a"), "--test-suite", "--suite-dir", str(suites)]) == 0
    [cached] = (suites / "suites").glob("*.json")
    cached.write_text("{truncated")
    assert main([*args, "--out", str(tmp_path / "b"), "--test-suite", "--suite-dir", str(suites)]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "unreadable cached test suite" in err and cached.name in err and "Traceback" not in err
    assert not (tmp_path / "b" / "report.json").exists()


def test_bird_without_test_suite_reports_no_suite_fields(tmp_path) -> None:
    make_db(tmp_path / "dbs")
    out = tmp_path / "out"
    assert main([*write_bird(tmp_path, [LUCKY]), "--out", str(out)]) == 0
    assert "test_suite" not in json.loads((out / "report.json").read_text())
    assert lines(out / "verdicts.jsonl")[0]["suite_match"] is None
    assert not (out / "test_suite").exists()


def test_bird_test_suite_names_a_missing_database_before_running(tmp_path, capsys) -> None:
    (tmp_path / "dbs").mkdir()
    out = tmp_path / "out"
    assert main([*write_bird(tmp_path, [GOLD], db_id="absent"), "--out", str(out),
                 "--test-suite"]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "database file(s) not found" in err and "absent.sqlite" in err
    assert "Traceback" not in err and not (out / "report.json").exists()


@pytest.mark.parametrize("kind", ["bird", "critic"])
def test_a_suite_dir_that_is_not_a_folder_is_a_clear_error(tmp_path, capsys, kind) -> None:
    make_db(tmp_path / "dbs")
    (tmp_path / "blocker").write_text("a file where the suite folder should be")
    if kind == "bird":
        args = write_bird(tmp_path, [GOLD])
    else:
        write_tasks(tmp_path / "tasks.jsonl", [critic_task("c0")])
        (tmp_path / "pred.jsonl").write_text("")
        args = ["critic", "--tasks", str(tmp_path / "tasks.jsonl"), "--pred",
                str(tmp_path / "pred.jsonl"), "--db-root", str(tmp_path / "dbs")]
    assert main([*args, "--out", str(tmp_path / "out"), "--test-suite",
                 "--suite-dir", str(tmp_path / "blocker")]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "blocker exists and is not a directory" in err
    assert main([*args, "--out", str(tmp_path / "out"), "--test-suite",
                 "--suite-dir", str(tmp_path / "blocker" / "inner")]) == 2
    assert "cannot create the test-suite folder" in capsys.readouterr().err.replace("\n", "")
    assert not (tmp_path / "out" / "report.json").exists()


def test_bird_test_suite_refuses_databases_that_are_not_sqlite_files() -> None:
    from sqlrl.suites.evaluation import BirdSuiteCheck

    with pytest.raises(ValueError, match="not SQLite files"):
        BirdSuiteCheck("unused").refuse(["sqlite:////x/a/a.sqlite",
                                         "postgresql://u:secret@127.0.0.1:5432/a"])


# -- BIRD-CRITIC -----------------------------------------------------------------------------------

def critic_task(instance_id: str, **kw) -> CriticTask:
    """A default-test-case instance whose reference reads a cutoff its preprocess_sql sets."""
    base = dict(instance_id=instance_id, db_id="hr", query="who is older than the cutoff?",
                issue_sql=["SELECT id, name FROM emp WHERE age < (SELECT v FROM cutoff)"],
                preprocess_sql=["CREATE TEMP TABLE cutoff AS SELECT 30 AS v"],
                sol_sql=["SELECT id, name FROM emp WHERE age > (SELECT v FROM cutoff)"])
    return CriticTask(**{**base, **kw})


def test_critic_test_suite_catches_the_lucky_fix(tmp_path) -> None:
    make_db(tmp_path / "dbs")
    preds = {"lucky": "SELECT id, name FROM emp WHERE age >= (SELECT v FROM cutoff)",
             # correct; DISTINCT and ROUND are stripped by the default test case, as EX strips them
             "right": "SELECT DISTINCT id, name FROM emp WHERE ROUND(age, 0) > (SELECT v FROM cutoff)",
             "wrong": "SELECT id, name FROM emp WHERE age <= (SELECT v FROM cutoff)"}
    write_tasks(tmp_path / "tasks.jsonl", [critic_task(k) for k in preds])
    (tmp_path / "pred.jsonl").write_text("".join(
        json.dumps({"instance_id": k, "pred_sqls": [sql]}) + "\n" for k, sql in preds.items()))
    out = tmp_path / "out"
    assert main(["critic", "--tasks", str(tmp_path / "tasks.jsonl"), "--pred",
                 str(tmp_path / "pred.jsonl"), "--db-root", str(tmp_path / "dbs"),
                 "--out", str(out), "--test-suite"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert (report["scored"], report["solved"]) == (3, 2)
    assert report["test_suite"] == {"ts": pytest.approx(1 / 3), "matched": 1, "lucky": 1}
    verdicts = {v["instance_id"]: v for v in lines(out / "verdicts.jsonl")}
    assert [verdicts[k]["solved"] for k in preds] == [True, True, False]
    assert [verdicts[k]["suite_match"] for k in preds] == [False, True, False]
    assert verdicts["lucky"]["suite_failed_on"].startswith("sqlite:///")  # the variant it missed
    md = (out / "report.md").read_text()
    assert "| test-suite | 3 | 1 | 33.33 |" in md and "(lucky matches): 1" in md


def test_critic_test_suite_refuses_custom_test_cases_and_servers_before_any_work(tmp_path, capsys) -> None:
    make_db(tmp_path / "dbs")
    tasks = [critic_task("plain"),
             critic_task("custom", test_cases=["def test_case(pred_sqls, sol_sqls, db_path, conn, "
                                               "conditions):\n    assert True\n"]),
             critic_task("server", dialect="postgresql")]
    write_tasks(tmp_path / "tasks.jsonl", tasks)
    (tmp_path / "pred.jsonl").write_text(json.dumps({"instance_id": "plain", "pred_sqls": [GOLD]}) + "\n")
    out = tmp_path / "out"
    assert main(["critic", "--tasks", str(tmp_path / "tasks.jsonl"), "--pred",
                 str(tmp_path / "pred.jsonl"), "--db-root", str(tmp_path / "dbs"),
                 "--out", str(out), "--test-suite"]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "--test-suite refused" in err and "custom test_cases (e.g. custom)" in err
    assert "server dialect (e.g. server)" in err and "Traceback" not in err
    assert not (out / "report.json").exists()
    # the same instances are scored without --test-suite (the refusal is the suite's alone)
    write_tasks(tmp_path / "plain.jsonl", tasks[:1])
    assert main(["critic", "--tasks", str(tmp_path / "plain.jsonl"), "--pred",
                 str(tmp_path / "pred.jsonl"), "--db-root", str(tmp_path / "dbs"),
                 "--out", str(out)]) == 0


def test_critic_test_suite_names_a_missing_database(tmp_path, capsys) -> None:
    (tmp_path / "dbs").mkdir()
    write_tasks(tmp_path / "tasks.jsonl", [critic_task("c0", db_id="absent")])
    (tmp_path / "pred.jsonl").write_text(json.dumps({"instance_id": "c0", "pred_sqls": [GOLD]}) + "\n")
    assert main(["critic", "--tasks", str(tmp_path / "tasks.jsonl"), "--pred",
                 str(tmp_path / "pred.jsonl"), "--db-root", str(tmp_path / "dbs"),
                 "--out", str(tmp_path / "out"), "--test-suite"]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "no database for 'absent'" in err and "Traceback" not in err


# -- the pieces --------------------------------------------------------------------------------------

def test_a_programs_neighbours_keep_its_earlier_statements() -> None:
    program = join_program(["CREATE TEMP TABLE cutoff AS SELECT 30 AS v;", f"{GOLD};"])
    near = neighbours(program)
    assert near and all(n.startswith("CREATE TEMP TABLE cutoff AS SELECT 30 AS v\n;\n") for n in near)
    assert program not in near and f"CREATE TEMP TABLE cutoff AS SELECT 30 AS v\n;\n{LUCKY}" in near
    assert literals(program) == (30,)  # every statement's constants, deduplicated


def test_critic_program_runs_preprocess_then_the_stripped_statements() -> None:
    task = critic_task("c0")
    assert critic_program(task, ["SELECT DISTINCT ROUND(age, 2) FROM emp -- note", "  "]) == \
        "CREATE TEMP TABLE cutoff AS SELECT 30 AS v\n;\nSELECT (age) FROM emp"


def test_distillation_and_the_check_use_the_comparison_given() -> None:
    """BIRD's set equality sees no difference in duplicates, Spider's bags do; BIRD-CRITIC's default
    test case never matches an empty result, so a variant where the gold is empty is dropped."""
    rows = {("orig", "gold"): [(1,)], ("orig", "near"): [(1,), (1,)],
            ("v", "gold"): [(1,), (2,)], ("v", "near"): [(1,), (1,), (2,)],
            ("empty", "gold"): [], ("empty", "near"): [(3,)]}
    run = lambda u, s: Outcome(rows=tuple(rows[(u, s)]))  # noqa: E731
    spider = distil("orig", "gold", ["v"], ["near"], run, compare=spider_comparison("gold"))
    assert (spider.caught_by_original, spider.uncaught) == (1, 0)  # a bag differs at once
    bird = distil("orig", "gold", ["v", "empty"], ["near"], run, compare=BIRD_COMPARISON)
    assert (bird.caught_by_original, bird.caught_by_suite, bird.variants) == (0, 1, ("empty",))
    critic = distil("orig", "gold", ["v", "empty"], ["near"], run, compare=critic_comparison(False))
    assert (critic.dropped, critic.uncaught, critic.variants) == (1, 1, ())


def test_suites_of_one_gold_under_two_comparisons_are_cached_apart(tmp_path) -> None:
    from sqlrl.eval.spider import QueryRunner, eval_limits

    db = make_db(tmp_path / "dbs")
    url = f"sqlite:///{db.resolve()}"
    suites = TestSuites(tmp_path / "ts")
    with QueryRunner(eval_limits(30.0)) as runner:
        suites.suite("hr", url, GOLD, runner.run, compare=BIRD_COMPARISON)
        suites.suite("hr", url, GOLD, runner.run)  # spider_comparison
        assert suites.distilled == 2 and len(list((tmp_path / "ts" / "suites").glob("*.json"))) == 2
        fresh = TestSuites(tmp_path / "ts")
        fresh.suite("hr", url, GOLD, runner.run, compare=BIRD_COMPARISON)
        assert fresh.distilled == 0
