"""curriculum.config: the shipped stage configs load, strictly, and reach the pieces they configure."""

from __future__ import annotations

from pathlib import Path

import pytest

from curriculum.config import load_stage_config
from curriculum.stages import STAGES
from curriculum.teachers import ProgrammaticTeacher
from jobs.stage import parse_stage_args, save_config
from sqlrl.config import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "jobs" / "configs"


@pytest.mark.parametrize("stage", STAGES)
def test_every_shipped_stage_config_loads(stage):
    cfg = load_stage_config(CONFIGS / f"{stage}.yaml")
    assert cfg.stage == stage
    assert cfg.mode == ("single" if stage in ("stage1", "stage3") else "agentic")
    assert (cfg.model.init == "previous") == (stage != "stage1")


def test_unknown_keys_and_bad_values_are_errors():
    with pytest.raises(ConfigError, match="teacher.brieff"):
        load_stage_config(CONFIGS / "stage1.yaml", ["teacher.brieff=true"])
    with pytest.raises((ConfigError, ValueError), match="group_size"):
        load_stage_config(CONFIGS / "stage3.yaml", ["rl.group_size=1"])


def test_previous_needs_the_previous_stages_checkpoint(tmp_path):
    cfg = load_stage_config(CONFIGS / "stage3.yaml", [f"run_dir={tmp_path}"])
    with pytest.raises(FileNotFoundError, match="run stage2 first"):
        cfg.init_model()
    (tmp_path / "stage2" / "final").mkdir(parents=True)
    (tmp_path / "stage2" / "final" / "config.json").write_text("{}")
    assert cfg.init_model() == str(tmp_path / "stage2" / "final")


def test_teacher_settings_reach_the_teacher():
    cfg = load_stage_config(CONFIGS / "stage1.yaml")
    shipped = cfg.teacher.build(cfg.stage_dir)
    assert isinstance(shipped, ProgrammaticTeacher) and shipped.brief  # micro scale: short thoughts
    cfg = load_stage_config(CONFIGS / "stage1.yaml", ["teacher.brief=false", "teacher.seed=3"])
    verbose = cfg.teacher.build(cfg.stage_dir)
    assert not verbose.brief and verbose.seed == 3


def test_an_openai_teacher_without_an_endpoint_is_a_config_error():
    with pytest.raises(ValueError, match="teacher.base_url and teacher.model"):
        load_stage_config(CONFIGS / "stage1.yaml", ["teacher.kind=openai"])


# -- a stage job never replaces a finished result without overwrite=true --------------------------

def _finished(run_dir: Path, stage: str, what: str = "summary.json") -> None:
    (run_dir / stage / "final").mkdir(parents=True, exist_ok=True)
    (run_dir / stage / "final" / "config.json").write_text("{}")
    if what == "summary.json":
        (run_dir / stage / "summary.json").write_text("{}")


@pytest.mark.parametrize("stage", STAGES)
def test_overwrite_is_a_config_key_false_by_default(stage):
    assert load_stage_config(None, [f"stage={stage}"]).overwrite is False
    assert load_stage_config(CONFIGS / f"{stage}.yaml").overwrite is False
    assert "\noverwrite: false" in (CONFIGS / f"{stage}.yaml").read_text()  # the YAML mirrors the dataclass
    assert load_stage_config(CONFIGS / f"{stage}.yaml", ["overwrite=true"]).overwrite is True


@pytest.mark.parametrize("what", ["summary.json", "final"])
def test_a_stage_job_refuses_to_replace_a_finished_result(tmp_path, capsys, what):
    _finished(tmp_path, "stage3")
    _finished(tmp_path, "stage4", what)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "stage4").rglob("*")}
    with pytest.raises(SystemExit) as exc:
        parse_stage_args("stage4", [f"run_dir={tmp_path}"])
    message = str(exc.value)
    assert "\n" not in message and message.startswith(f"stage4: {tmp_path / 'stage4'} already holds a result")
    assert "overwrite=true" in message and "run_dir=" in message  # both ways out
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "stage4").rglob("*")} == before  # nothing touched
    assert "about to run" not in capsys.readouterr().err  # refused before announcing anything


