"""The stage axis has one place to edit: ``curriculum.stages.STAGES``.

A fake stage, added as one test-only registry entry (no stage file, no YAML, nothing else edited),
loads its config, is announced, builds its data, trains through the real SFT loop, is checkpointed,
evaluated, and shows up in ``jobs.main``'s results table after the base model. The actors, the data
and the evaluation are faked (no models are trained, no Ray). The shipped stages' YAML files, entry
modules, docs and CI script agree with the registry."""

from __future__ import annotations

import importlib
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import jobs.held_out as held_out
import jobs.main as job_main
import jobs.runtime as runtime
import jobs.stage_data as stage_data
from curriculum.builders import BuildReport
from curriculum.config import load_stage_config
from curriculum.stages import STAGES, StageSpec, previous_stage, stage_spec
from jobs.train import TRAINERS
from sqlrl.config import ConfigError
from sqlrl.learn.batch import SFTExample

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = SFTExample((
    {"role": "user", "content": "How many orders are there?"},
    {"role": "assistant", "content": "<thought>count them</thought>\n<solution>SELECT COUNT(*) FROM orders</solution>"},
))


def _build_polish(inp):
    """Polishing answers: one example per training task, all kept."""
    time.sleep(0.1)  # long enough for a heartbeat line (SQLRL_HEARTBEAT_S=0.02 below)
    n = len(inp.tasks)
    return [EXAMPLE] * n, BuildReport(inp.cfg.stage, n, n, files={"sft": str(inp.cfg.stage_dir / "x.jsonl")})


FAKE = StageSpec("stage5", "answer polish SFT", "single", _build_polish, "sft")


class FakeLearner:
    def __init__(self):
        self.steps = []

    def step(self, batch, kind, loss):
        self.steps.append((kind, batch))
        return {"loss": 0.25}

    def save(self, path, overwrite=False):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "config.json").write_text("{}")

    def shutdown(self):
        pass


@pytest.fixture
def fake_stage(monkeypatch):
    """The test-only registry entry, and a job whose actors, data and evaluation are fakes."""
    monkeypatch.setitem(STAGES, FAKE.name, FAKE)
    tasks = tuple(type("Task", (), {"kind": "text2sql", "task_id": f"t{i}"})() for i in range(3))
    data = stage_data.StageData(train=tasks, eval=tasks[:2], catalog={}, schemas={}, source="generated (fake)")
    seen = {"learners": [], "evals": []}

    class FakeRuntime:
        def __init__(self, cfg, data):
            self.cfg, self.data = cfg, data

        def learner(self, model, optim, reference=False):
            seen["learners"].append((model, optim))
            return FakeLearner()

        def session_source(self):
            return None

        def prebuild_suites(self, tasks):
            return None  # reward.test_suite is off in this stage

        def release(self, group):
            group.shutdown()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    def evaluate(rt, model, tasks, mode):
        seen["evals"].append((Path(model).name, mode))
        summary = {"mode": mode, "n": len(tasks), "scored": len(tasks), "success": 0.5, "format_ok": 1.0,
                   "success_text2sql": 0.5}
        return SimpleNamespace(mode=mode, to_dict=lambda: summary)  # as held_out.Evaluation: to_dict()

    monkeypatch.setattr(stage_data, "prepare_data", lambda cfg: data)
    monkeypatch.setattr(runtime, "Runtime", FakeRuntime)
    monkeypatch.setattr(held_out, "evaluate", evaluate)
    return seen


def test_a_new_stage_is_one_registry_entry(fake_stage, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SQLRL_HEARTBEAT_S", "0.02")
    cfg = load_stage_config(None, ["stage=stage5", f"run_dir={tmp_path}", "model.init=previous"])
    assert cfg.mode == "single" and previous_stage("stage5") == "stage4"
    with pytest.raises(FileNotFoundError, match="run stage4 first"):  # the stage before it in the registry
        cfg.init_model()

    run = tmp_path / "run"
    assert job_main.main(["--model", "tiny", "--run-dir", str(run), "--stages", "stage5",
                          "sft.batch_size=2", "data.train_size=3"]) == 0
    out, err = capsys.readouterr()
    assert "stage5 (answer polish SFT): about to run" in err and "up to 2 SFT step(s)" in err
    assert "[heartbeat] stage5 data: Polishing answers: one example per training task, all kept" in err
    assert "stage5 data: stage5: kept 3 of 3" in err
    assert "| + stage5 answer polish SFT | 0.50 (format 1.00, n=2) |" in out  # the results table's row
    assert len(fake_stage["learners"]) == 1 and fake_stage["learners"][0][0] == "tiny"
    assert fake_stage["evals"] == [("tiny", "single"), ("tiny", "agentic"), ("final", "single")]
    summary = json.loads((run / "stage5" / "summary.json").read_text())
    assert summary["title"] == "answer polish SFT" and summary["steps"] == 2 and summary["data_build"]["kept"] == 3
    # the job process's peak memory over the stage (Linux resets the peak at the stage's start)
    assert summary["peak_rss_gib"] > 0 and summary["peak_rss_scope"] in {"stage", "process"}
    # what the two SFT steps measured, from the trainer's own history
    assert summary["training"]["steps"] == 2 and summary["training"]["text"].endswith("over 2 steps")
    assert f"; training: {summary['training']['text']}" in err
    assert "peak memory" in err  # the main job's line for the phase
    assert "stage: stage5" in (run / "stage5" / "config.yaml").read_text()
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["stage"] for m in metrics] == ["stage5", "stage5"] and metrics[0]["loss"] == 0.25
    assert "python -m jobs.serve --model zeno=" in out + err
    # the checkpoint records its schema rendering; a stage that would prompt it otherwise refuses
    assert json.loads((run / "stage5" / "final" / "sqlrl_prompt.json").read_text()) == {"schema_style": "create"}
    assert "schema_style: create" in (run / "stage5" / "config.yaml").read_text()
    with pytest.raises(SystemExit, match=r"trained with schema_style 'create', but the prompts would render 'compact'"):
        job_main.main(["--model", str(run / "stage5" / "final"), "--run-dir", str(tmp_path / "again"),
                       "--stages", "stage5", "model.schema_style=compact", "data.train_size=3"])


