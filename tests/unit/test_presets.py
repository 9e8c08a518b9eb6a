"""jobs.presets: the shipped presets load, their overrides are valid stage config, and a bad
preset file is refused with a message naming what is wrong."""

from __future__ import annotations

import pytest

import jobs.presets as presets
from curriculum.config import load_stage_config
from curriculum.stages import STAGES


def test_default_preset_changes_nothing():
    p = presets.load_preset("default", STAGES)
    assert p.variant_names() == [""] and p.overrides("stage1") == [] and p.spider_eval == 0


def test_long_preset_builds_valid_configs_for_every_stage_of_every_variant():
    p = presets.load_preset("long", STAGES)
    assert p.variant_names() == ["zeno", "talon"] and p.run_dir == "runs/long" and p.spider_eval == 100
    for v in p.variant_names():
        for stage in STAGES:
            cfg = load_stage_config(STAGES[stage].config_path(), [f"stage={stage}", *p.overrides(stage, v)])
            assert cfg.data.eval_size >= 64 and cfg.data.held_out_mixture == {"text2sql": 0.5, "critic": 0.5}
            assert cfg.data.mixture == ({"critic": 1.0} if v == "talon" else {"text2sql": 0.5, "critic": 0.5})
    stage3 = load_stage_config(STAGES["stage3"].config_path(), ["stage=stage3", *p.overrides("stage3", "zeno")])
    assert stage3.rl.sampling_rounds == 2 and stage3.rl.group_size == 8 and stage3.rl.temperature == 0.7
    # Zeno's stage 3 is J (16 steps over 384 tasks); Talon's the shared 8 steps over 96
    talon3 = load_stage_config(STAGES["stage3"].config_path(), ["stage=stage3", *p.overrides("stage3", "talon")])
    assert (stage3.rl.steps, stage3.data.train_size) == (16, 384) and (talon3.rl.steps, talon3.data.train_size) == (8, 96)
    assert talon3.rl.probe_samples == stage3.rl.probe_samples == 4
    # the learner scores the rollouts at the temperature they were sampled at (was 1.0 against 0.7)
    assert stage3.rl.loss.temperature == 0.7
    stage2 = load_stage_config(STAGES["stage2"].config_path(), ["stage=stage2", *p.overrides("stage2", "talon")])
    assert stage2.teacher.explore == 0 and stage2.teacher.brief and stage2.sft.replay == 1.0
    assert stage2.model.schema_style == "compact"  # every stage of the preset, so each starts from a match


def test_later_overrides_win():
    p = presets.Preset("x", variants={"a": {"sft.epochs": 5}}, all={"sft.epochs": 1, "data.seed": 3},
                       stages={"stage1": {"sft.epochs": 2}})
    cfg = load_stage_config(STAGES["stage1"].config_path(), ["stage=stage1", *p.overrides("stage1", "a")])
    assert cfg.sft.epochs == 5 and cfg.data.seed == 3


def test_a_variant_can_override_one_stage_of_its_own(tmp_path, monkeypatch):
    path = tmp_path / "p.yaml"
    path.write_text("stages: {stage3: {rl.steps: 8, rl.seed: 2}}\n"
                    "variants:\n  a: {sft.epochs: 4, stage3: {rl.steps: 16, data.train_size: 384}}\n  b: {sft.epochs: 5}\n")
    monkeypatch.setitem(presets.PRESETS, "p", path)
    p = presets.load_preset("p", STAGES)
    assert p.variants == {"a": {"sft.epochs": 4}, "b": {"sft.epochs": 5}}
    a3 = load_stage_config(STAGES["stage3"].config_path(), ["stage=stage3", *p.overrides("stage3", "a")])
    b3 = load_stage_config(STAGES["stage3"].config_path(), ["stage=stage3", *p.overrides("stage3", "b")])
    assert (a3.rl.steps, a3.data.train_size, a3.rl.seed, a3.sft.epochs) == (16, 384, 2, 4)
    assert (b3.rl.steps, b3.rl.seed, b3.sft.epochs) == (8, 2, 5) and b3.data.train_size != 384
    a4 = load_stage_config(STAGES["stage4"].config_path(), ["stage=stage4", *p.overrides("stage4", "a")])
    assert a4.rl.steps != 16 and a4.sft.epochs == 4  # the stage-3 block reaches stage 3 only


@pytest.mark.parametrize("text, message", [
    ("bogus: 1\n", "unknown key(s) bogus"),
    ("stages: {stage9: {sft.epochs: 1}}\n", "unknown stage(s) stage9"),
    ("variants: [a, b]\n", "variants must be a mapping"),
    ("variants: {'two words': {}}\n", "needs a plain name"),
    ("- 1\n", "must hold a mapping"),
    ("variants: {a: {stage9: {rl.steps: 1}}}\n", "variant 'a': unknown stage stage9"),
    ("variants: {a: {stage3: [1]}}\n", "variant 'a', stage3: needs a mapping"),
])
def test_a_bad_preset_file_is_refused(tmp_path, monkeypatch, text, message):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    monkeypatch.setitem(presets.PRESETS, "p", path)
    with pytest.raises(ValueError, match="preset 'p'") as exc:
        presets.load_preset("p", STAGES)
    assert message in str(exc.value)


def test_unknown_and_missing_presets(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown preset 'nope'; known: default, long"):
        presets.load_preset("nope")
    monkeypatch.setitem(presets.PRESETS, "gone", tmp_path / "gone.yaml")
    with pytest.raises(ValueError, match="gone.yaml does not exist"):
        presets.load_preset("gone")