def test_overwrite_or_a_new_run_dir_lets_the_job_start_and_it_says_what_it_will_do(tmp_path, capsys):
    _finished(tmp_path / "old", "stage3")
    _finished(tmp_path / "old", "stage4")
    cfg = parse_stage_args("stage4", [f"run_dir={tmp_path / 'old'}", "overwrite=true", "rl.steps=3"])
    err = capsys.readouterr().err
    assert cfg.overwrite and "stage4 (agentic GRPO): about to run" in err
    assert _plan(err)["run_dir"].startswith(f"{tmp_path / 'old'} ") and "overwrite=true" in _plan(err)["run_dir"]
    assert "start from: smollm2-135m" in err  # the built-in default, not the previous stage: say so
    assert _plan(err)["data"].startswith("generated (runs/data/synth)") and "3 GRPO step(s)" in _plan(err)["steps"]
    assert "built-in defaults (no --config)" in err
    save_config(cfg)  # the stale summary goes before the run starts
    assert not (tmp_path / "old" / "stage4" / "summary.json").exists()

    _finished(tmp_path / "new", "stage3")
    (tmp_path / "new" / "stage4").mkdir()
    (tmp_path / "new" / "stage4" / "config.yaml").write_text("")  # an unfinished run is not a result
    cfg = parse_stage_args("stage4", ["--config", str(CONFIGS / "stage4.yaml"), f"run_dir={tmp_path / 'new'}"])
    err = capsys.readouterr().err
    assert not cfg.overwrite and f"outputs in {tmp_path / 'new' / 'stage4'}\n" in err
    assert f"start from: {tmp_path / 'new' / 'stage3' / 'final'}" in err
    assert _plan(err)["config"] == f"{CONFIGS / 'stage4.yaml'}; in-process"


def test_the_plan_of_an_sft_stage_names_its_steps(tmp_path, capsys):
    parse_stage_args("stage1", ["--config", str(CONFIGS / "stage1.yaml"), f"run_dir={tmp_path}", "model.init=tiny",
                                "data.train_size=10", "sft.batch_size=4", "sft.epochs=2"])
    err = capsys.readouterr().err
    assert "start from: tiny" in err and "up to 6 SFT step(s): 2 epoch(s)" in err and "10 training tasks" in err


def test_rl_reward_must_be_registered_and_match_the_stage_mode() -> None:
    assert load_stage_config(None, ["stage=stage4", "rl.reward=hybrid_agentic_shaped"]).reward_name == "hybrid_agentic_shaped"
    assert load_stage_config(None, ["stage=stage3", "rl.reward=hybrid_single_shaped"]).reward_name == "hybrid_single_shaped"
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        load_stage_config(None, ["stage=stage3", "rl.reward=nope"])
    with pytest.raises(ValueError, match="scores single responses, but stage4 rolls out in agentic"):
        load_stage_config(None, ["stage=stage4", "rl.reward=hybrid_single"])


def test_the_schema_style_is_resolved_when_the_config_is_made_and_checked_against_the_start(tmp_path, monkeypatch):
    monkeypatch.delenv("SQLRL_SCHEMA_STYLE", raising=False)
    assert load_stage_config(None, []).model.schema_style == "create"  # the default, written into config.yaml
    monkeypatch.setenv("SQLRL_SCHEMA_STYLE", "compact")
    assert load_stage_config(None, []).model.schema_style == "compact"
    assert load_stage_config(None, ["model.schema_style=create"]).model.schema_style == "create"
    with pytest.raises(ValueError, match="schema_style='prose' is not a schema style"):
        load_stage_config(None, ["model.schema_style=prose"])
    from sqlrl.agent.prompts import record_schema_style

    final = tmp_path / "stage1" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    cfg = load_stage_config(CONFIGS / "stage2.yaml", [f"run_dir={tmp_path}", "model.schema_style=create"])
    cfg.check_init_style()  # no record: a checkpoint made before records existed
    record_schema_style(final, "compact")
    with pytest.raises(ValueError, match="trained with schema_style 'compact', but the prompts would render 'create'"):
        cfg.check_init_style()
    with pytest.raises(SystemExit, match="stage2: .*set model.schema_style=compact"):
        parse_stage_args("stage2", ["--config", str(CONFIGS / "stage2.yaml"), f"run_dir={tmp_path}",
                                    "model.schema_style=create"])
    load_stage_config(CONFIGS / "stage2.yaml", [f"run_dir={tmp_path}", "model.schema_style=compact"]).check_init_style()


def _plan(err: str) -> dict[str, str]:
    """The stage plan's ``label: value`` lines (jobs.stage.describe_stage), whatever their alignment."""
    return {k.strip(): v.strip() for k, _, v in (line.partition(": ") for line in err.splitlines()
                                                 if line.startswith("  ") and ": " in line)}
