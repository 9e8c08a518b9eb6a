"""The main job runs the whole curriculum end to end (the tiny model, micro sizes): base
evaluation, stages 1-4 each from the previous checkpoint, the results table, checkpoints a
later step can load, metrics in every sink."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MICRO = ["data.n_per_domain=20", "data.train_size=6", "data.eval_size=4", "sft.epochs=1", "sft.batch_size=3",
         "rl.steps=1", "rl.tasks_per_step=2", "rl.group_size=2", "rollout.max_new_tokens=24"]


@pytest.mark.timeout(1200)
def test_main_job_runs_the_four_stages_and_prints_the_table(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "jobs.main", "--model", "tiny", "--run-dir", str(run),
                           "--eval-modes", "single,agentic",
                           f"data.synth_dir={tmp_path / 'synth'}", *MICRO],
                          cwd=ROOT, capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Success on held-out tasks: generated" in proc.stdout
    assert "5/5 phases" in proc.stderr  # the progress display's final state
    assert proc.stderr.count("eval (agentic)") == 5  # every evaluation reports as it ends
    results = json.loads((run / "results.json").read_text())
    names = [r["name"] for r in results["rows"]]
    assert names[0] == "base (tiny)" and len(names) == 5 and "stage4" in names[-1]
    for row in results["rows"]:
        assert set(row["eval"]) == {"single", "agentic"}  # --eval-modes single,agentic
        assert all(e["n"] == 4 for e in row["eval"].values())
    md = (run / "results.md").read_text()
    assert md.startswith("| model |") and "(format " in md

    from transformers import AutoModelForCausalLM

    for stage in ("stage1", "stage2", "stage3", "stage4"):
        summary = json.loads((run / stage / "summary.json").read_text())
        assert summary["steps"] >= 1 and summary["checkpoint"] == str(run / stage / "final")
        assert (run / stage / "config.yaml").is_file()
        assert (run / "curves" / f"{stage}.png").is_file()
    stage2 = json.loads((run / "stage2" / "summary.json").read_text())
    assert stage2["config"]["model"]["init"] == "previous"  # started from stage 1's checkpoint
    AutoModelForCausalLM.from_pretrained(run / "stage4" / "final")  # loadable for serving
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] in ("stage3", "stage4")]
    assert rl and all({"reward_mean", "pass_rate", "time_rollout_s", "time_update_s", "time_sync_s",
                       "policy_version"} <= set(r) for r in rl)
    assert any("loss" in r for r in rows if r["stage"] == "stage1")


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
