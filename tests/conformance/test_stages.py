"""Conformance over every registered curriculum stage (``curriculum.stages.STAGES``, read at
collection): its config parses from the defaults alone (no shipped YAML needed), its trainer is
registered (``jobs.train.TRAINERS``) and trains the stage's mode (``Trainer.modes``), and ``jobs.report`` finds its per-step metrics and draws
them in its trainer's figure (a stage missing from the report's stage lists would vanish from the
curves silently). The shipped YAML files, entry modules and docs rows are held to the registry by
tests/unit/test_stage_registry.py."""

from __future__ import annotations

import json

import pytest

from curriculum.stages import STAGES

NAMES = list(STAGES)


def trainer_problems(spec) -> list[str]:
    """Why ``spec``'s trainer cannot train it: not registered, or not for the stage's mode."""
    from jobs.train import TRAINERS

    trainer = TRAINERS.get(spec.trainer)
    if trainer is None:
        return [f"trainer {spec.trainer!r} is not in jobs.train.TRAINERS (known: {', '.join(TRAINERS)})"]
    if trainer.modes and spec.mode not in trainer.modes:
        return [f"trainer {spec.trainer!r} trains {'/'.join(trainer.modes)} stages, not a {spec.mode} one"]
    return []


@pytest.mark.parametrize("name", NAMES)
def test_the_stage_config_parses_from_the_defaults(name):
    from curriculum.config import load_stage_config

    problems = trainer_problems(STAGES[name])
    assert not problems, f"stage {name}: " + "; ".join(problems)
    cfg = load_stage_config(None, [f"stage={name}"])
    assert cfg.stage == name


def test_the_suite_names_an_unknown_trainer_and_one_for_another_mode():
    from curriculum.stages import StageSpec, build_reasoning_sft

    assert trainer_problems(StageSpec("x", "x", "single", build_reasoning_sft, "polish"))[0].startswith(
        "trainer 'polish' is not in jobs.train.TRAINERS (known: grpo, sft")
    assert trainer_problems(StageSpec("x", "x", "single", build_reasoning_sft, "gateway")) == [
        "trainer 'gateway' trains agentic stages, not a single one"]


@pytest.mark.parametrize("name", NAMES)
def test_the_report_draws_the_stages_curves(name, tmp_path):
    from jobs.report import stages_of, write_figures
    from jobs.train import TRAINERS

    trainer = STAGES[name].trainer
    if trainer not in TRAINERS:
        pytest.fail(f"stage {name}: trainer {trainer!r} is not in jobs.train.TRAINERS: no curves to draw")
    curves = TRAINERS[trainer].curves
    assert name in stages_of(trainer), f"stage {name}: jobs.report does not list it among {trainer}'s stages"
    (tmp_path / "results.json").write_text(json.dumps({"rows": []}))
    rows = [{"stage": name, "step": step, **{m: 0.1 * step for m in curves.metrics}} for step in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = {p.name for p in write_figures(tmp_path)}
    assert curves.file in written, f"stage {name}: its {trainer} curves were not drawn (written: {sorted(written)})"
    others = {t.curves.file for k, t in TRAINERS.items() if t.curves.file != curves.file}
    assert not written & others, f"stage {name}: drawn in another trainer's figure"
