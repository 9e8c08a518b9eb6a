"""curriculum.config: the shipped stage configs load, strictly, and reach the pieces they configure."""

from __future__ import annotations

from pathlib import Path

import pytest

from curriculum.config import STAGES, load_stage_config
from curriculum.teachers import ProgrammaticTeacher
from jobs.runtime import make_teacher
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
    shipped = make_teacher(load_stage_config(CONFIGS / "stage1.yaml"))
    assert isinstance(shipped, ProgrammaticTeacher) and shipped.brief  # micro scale: short thoughts
    verbose = make_teacher(load_stage_config(CONFIGS / "stage1.yaml", ["teacher.brief=false", "teacher.seed=3"]))
    assert not verbose.brief and verbose.seed == 3
