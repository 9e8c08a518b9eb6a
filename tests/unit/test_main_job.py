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
from jobs.train import TRAINERS
from sqlrl.config import to_dict

HISTORY = {"sft": [{"loss": 2.5}, {"loss": 0.75}],
           "grpo": [{"pass_rate": 0.25, "groups_drawn": 4, "groups_trained": 3, "groups_signal": 3, "learner_step": 1},
                    {"pass_rate": 0.5, "groups_drawn": 2, "groups_trained": 0, "groups_signal": 0}]}


class FakeEvaluation(dict):
    """An evaluation as ``jobs.held_out.evaluate`` returns it: ``to_dict()`` is its summary entry."""

    def to_dict(self) -> dict:
        return dict(self)


def _eval(mode: str) -> dict:
    return FakeEvaluation(mode=mode, n=4, scored=4, success=0.5, format_ok=1.0, success_critic=0.0,
                          success_text2sql=1.0)


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

    def run_stage(cfg, config_path=None):
        stage = cfg.stage
        calls["stages"].append((stage, cfg))
        stage_job.check_stage(cfg, config_path)
        stage_job.save_config(cfg)
        (cfg.stage_dir / "final").mkdir(exist_ok=True)
        (cfg.stage_dir / "final" / "config.json").write_text("{}")
        trainer = STAGES[stage].trainer
        summary = {"checkpoint": str(cfg.stage_dir / "final"), "eval": [_eval(STAGES[stage].mode)],
                   "training": TRAINERS[trainer].signal(HISTORY[trainer]), "config": to_dict(cfg)}
        (cfg.stage_dir / "summary.json").write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(stage_data, "prepare_data", prepare_data)
    monkeypatch.setattr(runtime, "Runtime", FakeRuntime)
    monkeypatch.setattr(held_out, "evaluate", lambda rt, model, tasks, mode: _eval(mode))
    monkeypatch.setattr(stage_job, "run_stage", run_stage)
    return calls


def test_a_fresh_run_prints_a_line_per_phase_and_the_table_once_in_full(fake, tmp_path, capsys):
    assert job_main.main(["--model", "tiny", "--run-dir", str(tmp_path / "run")]) == 0
    out, err = capsys.readouterr()
    assert [s for s, _ in fake["stages"]] == ["stage1", "stage2", "stage3", "stage4"]
    assert not any(cfg.overwrite for _, cfg in fake["stages"])  # a fresh run replaces nothing
    for k in range(1, 6):
        assert f"main: {k}/5 phases done" in err
    assert "main: 5/5 phases done" in err and "+ stage4 agentic GRPO: agentic 0.50 (format 1.00, n=4)" in err
    title = "Success on held-out tasks: generated (fake) (greedy; format = well-formed answers)"
    assert (out + err).count(title) == 1 and title in out  # once, at the end, on stdout
    md = (tmp_path / "run" / "results.md").read_text().split("\nHeld-out")[0]
    assert md.strip() in out  # the plain markdown table, no line wrapped or cut
    assert "| + stage4 agentic GRPO | — | — | 0.50 (format 1.00, n=4) | 0.00 / 1.00 |" in out
    # every stage's row and phase line say what its own steps measured
    grpo = "samples' pass 0.25 -> 0.50, 3 of 6 groups with unequal rewards over 2 steps"
    assert f"| {grpo} |" in out and err.count(f"; training: {grpo}") == 2
    assert "| loss 2.50 -> 0.75 over 2 steps |" in out and err.count("; training: loss 2.50 -> 0.75") == 2
    assert "┃" not in out and "│" not in out  # no rich box drawing off a terminal
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["rows"]
    assert rows[0]["name"] == "base (tiny)" and all(r["peak_rss_gib"] > 0 for r in rows)
    assert err.count(" GiB") >= 5 and "s, peak memory " in err  # every phase line: time, then peak memory
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
    assert len(fake["stages"]) == 4 and all(cfg.overwrite for _, cfg in fake["stages"])
    fake["stages"].clear()
    assert job_main.main(["--model", "tiny", "--run-dir", str(run), "overwrite=true"]) == 0  # as an override too
    assert len(fake["stages"]) == 4


def test_later_stages_can_be_run_into_a_run_dir_that_holds_the_earlier_ones(fake, tmp_path):
    run = tmp_path / "run"
    assert job_main.main(["--model", "tiny", "--run-dir", str(run), "--stages", "stage1,stage2"]) == 0
    assert job_main.main(["--model", "tiny", "--run-dir", str(run), "--stages", "stage3,stage4"]) == 0
    assert [s for s, _ in fake["stages"]] == ["stage1", "stage2", "stage3", "stage4"]
    assert not any(cfg.overwrite for _, cfg in fake["stages"])
    assert Path(run / "stage4" / "summary.json").is_file()


