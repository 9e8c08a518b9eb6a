"""A stage job killed by a signal mid-run resumes from its newest checkpoint (``--resume``) and
ends with the very weights of a run never stopped (bitwise: the in-process learner, same seeds),
with the same per-step metrics: SFT (stage 1: the data position inside an epoch's shuffle) and
GRPO (stage 3 with dynamic sampling: the draw cursor, the metrics rows so far). The kill waits on
the checkpoint's loop-state file, the last file a checkpoint writes, never on a clock."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.init=tiny", "data.n_per_domain=20", "data.train_size=12", "eval.enabled=false"]
STAGES = {
    "stage1": ("jobs.stage1_reasoning_sft", ["sft.batch_size=2", "sft.epochs=2", "checkpoint.every_steps=2"], 12),
    "stage3": ("jobs.stage3_reasoning_rl", ["rl.steps=4", "rl.tasks_per_step=2", "rl.group_size=2",
                                            "rl.sampling_rounds=2", "rollout.max_new_tokens=12",
                                            "rl.reward=hybrid_single_shaped", "checkpoint.every_steps=1"], 4),
}


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    from sqlrl.synth.dataset import build_default_dataset

    root = tmp_path_factory.mktemp("synth")
    build_default_dataset(root, seed=0, n_per_domain=20)
    return root


def _command(stage: str, run_dir: Path, synth: Path, *extra: str) -> list[str]:
    module, args, _ = STAGES[stage]
    return [sys.executable, "-m", module, "--config", f"jobs/configs/{stage}.yaml", f"run_dir={run_dir}",
            f"data.synth_dir={synth}", *TINY, *args, *extra]


def _weights(final: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(final / "model.safetensors"))


def _steps(run_dir: Path, stage: str) -> list[dict]:
    history = json.loads((run_dir / stage / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r for r in rows}  # a step logged again after the resume replaces the first
    assert len(by_step) == history["steps"]
    return [{k: v for k, v in by_step[s].items() if not k.startswith("time") and k not in ("tokens_per_s",
                                                                                          "step_time_s", "update_s")}
            for s in sorted(by_step)]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("stage", list(STAGES))
def test_a_stage_killed_by_a_signal_resumes_to_the_weights_of_an_unstopped_run(stage, synth, tmp_path):
    import torch

    steps = STAGES[stage][2]
    whole = subprocess.run(_command(stage, tmp_path / "whole", synth), cwd=ROOT, capture_output=True, text=True,
                           timeout=900)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert not (tmp_path / "whole" / stage / "checkpoints").exists()  # final/ supersedes them

    killed = tmp_path / "killed"
    mark = killed / stage / "checkpoints" / "step-00000002" / "loop_state.json"
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(_command(stage, killed, synth), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 900
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)  # polling the file the checkpoint writes last
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert mark.exists(), (tmp_path / "killed.log").read_text()[-3000:]
    assert proc.returncode == -signal.SIGKILL  # it was still running: killed mid-stage
    assert not (killed / stage / "final").exists() and not (killed / stage / "summary.json").exists()

    resumed = subprocess.run(_command(stage, killed, synth, "--resume"), cwd=ROOT, capture_output=True, text=True,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{stage}: resuming after step " in resumed.stderr
    assert f"{stage} step 1/{steps}" not in resumed.stderr  # the steps before the checkpoint are not run again

    a, b = _weights(tmp_path / "whole" / stage / "final"), _weights(killed / stage / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    summary_a = json.loads((tmp_path / "whole" / stage / "summary.json").read_text())
    summary_b = json.loads((killed / stage / "summary.json").read_text())
    assert summary_a["steps"] == summary_b["steps"] == steps
    assert summary_a["training"] == summary_b["training"]
    assert _steps(tmp_path / "whole", stage) == _steps(killed, stage)
