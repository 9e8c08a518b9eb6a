"""The Spider and BIRD evaluators on their official input formats, with small stand-in databases."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from sqlrl.eval.bird import (database_url, evaluate_bird, label_bird, parse_bird_pred,
                             read_bird_difficulty, read_bird_pred, statement_rule)
from sqlrl.eval.spider import evaluate_spider
from tests.conftest import SHARED_DATA

SEP = "\t----- bird -----\t"


def make_db(path: Path, script: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(script)
    conn.commit()
    conn.close()


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dbs")
    make_db(root / "shop" / "shop.sqlite", """
        CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT, price REAL, kind TEXT);
        INSERT INTO item VALUES (1, 'pen', 1.5, 'office'), (2, 'ink', 7.0, 'office'),
                                (3, 'cup', 4.0, 'home'), (4, 'mug', 4.0, 'home');""")
    make_db(root / "zoo" / "zoo.sqlite", """
        CREATE TABLE animal(name TEXT, legs INTEGER);
        INSERT INTO animal VALUES ('ant', 6), ('cat', 4), ('dog', 4), ('emu', 2);""")
    return root


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- Spider -----------------------------------------------------------------------------------------


def test_evaluate_spider_official_files(dbs, tmp_path, capsys):
    gold = write(tmp_path / "gold.sql", "\n".join([
        "SELECT count(*) FROM item\tshop",
        "SELECT count(*) FROM item\tshop",
        "SELECT name FROM animal ORDER BY legs DESC, name\tzoo",
        "SELECT nope FROM animal\tzoo",                       # a broken gold
        "SELECT DISTINCT kind FROM item\tshop",
    ]) + "\n")
    pred = write(tmp_path / "pred.txt", "\n".join([
        "SELECT count(*) FROM item",
        "SELECT count(*) FROM item WHERE price < value\tshop",  # cut at TAB, value -> 1
        "SELECT name FROM animal ORDER BY legs, name",          # wrong order
        "SELECT 1",
        "SELECT kind FROM item",                                # DISTINCT stripped from gold
    ]) + "\n")
    report = evaluate_spider(gold, pred, dbs, workers=2, progress=True)
    assert [v.match for v in report.items] == [True, False, False, False, True]
    assert report.items[1].pred == "SELECT count(*) FROM item WHERE price < value\tshop"
    assert report.items[1].pred_error is None  # it ran: 0 rows cost less than 1, not 4
    assert report.gold_errors == (3,) and "no such column" in report.items[3].gold_error
    assert (report.matched, report.scored) == (2, 4) and report.ex == 0.5
    assert report.items[2].order_matters and not report.items[0].order_matters
    # each distinct query ran once: 4 distinct golds + 4 predictions (the broken gold's is not
    # run), less prediction 0, which is the same query on the same database as its gold
    assert report.queries_executed == 7
    json.dumps(report.to_dict())
    assert "spider gold: 4/4" in capsys.readouterr().err


def test_evaluate_spider_line_count_mismatch(dbs, tmp_path):
    gold = write(tmp_path / "gold.sql", "SELECT 1\tshop\nSELECT 2\tshop\n")
    pred = write(tmp_path / "pred.txt", "SELECT 1\n")
    with pytest.raises(ValueError, match="1 predictions but .* 2 gold"):
        evaluate_spider(gold, pred, dbs, progress=False)


@pytest.mark.parametrize("line", ["SELECT 1", "SELECT 1\tshop\textra", "\tshop"])
def test_evaluate_spider_bad_gold_line(dbs, tmp_path, line):
    gold = write(tmp_path / "gold.sql", f"SELECT 1\tshop\n{line}\n")
    pred = write(tmp_path / "pred.txt", "SELECT 1\nSELECT 1\n")
    with pytest.raises(ValueError, match=r"gold.sql:2: a gold line must be"):
        evaluate_spider(gold, pred, dbs, progress=False)


def test_evaluate_spider_missing_database_folder(tmp_path):
    gold = write(tmp_path / "gold.sql", "SELECT 1\tshop\n")
    pred = write(tmp_path / "pred.txt", "SELECT 1\n")
    with pytest.raises(FileNotFoundError, match="Spider database folder not found"):
        evaluate_spider(gold, pred, tmp_path / "absent", progress=False)


def test_evaluate_spider_all_golds_broken_gives_zero_not_a_crash(dbs, tmp_path):
    gold = write(tmp_path / "gold.sql", "SELECT 1\tnowhere\n")
    pred = write(tmp_path / "pred.txt", "SELECT 1\n")
    report = evaluate_spider(gold, pred, dbs, progress=False)
    assert report.scored == 0 and report.ex == 0.0 and report.gold_errors == (0,)


# -- BIRD -------------------------------------------------------------------------------------------


def test_parse_bird_pred_follows_package_sqls():
    assert parse_bird_pred(f"SELECT 1{SEP}shop") == "SELECT 1"
    assert parse_bird_pred("  SELECT 1  ") == "SELECT 1"  # no separator: the stripped string
    assert parse_bird_pred(f"SELECT 1{SEP}a{SEP}b") == f"SELECT 1{SEP}a{SEP}b".strip()
    assert parse_bird_pred(None) is None and parse_bird_pred(3) is None


def bird_files(tmp_path: Path, preds: dict, gold_lines: list[str], difficulties: list[str]):
    p = write(tmp_path / "pred.json", json.dumps(preds))
    g = write(tmp_path / "gold.sql", "\n".join(gold_lines) + "\n")
    q = write(tmp_path / "questions.json", json.dumps([{"difficulty": d} for d in difficulties]))
    return p, g, q


def test_evaluate_bird_official_files(dbs, tmp_path):
    gold = ["SELECT name FROM item WHERE kind = 'home'\tshop",
            "SELECT name, legs FROM animal\tzoo",
            "SELECT name, legs FROM animal\tzoo",
            "SELECT legs FROM animal\tzoo",
            "SELECT nope FROM item\tshop",
            "SELECT count(*) FROM item\tshop"]
    preds = {
        "0": f"SELECT name FROM item WHERE price = 4.0 ORDER BY name DESC{SEP}shop",  # set equal
        "1": f"SELECT legs, name FROM animal{SEP}zoo",  # column order matters in BIRD
        "2": f"SELECT name, legs FROM animal UNION ALL SELECT name, legs FROM animal{SEP}zoo",
        "3": f"SELECT legs FROM animal; SELECT 1{SEP}zoo",  # two statements: an error on SQLite
        "4": f"SELECT 1{SEP}shop",
        "5": None,
    }
    p, g, q = bird_files(tmp_path, preds, gold,
                         ["simple", "moderate", "moderate", "challenging", "simple", "challenging"])
    report = evaluate_bird(p, g, dbs, questions_path=q, workers=2, progress=False)
    assert [v.match for v in report.items] == [True, False, True, False, False, False]
    assert "one statement at a time" in report.items[3].pred_error
    assert report.items[5].pred_error == "the prediction is not a string"
    assert report.gold_errors == (4,)
    assert (report.overall.matched, report.overall.scored, report.overall.count) == (2, 5, 6)
    assert list(report.by_difficulty) == ["simple", "moderate", "challenging"]
    assert report.by_difficulty["simple"].ex == 1.0  # 1 of 1 scored (its broken gold excluded)
    assert report.by_difficulty["moderate"].ex == 0.5
    assert report.by_difficulty["challenging"].ex == 0.0
    assert json.loads(json.dumps(report.to_dict()))["by_difficulty"]["moderate"]["matched"] == 1


def test_evaluate_bird_without_questions_has_no_breakdown(dbs, tmp_path):
    p, g, _ = bird_files(tmp_path, {"0": f"SELECT 1{SEP}shop"}, ["SELECT 1\tshop"], ["simple"])
    report = evaluate_bird(p, g, dbs, progress=False)
    assert report.ex == 1.0 and report.by_difficulty == {}


def test_bird_predictions_pair_by_integer_key(dbs, tmp_path):
    p = write(tmp_path / "pred.json", json.dumps({"1": f"SELECT 2{SEP}shop", "0": f"SELECT 1{SEP}shop"}))
    assert read_bird_pred(p) == ["SELECT 1", "SELECT 2"]


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "must be a JSON object"),
    ("{\"a\": \"SELECT 1\"}", "keys must be integers"),
    ("{\"0\": \"SELECT 1\", \"2\": \"SELECT 1\"}", "missing e.g. \\[1\\]"),
    ("{not json", "not valid JSON"),
])
def test_bird_bad_prediction_files(tmp_path, content, message):
    with pytest.raises(ValueError, match=message):
        read_bird_pred(write(tmp_path / "pred.json", content))


def test_bird_bad_gold_line_and_count_mismatch(dbs, tmp_path):
    p, g, _ = bird_files(tmp_path, {"0": "SELECT 1", "1": "SELECT 1"},
                         ["SELECT 1\tshop", "SELECT 1 shop"], [])
    with pytest.raises(ValueError, match=r"gold.sql:2: a gold line must be"):
        evaluate_bird(p, g, dbs, progress=False)
    p, g, _ = bird_files(tmp_path, {"0": "SELECT 1"}, ["SELECT 1\tshop", "SELECT 2\tshop"], [])
    with pytest.raises(ValueError, match="1 predictions but .* 2 gold"):
        evaluate_bird(p, g, dbs, progress=False)


def test_bird_difficulty_file_must_match(dbs, tmp_path):
    p, g, q = bird_files(tmp_path, {"0": "SELECT 1"}, ["SELECT 1\tshop"], ["simple", "moderate"])
    with pytest.raises(ValueError, match="2 questions but .* 1 gold"):
        evaluate_bird(p, g, dbs, questions_path=q, progress=False)
    bad = write(tmp_path / "q.json", json.dumps([{"level": "simple"}]))
    with pytest.raises(ValueError, match="no string 'difficulty'"):
        evaluate_bird(p, g, dbs, questions_path=bad, progress=False)


def test_bird_difficulty_reads_jsonl(tmp_path):
    q = write(tmp_path / "q.jsonl", '{"difficulty": "simple"}\n{"difficulty": "challenging"}\n')
    assert read_bird_difficulty(q) == ["simple", "challenging"]


def test_bird_unknown_dialect_and_missing_root(dbs, tmp_path):
    p, g, _ = bird_files(tmp_path, {"0": "SELECT 1"}, ["SELECT 1\tshop"], [])
    with pytest.raises(ValueError, match="supports sqlite, postgresql, mysql"):
        evaluate_bird(p, g, dbs, dialect="mssql", progress=False)
    with pytest.raises(FileNotFoundError, match="BIRD database folder not found"):
        evaluate_bird(p, g, tmp_path / "absent", progress=False)


def test_bird_statement_rule_per_dialect():
    assert statement_rule("sqlite")("SELECT 1; SELECT 2") is not None
    assert statement_rule("mysql")("SELECT 1; SELECT 2") is not None
    assert statement_rule("postgresql")("SELECT 1; SELECT 2") is None
    assert statement_rule("sqlite")("SELECT 'a;b'; -- trailing comment") is None


def test_bird_server_urls_take_the_db_id():
    assert database_url("postgresql", "postgresql://u@127.0.0.1/{db_id}", "card") == \
        "postgresql://u@127.0.0.1/card"
    assert database_url("mysql", "mysql://u@127.0.0.1/bird", "card") == "mysql://u@127.0.0.1/bird"


def test_bird_runaway_prediction_times_out(dbs):
    runaway = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"
    [v] = label_bird([("shop", "SELECT 1", runaway)], dbs, timeout_s=0.3, workers=1)
    assert not v.match and v.pred_error.startswith("timeout")


# -- BIRD mini-dev: the real files, on empty stand-in databases built from dev_tables.json ----------


def test_bird_minidev_gold_against_itself_on_empty_standins(tmp_path):
    bird = SHARED_DATA / "bird_minidev"
    if not (bird / "dev_tables.json").is_file():
        pytest.skip(f"BIRD mini-dev data not found at {bird} (the tests read ../shared/data)")
    for schema in json.loads((bird / "dev_tables.json").read_text()):
        db = schema["db_id"]
        columns: dict[int, list[str]] = {}
        for (table, name), kind in zip(schema["column_names_original"][1:], schema["column_types"][1:]):
            columns.setdefault(table, []).append(f'"{name}" {"REAL" if kind == "number" else "TEXT"}')
        make_db(tmp_path / "db" / db / f"{db}.sqlite", "".join(
            f'CREATE TABLE "{t}" ({", ".join(columns.get(i, ["x TEXT"]))});'
            for i, t in enumerate(schema["table_names_original"])))
    gold_lines = (bird / "mini_dev_sqlite_gold.sql").read_text().splitlines()
    preds = {str(i): f"{line.split(chr(9))[0]}{SEP}{line.split(chr(9))[1]}"
             for i, line in enumerate(gold_lines)}
    p = write(tmp_path / "pred.json", json.dumps(preds))
    report = evaluate_bird(p, bird / "mini_dev_sqlite_gold.sql", tmp_path / "db",
                           questions_path=bird / "mini_dev_sqlite.json", progress=False)
    assert report.overall.count == 500
    assert {d: s.count for d, s in report.by_difficulty.items()} == \
        {"simple": 148, "moderate": 250, "challenging": 102}
    assert report.gold_errors == ()  # every gold runs on the schema
    assert report.ex == 1.0