def test_an_unknown_stage_is_named_with_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match="unknown stage 'stage9'; known: stage1, stage2, stage3, stage4"):
        load_stage_config(None, ["stage=stage9"])
    with pytest.raises(ValueError, match="known: stage1"):
        stage_spec("stage9")
    with pytest.raises(SystemExit, match="unknown stage"):
        job_main.main(["--run-dir", str(tmp_path), "--stages", "stage1,stage9"])
    with pytest.raises(ValueError, match="mode"):
        StageSpec("x", "x", "multi", _build_polish, "sft")


def shipped_problems(spec: StageSpec, monkeypatch) -> list[str]:
    """What of a stage's optional shipped parts disagrees with its entry: its YAML (``config``) names
    its own stage; its entry module (``job``) runs this stage and has its row in docs/curriculum.md's
    jobs table. A stage with neither (both are optional) has nothing to disagree."""
    problems = []
    if spec.config is not None:
        path = spec.config_path()
        if not path.is_file():
            problems.append(f"its config {spec.config!r} is not a file in jobs/configs/")
        elif load_stage_config(path).stage != spec.name:
            problems.append(f"jobs/configs/{spec.config} names stage {load_stage_config(path).stage!r}")
    if spec.job is not None:
        try:
            module = importlib.import_module(spec.job)
        except ImportError as exc:
            return problems + [f"its entry module {spec.job!r} does not import: {exc}"]
        called = []
        monkeypatch.setattr(module, "stage_main", lambda stage, argv: called.append((stage, argv)) or {})
        module.main(["x=1"])
        if called != [(spec.name, ["x=1"])]:  # the entry point runs this stage and nothing else
            problems.append(f"{spec.job}.main runs {called}, not stage_main({spec.name!r}, argv)")
        docs = (ROOT / "docs" / "curriculum.md").read_text()
        row = f"| {spec.name[-1]} {spec.title} | `{spec.job.replace('.', '/')}.py` |"
        if row not in docs:
            problems.append(f"docs/curriculum.md's jobs table lacks {row}")
    return problems


@pytest.mark.parametrize("name", list(STAGES))
def test_the_shipped_files_follow_the_registry(name, monkeypatch):
    spec = STAGES[name]
    assert spec.trainer in TRAINERS, f"stage {name}: trainer {spec.trainer!r} is not in jobs.train.TRAINERS"
    problems = shipped_problems(spec, monkeypatch)
    assert not problems, f"stage {name}: " + "; ".join(problems)


def test_a_stage_without_shipped_files_needs_none_and_wrong_ones_are_named(monkeypatch):
    assert shipped_problems(FAKE, monkeypatch) == []  # no YAML, no entry module: both optional
    wrong = StageSpec("stage5", "answer polish SFT", "single", _build_polish, "sft", "stage1.yaml", "jobs.stage5_nowhere")
    assert shipped_problems(wrong, monkeypatch) == [
        "jobs/configs/stage1.yaml names stage 'stage1'",
        "its entry module 'jobs.stage5_nowhere' does not import: No module named 'jobs.stage5_nowhere'"]


def test_the_ray_stages_script_submits_the_registry_in_order():
    script = (ROOT / "scripts" / "ray_stages.sh").read_text()
    listed = re.search(r"for job in ([\w ]+); do", script).group(1).split()
    want = [s.job for s in STAGES.values() if s.job]
    assert [f"jobs.{m}" for m in listed] == want, \
        f"scripts/ray_stages.sh's `for job in ...; do` list must be the registry's entry modules in order: {want}"