def test_resume_keeps_finished_stages_and_the_cached_base_scores_and_runs_the_rest(fake, tmp_path, monkeypatch,
                                                                                  capsys):
    run = tmp_path / "run"
    assert job_main.main(["--model", "tiny", "--run-dir", str(run), "--stages", "stage1,stage2"]) == 0
    assert json.loads((run / "base_eval.json").read_text())["model"] == "tiny"
    # a crashed stage 3 leaves files but no result: it is run again
    (run / "stage3").mkdir()
    (run / "stage3" / "stage3.jsonl").write_text("")
    evaluated: list[str] = []
    monkeypatch.setattr(held_out, "evaluate", lambda rt, model, tasks, mode: evaluated.append(model) or _eval(mode))
    fake["stages"].clear()
    capsys.readouterr()
    assert job_main.main(["--model", "tiny", "--run-dir", str(run), "--resume"]) == 0
    out, _ = capsys.readouterr()
    assert [s for s, _ in fake["stages"]] == ["stage3", "stage4"]  # stages 1-2 kept, base not evaluated again
    assert "tiny" not in evaluated
    assert not any(cfg.overwrite for _, cfg in fake["stages"])
    rows = json.loads((run / "results.json").read_text())["rows"]
    assert [r["resumed"] for r in rows] == [True, True, True, False, False]
    assert "| + stage1 reasoning SFT | 0.50 (format 1.00, n=4) |" in out and "| resumed |" in out
    # another base model (or other held-out tasks) is not a cache hit: evaluated again; and the
    # finished stage 1, trained from the other base model, is not passed off as this run's
    fake["stages"].clear()
    other = str(run / "stage1" / "final")
    with pytest.raises(SystemExit, match=rf"stage1/summary.json does not match what this run gives stage1 .*model.init: tiny -> {other}"):
        job_main.main(["--model", other, "--run-dir", str(run), "--resume"])
    assert other in evaluated and fake["stages"] == []
    # nor are scores made with another schema rendering
    evaluated.clear()
    with pytest.raises(SystemExit, match="stage1/summary.json does not match .*model.schema_style: create -> compact"):
        job_main.main(["--model", "tiny", "--run-dir", str(run), "--resume", "model.schema_style=compact"])
    assert "tiny" in evaluated


def test_resume_refuses_a_finished_stage_made_with_another_config(fake, tmp_path):
    run = tmp_path / "run"
    assert job_main.main(["--model", "tiny", "--run-dir", str(run), "--stages", "stage1,stage2"]) == 0
    fake["stages"].clear()
    with pytest.raises(SystemExit) as exc:
        job_main.main(["--model", "tiny", "--run-dir", str(run), "--resume", "sft.epochs=3"])
    message = str(exc.value)
    assert "stage2/summary.json does not match what this run gives stage2 (sft.epochs: 1 -> 3)" in message
    assert "--overwrite" in message and "\n" not in message and fake["stages"] == []
    # the same config scored on other held-out tasks (say, another task-selection rule): refused
    summary = json.loads((run / "stage1" / "summary.json").read_text())
    summary["eval"][0]["per_task"] = {"synth/shop/1": {"success": 1}}
    (run / "stage1" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SystemExit, match=r"gives stage1 \(its single evaluation was on other held-out tasks\)"):
        job_main.main(["--model", "tiny", "--run-dir", str(run), "--resume"])
    # a summary from before configs were recorded cannot show it was made alike: refused too
    del summary["eval"][0]["per_task"]
    del summary["config"]
    (run / "stage1" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SystemExit, match=r"does not match what this run gives stage1 \(it records no config\)"):
        job_main.main(["--model", "tiny", "--run-dir", str(run), "--resume"])


def test_resume_refuses_a_gap_in_a_chain_and_a_conflicting_overwrite(fake, tmp_path):
    run = tmp_path / "run"
    (run / "stage2" / "final").mkdir(parents=True)
    with pytest.raises(SystemExit, match="holds results of a later stage without the earlier ones"):
        job_main.main(["--model", "tiny", "--run-dir", str(run), "--resume"])
    with pytest.raises(SystemExit, match="--resume keeps finished stages and --overwrite replaces them"):
        job_main.main(["--model", "tiny", "--run-dir", str(run), "--resume", "--overwrite"])
    (run / "stage1" / "final").mkdir(parents=True)
    (run / "stage1" / "summary.json").write_text("{not json")
    with pytest.raises(SystemExit, match=r"cannot read the finished stage's .*stage1/summary.json"):
        job_main.main(["--model", "tiny", "--run-dir", str(run), "--resume"])
    assert fake["stages"] == []


def _compare_fake(monkeypatch):
    """Evaluations with per-task outcomes, so the paired changes can be checked."""
    def evaluate(rt, model, tasks, mode):
        ok = 1 if "stage" in str(model) or model == "ckpt" else 0
        return FakeEvaluation({**_eval(mode), "success": float(ok),
                               "per_task": {f"t{i}": {"success": ok} for i in range(4)}})
    monkeypatch.setattr(held_out, "evaluate", evaluate)


