"""jobs.report: figures that have data are written as valid PNGs, absent data skips a figure,
garbled metrics lines are skipped, a missing results.json is a clear FileNotFoundError."""

import json

import pytest

from jobs.report import load_series, main, metrics_files, write_figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _summary(success, ci=True):
    s = {"success": success, "scored": 8, "success_critic": 0.0, "success_text2sql": success}
    if ci:
        s["success_ci95"] = [max(0.0, success - 0.2), min(1.0, success + 0.2)]
    return s


def _results(tmp_path, variants=(None,), spider=True):
    rows = [{"name": "base (smollm2-135m)", "seconds": 1.0,
             "eval": {"single": _summary(0.0), "agentic": _summary(0.0, ci=False)}, "change": {}}]
    for v in variants:
        for i, name in enumerate(["+ stage1 reasoning SFT", "+ stage3 reasoning GRPO"]):
            ev = {"single": _summary(0.1 * (i + 1))}
            if spider:
                ev["spider"] = _summary(0.05 * (i + 1))
            row = {"name": name, "seconds": 2.0, "eval": ev, "change": {}}
            if v:
                row["variant"] = v
            rows.append(row)
    data = {"model": "smollm2-135m", "held_out": "synth", "seconds": 9.0, "rows": rows}
    (tmp_path / "results.json").write_text(json.dumps(data))


def _metrics(folder, stages=("stage1", "stage2", "stage3", "stage4"), garbled=False):
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for stage in stages:
        for step in range(1, 4):
            row = {"stage": stage, "step": float(step), "time": 1.0}
            if stage in ("stage1", "stage2"):
                row["loss"] = 1.0 / step
            else:
                row.update(reward_mean=0.1 * step, pass_rate=0.1 * step, reward_format=0.5,
                           reward_executed=0.4, reward_result=0.1 * step, response_tokens_mean=60.0,
                           groups_trained=2, groups_drawn=3)
            lines.append(json.dumps(row))
    if garbled:
        lines[1:1] = ['{"stage": "stage1", "step": 9, "loss": 0.', "[1, 2]", "", "not json",
                      '{"step": 4, "loss": 0.5}', '{"stage": "stage1", "step": "x", "loss": 0.5}']
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _assert_pngs(paths, names):
    assert sorted(p.name for p in paths) == sorted(names)
    for p in paths:
        assert p.is_file() and p.read_bytes()[:8] == PNG_MAGIC


def test_all_figures_single_run_with_spider(tmp_path):
    _results(tmp_path)
    _metrics(tmp_path)
    paths = write_figures(tmp_path)
    assert all(p.parent == tmp_path / "curves" for p in paths)
    _assert_pngs(paths, ["eval_success.png", "rl_curves.png", "sft_loss.png"])


def test_variants_read_one_level_below_and_out_dir(tmp_path):
    _results(tmp_path, variants=("zeno", "talon"))
    _metrics(tmp_path / "zeno")
    _metrics(tmp_path / "talon", stages=("stage3",))
    assert set(metrics_files(tmp_path)) == {"zeno", "talon"}
    series = load_series(tmp_path)
    assert series["talon"]["stage3"]["reward_mean"][2.0] == pytest.approx(0.2)
    assert "stage1" not in series["talon"]
    out = tmp_path / "figs" / "deep"
    _assert_pngs(write_figures(tmp_path, out), ["eval_success.png", "rl_curves.png", "sft_loss.png"])
    assert all((out / n).is_file() for n in ("eval_success.png", "rl_curves.png", "sft_loss.png"))


def test_absent_data_skips_figures(tmp_path):
    _results(tmp_path, spider=False)
    # no metrics.jsonl at all: only the eval figure
    _assert_pngs(write_figures(tmp_path), ["eval_success.png"])
    # SFT stages only: no RL figure
    _metrics(tmp_path, stages=("stage1",))
    _assert_pngs(write_figures(tmp_path, tmp_path / "b"), ["eval_success.png", "sft_loss.png"])
    assert not (tmp_path / "b" / "rl_curves.png").exists()
    # no evaluated row: no eval figure
    (tmp_path / "results.json").write_text(json.dumps({"model": "m", "rows": [{"name": "x", "eval": {}}]}))
    _assert_pngs(write_figures(tmp_path, tmp_path / "c"), ["sft_loss.png"])
    assert not (tmp_path / "c" / "eval_success.png").exists()


def test_garbled_metrics_lines_are_skipped(tmp_path):
    _results(tmp_path)
    _metrics(tmp_path, stages=("stage1", "stage3"), garbled=True)
    series = load_series(tmp_path)
    (label,) = series
    assert sorted(series[label]["stage1"]["loss"]) == [1.0, 2.0, 3.0]
    _assert_pngs(write_figures(tmp_path), ["eval_success.png", "rl_curves.png", "sft_loss.png"])


def test_missing_results_json_raises_naming_the_path(tmp_path):
    _metrics(tmp_path)
    with pytest.raises(FileNotFoundError, match="results.json"):
        write_figures(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path)])
    assert exc.value.code == 2


def test_cli_prints_written_paths(tmp_path, capsys):
    _results(tmp_path)
    _metrics(tmp_path, stages=("stage4",))
    assert main([str(tmp_path), "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(printed) == sorted(str(tmp_path / "o" / n) for n in ("eval_success.png", "rl_curves.png"))


def test_a_registered_stage_gets_its_trainers_curves_with_no_edit_here(tmp_path, monkeypatch):
    """The figures follow the stage registry: a new GRPO stage's curves are drawn (a hard-coded
    stage list would drop them silently), in the figure of its trainer."""
    from curriculum.stages import STAGES, StageSpec
    from jobs.report import stages_of

    monkeypatch.setitem(STAGES, "stage5", StageSpec("stage5", "more GRPO", "agentic", STAGES["stage4"].build, "grpo"))
    assert stages_of("grpo") == ("stage3", "stage4", "stage5") and stages_of("sft") == ("stage1", "stage2")
    _results(tmp_path, spider=False)
    _metrics(tmp_path, stages=("stage5",))
    _assert_pngs(write_figures(tmp_path), ["eval_success.png", "rl_curves.png"])
