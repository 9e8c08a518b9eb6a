"""The evaluate job end to end: it reproduces the official Spider EX of the four labelled systems,
scores BIRD-CRITIC predictions, writes verdicts and reports, and fails clearly on bad input."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from jobs.evaluate import main
from sqlrl.tasks.io import write_tasks
from sqlrl.tasks.types import CriticTask


@pytest.fixture(scope="module")
def labelled(spider_dir):
    path = spider_dir.parent / "spider_dev_predictions"
    if not (path / "exec_labels_official_testsuite.jsonl").is_file():
        pytest.skip(f"official Spider labels not found at {path}")
    rows = [json.loads(l) for l in (path / "exec_labels_official_testsuite.jsonl").read_text().splitlines()]
    summary = json.loads((path / "exec_labels_summary.json").read_text())
    systems: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        systems[r["system"]].append(r)
    return systems, summary


@pytest.mark.slow
def test_the_job_reproduces_the_official_spider_ex_of_four_systems(labelled, spider_dir, tmp_path) -> None:
    systems, summary = labelled
    assert len(systems) == 4
    for k, (system, rows) in enumerate(sorted(systems.items())):
        rows.sort(key=lambda r: r["index"])
        gold = tmp_path / f"gold{k}.sql"
        pred = tmp_path / f"pred{k}.sql"
        gold.write_text("".join(f"{r['gold']}\t{r['db_id']}\n" for r in rows))
        pred.write_text("".join(" ".join(r["pred"].split()) + "\n" for r in rows))
        out = tmp_path / f"out{k}"
        assert main(["spider", "--gold", str(gold), "--pred", str(pred), "--db",
                     str(spider_dir / "database"), "--out", str(out)]) == 0
        report = json.loads((out / "report.json").read_text())
        assert report["scored"] == summary[system]["n"] == 972
        assert round(report["ex"], 4) == summary[system]["exec_acc"], system
        verdicts = [json.loads(l) for l in (out / "verdicts.jsonl").read_text().splitlines()]
        assert [int(v["match"]) for v in verdicts] == [r["exec_match"] for r in rows], system
        assert "| all | 972 |" in (out / "report.md").read_text()


def test_spider_hardness_breakdown_with_the_questions_file(spider_dir, tmp_path) -> None:
    dev = json.loads((spider_dir / "dev.json").read_text())[:40]  # concert_singer, pets_1
    (tmp_path / "q.json").write_text(json.dumps(dev))
    (tmp_path / "g.sql").write_text("".join(f"{q['query']}\t{q['db_id']}\n" for q in dev))
    (tmp_path / "p.sql").write_text("".join(f"{q['query']}\n" for q in dev))
    assert main(["spider", "--gold", str(tmp_path / "g.sql"), "--pred", str(tmp_path / "p.sql"),
                 "--db", str(spider_dir / "database"), "--questions", str(tmp_path / "q.json"),
                 "--out", str(tmp_path / "o")]) == 0
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["ex"] == 1.0 and sum(s["n"] for s in report["by_hardness"].values()) == 40


def test_critic_predictions_are_scored_by_dialect(demo_db_path, tmp_path) -> None:
    root = tmp_path / "dbs" / "shop"
    root.mkdir(parents=True)
    (root / "shop.sqlite").write_bytes(open(demo_db_path, "rb").read())
    tasks = [CriticTask(instance_id=f"i{k}", db_id="shop", query="fix", issue_sql=["SELECT COUNT(*) FROM customer"],
                        sol_sql=[f"SELECT COUNT(*) FROM {t}"], category="Query")
             for k, t in enumerate(["customers", "orders", "products"])]
    write_tasks(tmp_path / "tasks.jsonl", tasks)
    (tmp_path / "pred.jsonl").write_text(
        json.dumps({"instance_id": "i0", "pred_sqls": ["SELECT COUNT(*) FROM customers"]}) + "\n"
        + json.dumps({"instance_id": "i1", "pred_sqls": ["SELECT COUNT(*) FROM customer"]}) + "\n"
        + json.dumps({"instance_id": "zz", "pred_sqls": ["SELECT 1"]}) + "\n")
    out = tmp_path / "out"
    assert main(["critic", "--tasks", str(tmp_path / "tasks.jsonl"), "--pred", str(tmp_path / "pred.jsonl"),
                 "--db-root", str(tmp_path / "dbs"), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["solved"] == 1 and report["scored"] == 3 and report["sr"] == pytest.approx(100 / 3)
    assert report["by"]["dialect"]["sqlite"]["n"] == 3 and report["unknown_predictions"] == ["zz"]
    reasons = [json.loads(l)["reason"] for l in (out / "verdicts.jsonl").read_text().splitlines()]
    assert reasons[0] == "solved" and "pred-error" in reasons[1] and reasons[2] == "missing-prediction"


def test_bad_inputs_fail_with_a_clear_message(tmp_path, capsys, demo_db_path) -> None:
    assert main(["spider", "--gold", str(tmp_path / "nope.sql"), "--pred", str(tmp_path / "p"),
                 "--db", str(tmp_path)]) == 2
    (tmp_path / "g.sql").write_text("SELECT 1\tshop\nSELECT 2\tshop\n")
    (tmp_path / "p.sql").write_text("SELECT 1\n")
    assert main(["spider", "--gold", str(tmp_path / "g.sql"), "--pred", str(tmp_path / "p.sql"),
                 "--db", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "nope.sql" in err and "1 predictions" in err
    (tmp_path / "t.jsonl").write_text("{not json\n")
    (tmp_path / "pr.jsonl").write_text("")
    assert main(["critic", "--tasks", str(tmp_path / "t.jsonl"), "--pred", str(tmp_path / "pr.jsonl")]) == 2
    assert "t.jsonl:1" in capsys.readouterr().err.replace("\n", "")


def test_every_missing_path_option_is_named_before_anything_runs(tmp_path, capsys) -> None:
    (tmp_path / "pred.sql").write_text("SELECT 1\n")
    assert main(["spider", "--gold", "/nonexistent", "--pred", str(tmp_path / "pred.sql"),
                 "--db", str(tmp_path / "pred.sql"), "--questions", str(tmp_path / "q.json"),
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "evaluate spider: --gold: /nonexistent does not exist" in err
    assert f"evaluate spider: --db: {tmp_path / 'pred.sql'} is not a folder" in err
    assert f"evaluate spider: --questions: {tmp_path / 'q.json'} does not exist" in err
    assert "--pred:" not in err and "Errno" not in err and not (tmp_path / "out").exists()

    assert main(["bird", "--pred", str(tmp_path / "p.json"), "--gold", str(tmp_path / "g.sql"),
                 "--db-root", str(tmp_path / "dbs")]) == 2
    err = capsys.readouterr().err
    assert all(f"evaluate bird: {opt}: {tmp_path / name} does not exist" in err
               for opt, name in (("--pred", "p.json"), ("--gold", "g.sql"), ("--db-root", "dbs")))
    assert main(["bird", "--pred", str(tmp_path / "p.json"), "--gold", str(tmp_path / "pred.sql"),
                 "--dialect", "postgresql", "--db-root", "postgresql://admin@127.0.0.1:1/x"]) == 2
    err = capsys.readouterr().err
    assert "--pred:" in err and "--db-root" not in err  # an admin URL is not a path

    assert main(["critic", "--tasks", str(tmp_path / "t.jsonl"), "--pred", str(tmp_path / "pr.jsonl"),
                 "--db-root", str(tmp_path / "nodbs"), "--catalog", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert [line.split(":")[1].strip() for line in err.strip().splitlines()] == \
        ["--tasks", "--pred", "--db-root", "--catalog"]


def test_a_missing_path_exits_non_zero_without_a_traceback(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-m", "jobs.evaluate", "spider", "--gold", "/nonexistent",
                           "--pred", "/nonexistent-pred", "--db", str(tmp_path)],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == ["evaluate spider: --gold: /nonexistent does not exist",
                                        "evaluate spider: --pred: /nonexistent-pred does not exist"]
