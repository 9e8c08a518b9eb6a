"""The main job runs the whole curriculum end to end (the tiny model, micro sizes): base
evaluation, stages 1-4 each from the previous checkpoint, the results table, checkpoints a
later step can load, metrics in every sink. Its output through pipes (as in CI or a Ray job log)
is plain: no progress bars, heartbeat lines, the table once in full. Running again into the same
run dir is refused, by the main job and by a stage job, with the ways out named."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MICRO = ["data.n_per_domain=20", "data.train_size=6", "data.eval_size=4", "sft.epochs=1", "sft.batch_size=3",
         "rl.steps=1", "rl.tasks_per_step=2", "rl.group_size=2", "rollout.max_new_tokens=24",
         "rl.sampling_rounds=1"]  # the tiny model's rewards are flat: one draw, the update path still runs


@pytest.mark.timeout(1200)
def test_main_job_runs_the_four_stages_and_prints_the_table(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "SQLRL_HEARTBEAT_S": "0.05"}  # heartbeats at least every 0.05 s in long phases
    proc = subprocess.run([sys.executable, "-m", "jobs.main", "--model", "tiny", "--run-dir", str(run),
                           "--eval-modes", "single,agentic",
                           f"data.synth_dir={tmp_path / 'synth'}", *MICRO],
                          cwd=ROOT, capture_output=True, text=True, timeout=1100, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("Success on held-out tasks: generated") == 1  # the table, once, at the end
    assert "Success on held-out tasks" not in proc.stderr
    assert "main: 5/5 phases done" in proc.stderr  # one line per finished phase
    assert proc.stderr.count("eval (agentic)") - proc.stderr.count("[heartbeat] eval (agentic)") == 5
    # not a terminal: plain lines, no progress bars (transformers' "Loading weights", tqdm)
    assert "\r" not in proc.stdout + proc.stderr and "Loading weights" not in proc.stderr
    assert "[heartbeat] " in proc.stderr and " s elapsed" in proc.stderr
    results = json.loads((run / "results.json").read_text())
    names = [r["name"] for r in results["rows"]]
    assert names[0] == "base (tiny)" and len(names) == 5 and "stage4" in names[-1]
    for row in results["rows"]:
        assert set(row["eval"]) == {"single", "agentic"}  # --eval-modes single,agentic
        assert all(e["n"] == 4 for e in row["eval"].values())
    md = (run / "results.md").read_text()
    assert md.startswith("| model |") and "(format " in md
    assert md.split("\nHeld-out")[0].strip() in proc.stdout  # printed plainly: no row wrapped or cut

    from transformers import AutoModelForCausalLM

    for stage in ("stage1", "stage2", "stage3", "stage4"):
        summary = json.loads((run / stage / "summary.json").read_text())
        assert summary["steps"] >= 1 and summary["checkpoint"] == str(run / stage / "final")
        assert (run / stage / "config.yaml").is_file()
        assert (run / "curves" / f"{stage}.png").is_file()
    stage2 = json.loads((run / "stage2" / "summary.json").read_text())
    assert stage2["config"]["model"]["init"] == "previous"  # started from stage 1's checkpoint
    AutoModelForCausalLM.from_pretrained(run / "stage4" / "final")  # loadable for serving
    # the command that serves it, printed at the end (docs/serving.md)
    assert f"python -m jobs.serve --model zeno={run / 'stage4' / 'final'} --database " in proc.stdout
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] in ("stage3", "stage4")]
    assert rl and all({"reward_mean", "pass_rate", "time_rollout_s", "time_update_s", "time_sync_s",
                       "policy_version"} <= set(r) for r in rl)
    assert any("loss" in r for r in rows if r["stage"] == "stage1")

    # the same run dir again: refused before any work, by the main job and by a stage job
    before = (run / "stage4" / "summary.json").read_text()
    again = subprocess.run([sys.executable, "-m", "jobs.main", "--model", "tiny", "--run-dir", str(run)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode != 0 and "already holds results of stage1, stage2, stage3, stage4" in again.stderr
    assert "--overwrite" in again.stderr and "--run-dir" in again.stderr and "Traceback" not in again.stderr
    stage4 = subprocess.run([sys.executable, "-m", "jobs.stage4_agentic_rl", "--config", "jobs/configs/stage4.yaml",
                             f"run_dir={run}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert stage4.returncode != 0 and "already holds a result" in stage4.stderr
    assert "overwrite=true" in stage4.stderr and "run_dir=" in stage4.stderr
    assert (run / "stage4" / "summary.json").read_text() == before


def test_a_bad_override_is_a_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jobs.stage1_reasoning_sft", "--config",
                           "jobs/configs/stage1.yaml", "sft.epoch=2"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "unknown config key(s) sft.epoch" in proc.stderr


def test_stage2_without_a_stage1_checkpoint_says_what_to_do(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jobs.stage2_tooluse_sft", "--config", "jobs/configs/stage2.yaml",
                           f"run_dir={tmp_path}", f"data.synth_dir={tmp_path / 'synth'}", "data.n_per_domain=20",
                           "data.domains=[shop]"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "run stage1 first" in proc.stderr


@pytest.mark.timeout(600)
def test_dynamic_sampling_draws_more_groups_when_rewards_are_flat(tmp_path):
    """rl.sampling_rounds=4 on the random tiny model (rewards all 0, so no group is informative):
    every step draws four batches of groups and trains on none. The 6 training tasks cycle, so a
    task comes back in the fourth draw: it is a new group there (a group = one task in one draw)."""
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "jobs.main", "--model", "tiny", "--run-dir", str(run),
                           "--stages", "stage3", "model.init=tiny", f"data.synth_dir={tmp_path / 'synth'}",
                           *MICRO, "rl.sampling_rounds=4", "rl.steps=2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=550)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "sampling_draws" in s]
    assert len(steps) == 2
    for s in steps:  # 2 tasks x 2 samples per draw
        assert (s["sampling_draws"], s["groups_drawn"], s["trajectories"]) == (4, 8, 16), s
        assert s["groups_trained"] == 0 and s["reward_mean"] == 0.0


SPIDER = ROOT.parent / "shared" / "data" / "spider"


@pytest.mark.timeout(1200)
def test_the_long_preset_trains_zeno_and_talon_and_draws_the_figures(tmp_path):
    """The README's long-preset command at micro sizes (the tiny model; the preset's sizes are
    overridden): both variants in their own folders, Talon trained on debugging only but scored on
    both kinds, its first stage compared with the base model, the Spider subset (when the shared
    data is there) for every row, and the figures linked from results.md."""
    run = tmp_path / "long"
    spider = ["--spider-eval", str(SPIDER), "--spider-size", "4"] if (SPIDER / "dev.json").is_file() else []
    proc = subprocess.run([sys.executable, "-m", "jobs.main", "--preset", "long", "--model", "tiny",
                           "--run-dir", str(run), *spider, f"data.synth_dir={tmp_path / 'synth'}", *MICRO],
                          cwd=ROOT, capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "main: 9/9 phases done" in proc.stderr
    rows = json.loads((run / "results.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == [""] + ["zeno"] * 4 + ["talon"] * 4
    for variant, kinds in (("zeno", {"text2sql", "critic"}), ("talon", {"critic"})):
        summary = json.loads((run / variant / "stage1" / "summary.json").read_text())
        assert set(summary["data"]["train"]) == kinds  # Talon trains on debugging only ...
        assert set(summary["data"]["eval"]) == {"text2sql", "critic"}  # ... and is scored on both kinds
        assert (run / variant / "stage4" / "final" / "config.json").is_file()
    talon1 = next(r for r in rows if r["name"] == "+ talon stage1 reasoning SFT")
    assert talon1["change"]["single"]["vs"] == "base (tiny)"
    if spider:
        assert all(r["eval"]["spider"]["n"] == 4 for r in rows)
    md = (run / "results.md").read_text()
    for figure in ("eval_success", "rl_curves", "sft_loss"):
        assert (run / "curves" / f"{figure}.png").is_file() and f"(curves/{figure}.png)" in md
