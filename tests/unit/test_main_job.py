"""jobs.main's own logic with the stages and evaluations faked (fast): it refuses a run dir whose
stages hold results unless --overwrite (then every stage gets overwrite=true), resumes into a run
dir for stages not run yet, prints one line per phase and the results table once, plainly, at
full width when stdout is not a terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import jobs.held_out as held_out
import jobs.main as job_main
import jobs.runtime as runtime
import jobs.stage as stage_job
import jobs.stage_data as stage_data
from curriculum.stages import STAGES


def _eval(mode: str) -> dict:
    return {"mode": mode, "n": 4, "scored": 4, "success": 0.5, "format_ok": 1.0,
            "success_critic": 0.0, "success_text2sql": 1.0}


@pytest.fixture
def fake(monkeypatch):
    """Stages that parse their arguments for real (the overwrite check, the start checkpoint) and
    leave a result like a real stage; no data, models or evaluation."""
    calls: dict[str, list] = {"stages": [], "data": []}
    data = stage_data.StageData(train=(), eval=(), catalog={}, schemas={}, source="generated (fake)")

    class FakeRuntime:
        def __init__(self, cfg, data):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    def prepare_data(cfg):
        calls["data"].append(cfg.stage)
        return data

    def run_stage(stage, argv):
        calls["stages"].append((stage, argv))
        cfg = stage_job.parse_stage_args(stage, argv)
        stage_job.save_config(cfg)
        (cfg.stage_dir / "final").mkdir(exist_ok=True)
        (cfg.stage_dir / "final" / "config.json").write_text("{}")
        (cfg.stage_dir / "summary.json").write_text("{}")
        return {"eval": [_eval(STAGES[stage].mode)]}

    monkeypatch.setattr(stage_data, "prepare_data", prepare_data)
    monkeypatch.setattr(runtime, "Runtime", FakeRuntime)
    monkeypatch.setattr(held_out, "evaluate", lambda rt, model, tasks, mode: _eval(mode))
    monkeypatch.setattr(stage_job, "run_stage", run_stage)
    return calls


def test_a_fresh_run_prints_a_line_per_phase_and_the_table_once_in_full(fake, tmp_path, capsys):
    assert job_main.main(["--model", "tiny", "--run-dir", str(tmp_path / "run")]) == 0
    out, err = capsys.readouterr()
    assert [s for s, _ in fake["stages"]] == ["stage1", "stage2", "stage3", "stage4"]
    assert not any("overwrite=true" in argv for _, argv in fake["stages"])  # a fresh run replaces nothing
    for k in range(1, 6):
        assert f"main: {k}/5 phases done" in err
    assert "main: 5/5 phases done" in err and "+ stage4 agentic GRPO: agentic 0.50 (format 1.00, n=4)" in err
    title = "Success on held-out tasks: generated (fake) (greedy; format = well-formed answers)"
    assert (out + err).count(title) == 1 and title in out  # once, at the end, on stdout
    md = (tmp_path / "run" / "results.md").read_text().split("\nHeld-out")[0]
    assert md.strip() in out  # the plain markdown table, no line wrapped or cut
    assert "| + stage4 agentic GRPO | — | — | 0.50 (format 1.00, n=4) | 0.00 / 1.00 |" in out
    assert "┃" not in out and "│" not in out  # no rich box drawing off a terminal
    assert json.loads((tmp_path / "run" / "results.json").read_text())["rows"][0]["name"] == "base (tiny)"
    final = (tmp_path / "run" / "stage4" / "final").resolve()
    assert f"SQLRL_SERVE_API_KEYS=<key> python -m jobs.serve --model zeno={final}" in out + err


def test_a_run_dir_with_stage_results_is_refused_before_any_work(fake, tmp_path):
    run = tmp_path / "run"
    (run / "stage2" / "final").mkdir(parents=True)
    with pytest.raises(SystemExit) as exc:
        job_main.main(["--model", "tiny", "--run-dir", str(run)])
    message = str(exc.value)
    assert "\n" not in message and f"{run} already holds results of stage2" in message
    assert "--overwrite" in message and "--run-dir" in message
    assert fake["stages"] == [] and fake["data"] == []  # no data built, no model evaluated


def test_overwrite_replaces_every_stage(fake, tmp_path):
    run = tmp_path / "run"
    assert job_main.main(["--model", "tiny", "--run-dir", str(run)]) == 0
    fake["stages"].clear()
    assert job_main.main(["--model", "tiny", "--run-dir", str(run), "--overwrite"]) == 0
    assert len(fake["stages"]) == 4 and all("overwrite=true" in argv for _, argv in fake["stages"])
    fake["stages"].clear()
    assert job_main.main(["--model", "tiny", "--run-dir", str(run), "overwrite=true"]) == 0  # as an override too
    assert len(fake["stages"]) == 4


def test_later_stages_can_be_run_into_a_run_dir_that_holds_the_earlier_ones(fake, tmp_path):
    run = tmp_path / "run"
    assert job_main.main(["--model", "tiny", "--run-dir", str(run), "--stages", "stage1,stage2"]) == 0
    assert job_main.main(["--model", "tiny", "--run-dir", str(run), "--stages", "stage3,stage4"]) == 0
    assert [s for s, _ in fake["stages"]] == ["stage1", "stage2", "stage3", "stage4"]
    assert not any("overwrite=true" in argv for _, argv in fake["stages"])
    assert Path(run / "stage4" / "summary.json").is_file()
