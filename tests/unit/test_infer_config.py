"""jobs.infer's settings: one typed config (sqlrl.config) from --config YAML, the flags, and
key=value overrides, in that order of precedence; task sources come from the LOADERS registry."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from jobs.infer import InferConfig, TaskSource, main as infer, parse_args
from sqlrl.config import load_config


def _config(argv: list[str]) -> InferConfig:
    a, overrides = parse_args(argv)
    return load_config(InferConfig, a.config, overrides)


def test_flags_are_config_keys_and_override_the_file(tmp_path):
    path = tmp_path / "infer.yaml"
    path.write_text("model: smollm2-135m\nk: 4\ntemperature: 0.8\n"
                    "tasks: {source: spider, path: /data/spider, split: dev}\nrollout: {batch: 8, backend: hf}\n")
    cfg = _config(["--config", str(path), "--k", "2", "--max-new-tokens", "32", "seed=7"])
    assert (cfg.model, cfg.k, cfg.temperature, cfg.seed) == ("smollm2-135m", 2, 0.8, 7)
    assert (cfg.rollout.batch, cfg.rollout.max_new_tokens, cfg.rollout.max_total_tokens) == (8, 32, 8192)
    assert cfg.tasks == TaskSource("spider", "/data/spider", "dev")
    cfg = _config(["--tasks", "a b/t.jsonl", "--db-root", "dbs", "--mode", "single", "k=3"])
    assert cfg.tasks == TaskSource("jsonl", "a b/t.jsonl", None, "dbs") and (cfg.mode, cfg.k) == ("single", 3)
    assert _config([]) == InferConfig()  # no flags: the defaults the flags documented before
    shipped = _config(["--config", str(Path(__file__).resolve().parents[2] / "jobs/configs/infer.yaml")])
    assert dataclasses.replace(shipped, tasks=TaskSource()) == InferConfig()  # the example mirrors the defaults
    assert shipped.tasks == TaskSource("jsonl", "runs/data/synth/text2sql_test.jsonl", db_root="runs/data/synth/databases")


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown task source 'parquet'; known: spider, bird"):
        _config(["tasks.source=parquet"])
    with pytest.raises(SystemExit, match=r"infer: .*k \(--k\) must be >= 1"):
        infer(["--k", "0"])
    with pytest.raises(SystemExit, match="tasks.limitt"):
        infer(["tasks.limitt=3"])


def test_a_source_is_loaded_through_the_registry_with_the_arguments_it_takes(tmp_path, capsys):
    (tmp_path / "dbs").mkdir()
    (tmp_path / "t.jsonl").write_text("")
    src = TaskSource("jsonl", str(tmp_path / "t.jsonl"), split="dev", db_root=str(tmp_path / "dbs"))
    assert src.load().tasks == ()  # split is not a jsonl argument: not passed
    with pytest.raises(SystemExit, match="infer: .*/nonexistent.yaml"):
        infer(["--config", "/nonexistent.yaml"])
    assert infer(["tasks.path=/nonexistent.jsonl"]) == 2
    assert "infer: tasks.path: /nonexistent.jsonl does not exist" in capsys.readouterr().err
