"""``jobs.infer`` then ``jobs.evaluate`` on generated tasks (greedy and self-consistency) and on a
few Spider dev questions: the prediction files are in the evaluators' formats and score."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="the policy stack (transformers) is not installed")

from jobs.evaluate import main as evaluate  # noqa: E402
from jobs.infer import main as infer  # noqa: E402
from sqlrl.synth import build_default_dataset  # noqa: E402


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    build_default_dataset(out, seed=0, n_per_domain=30, domains=["shop", "library"])
    return out


def run_infer(args: list[str]) -> dict:
    assert infer(args) == 0
    out = args[args.index("--out") + 1]
    return json.loads(open(f"{out}/summary.json").read())


def test_greedy_then_evaluate_on_generated_tasks(dataset, tmp_path) -> None:
    out = tmp_path / "greedy"
    summary = run_infer(["--model", "tiny", "--tasks", str(dataset / "text2sql_test.jsonl"),
                         "--db-root", str(dataset / "databases"), "--limit", "3", "--max-turns", "2",
                         "--max-new-tokens", "16", "--out", str(out)])
    assert summary["tasks"] == 3 and summary["trajectories"] == 3
    assert len((out / "pred.sql").read_text().splitlines()) == 3
    assert evaluate(["spider", "--gold", str(out / "gold.sql"), "--pred", str(out / "pred.sql"),
                     "--db", str(dataset / "databases"), "--out", str(tmp_path / "ev")]) == 0
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert report["n"] == 3 and 0.0 <= report["ex"] <= 1.0


def test_self_consistency_and_debugging_tasks(dataset, tmp_path) -> None:
    out = tmp_path / "sc"
    summary = run_infer(["--model", "tiny", "--tasks", str(dataset / "critic_test.jsonl"),
                         "--db-root", str(dataset / "databases"), "--limit", "2", "--k", "3",
                         "--temperature", "1.0", "--mode", "single", "--max-new-tokens", "16",
                         "--out", str(out)])
    assert summary["trajectories"] == 6 and summary["stop_reasons"] == {"single_turn": 6}
    assert evaluate(["critic", "--tasks", str(out / "tasks_critic.jsonl"), "--pred",
                     str(out / "pred_critic.jsonl"), "--db-root", str(dataset / "databases"),
                     "--out", str(tmp_path / "ev")]) == 0
    assert json.loads((tmp_path / "ev" / "report.json").read_text())["instances"] == 2


def test_spider_dev_questions(spider_dir, tmp_path) -> None:
    out = tmp_path / "spider"
    summary = run_infer(["--model", "tiny", "--spider", str(spider_dir), "--limit", "2", "--mode", "single",
                         "--max-new-tokens", "8", "--out", str(out)])
    assert summary["tasks"] == 2
    assert evaluate(["spider", "--gold", str(out / "gold.sql"), "--pred", str(out / "pred.sql"),
                     "--db", str(spider_dir / "database"), "--out", str(tmp_path / "ev")]) == 0


def test_bad_input_is_a_clear_error(tmp_path, capsys) -> None:
    assert infer(["--tasks", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