def test_the_long_preset_runs_each_variant_in_its_own_folder_from_the_base_model(fake, tmp_path, capsys):
    run = tmp_path / "long"
    assert job_main.main(["--preset", "long", "--model", "tiny", "--run-dir", str(run)]) == 0
    out, err = capsys.readouterr()
    names = [s for s, _ in fake["stages"]]
    assert names == ["stage1", "stage2", "stage3", "stage4"] * 2
    zeno, talon = fake["stages"][0][1], fake["stages"][4][1]
    assert Path(zeno.run_dir) == run / "zeno" and Path(talon.run_dir) == run / "talon"
    assert zeno.model.init == "tiny" and talon.model.init == "tiny"  # both start from the base model
    assert dict(talon.data.mixture) == {"critic": 1.0} and dict(zeno.data.mixture) == {"text2sql": 0.5, "critic": 0.5}
    for cfg in (zeno, talon):
        assert cfg.data.eval_size == 144 and dict(cfg.data.eval_mixture) == {"text2sql": 0.5, "critic": 0.5}
        assert cfg.data.eval_split == "test+dev" and cfg.model.mixed_precision == "bfloat16"
        assert cfg.data.train_size == 160  # the preset's stage1 size
    later = [cfg for _, cfg in fake["stages"]][1:4]
    assert all(cfg.model.init == "previous" for cfg in later)  # each later stage from the one before
    rows = json.loads((run / "results.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == [""] + ["zeno"] * 4 + ["talon"] * 4
    assert "| + talon stage1 reasoning SFT |" in out
    assert (run / "zeno" / "stage4" / "summary.json").is_file() and (run / "talon" / "stage4" / "summary.json").is_file()


def test_a_variant_is_compared_with_its_own_previous_stage_and_its_first_stage_with_the_base(
        fake, tmp_path, monkeypatch):
    _compare_fake(monkeypatch)
    run = tmp_path / "long"

    def run_stage(cfg, config_path=None):
        stage = cfg.stage
        stage_job.check_stage(cfg, config_path)
        stage_job.save_config(cfg)
        (cfg.stage_dir / "final").mkdir(exist_ok=True)
        (cfg.stage_dir / "final" / "config.json").write_text("{}")
        (cfg.stage_dir / "summary.json").write_text("{}")
        e = held_out.evaluate(None, str(cfg.stage_dir), (), STAGES[stage].mode)
        return {"eval": [e], "checkpoint": str(cfg.stage_dir / "final")}

    monkeypatch.setattr(stage_job, "run_stage", run_stage)
    assert job_main.main(["--preset", "long", "--model", "tiny", "--run-dir", str(run)]) == 0
    rows = json.loads((run / "results.json").read_text())["rows"]
    talon1 = next(r for r in rows if r["name"] == "+ talon stage1 reasoning SFT")
    zeno3 = next(r for r in rows if r["name"] == "+ zeno stage3 reasoning GRPO")
    talon3 = next(r for r in rows if r["name"] == "+ talon stage3 reasoning GRPO")
    assert talon1["change"]["single"]["vs"] == "base (tiny)" and talon1["change"]["single"]["gained"] == 4
    assert zeno3["change"]["single"]["vs"] == "+ zeno stage1 reasoning SFT"
    assert talon3["change"]["single"]["vs"] == "+ talon stage1 reasoning SFT"


def test_spider_is_evaluated_for_the_base_model_and_every_checkpoint(fake, tmp_path, monkeypatch, capsys):
    seen = []
    spider = stage_data.StageData(train=(), eval=(), catalog={}, schemas={}, source="spider dev (fake, 100 questions)")
    monkeypatch.setattr(stage_data, "spider_held_out", lambda root, n, seed: seen.append((root, n)) or spider)

    def run_stage(cfg, config_path=None):
        stage = cfg.stage
        stage_job.check_stage(cfg, config_path)
        (cfg.stage_dir / "final").mkdir(parents=True, exist_ok=True)
        (cfg.stage_dir / "final" / "config.json").write_text("{}")
        return {"eval": [_eval(STAGES[stage].mode)], "checkpoint": str(cfg.stage_dir / "final")}

    monkeypatch.setattr(stage_job, "run_stage", run_stage)
    assert job_main.main(["--model", "tiny", "--run-dir", str(tmp_path / "r"), "--spider-eval", "/spider",
                          "--spider-size", "7"]) == 0
    assert seen == [("/spider", 7)]
    rows = json.loads((tmp_path / "r" / "results.json").read_text())["rows"]
    assert all("spider" in r["eval"] for r in rows) and len(rows) == 5
    assert "spider success" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--preset", "long", "--variants", "zeno,bogus"], "unknown variant(s) ['bogus'] for preset 'long'; known: zeno, talon"),
    (["--variants", "zeno"], "unknown variant(s) ['zeno'] for preset 'default'; known: none"),
])
def test_bad_variants_are_refused_before_any_work(fake, tmp_path, argv, message):
    with pytest.raises(SystemExit) as exc:
        job_main.main(["--model", "tiny", "--run-dir", str(tmp_path / "r"), *argv])
    assert message in str(exc.value) and fake["stages"] == [] and fake["data"] == []
