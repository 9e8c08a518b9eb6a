"""scripts/gpu_check.py on a machine without a GPU (every CI machine): a clear refusal, exit 2;
a module the machine lacks is reported as a skip naming it, never as a pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a subprocess that imports torch
def test_without_a_gpu_it_says_so_and_exits_2():
    import torch

    if torch.cuda.is_available():  # pragma: no cover - CI machines have none
        return
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--out", "/dev/null"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA GPU here" in proc.stderr


def test_missing_modules_are_skips(monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: None)
    for check in (gpu_check.grpo, gpu_check.vllm, gpu_check.curriculum):
        try:
            check()
        except gpu_check.Skip as exc:
            assert "install" in str(exc) or "missing" in str(exc) or "GPU lock" in str(exc)
        else:  # pragma: no cover
            raise AssertionError(f"{check.__name__} passed without its modules")


@pytest.mark.slow
def test_the_quick_checks_rehearse_on_the_cpu(tmp_path):
    """--device cpu runs the same check code without a GPU (gloo for NCCL), so a broken check is
    caught here, not in a GPU lease. verl is in the CPU lock, so grpo runs too."""
    import json

    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--out", str(out),
                           "--only", "hf-backend,learner-sft,fsdp2-nccl,grpo,rollout-device"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert "CPU rehearsal" in result["env"]["gpu"] and "CPU rehearsal" in proc.stdout
    assert {r["check"]: r["status"] for r in result["rows"]} == dict.fromkeys(
        ("hf-backend", "learner-sft", "fsdp2-nccl", "grpo", "rollout-device"), "ok")
    assert "gloo" in next(r["detail"] for r in result["rows"] if r["check"] == "fsdp2-nccl")


def test_an_unknown_check_is_refused():
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--only", "hf-backend,nope"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown check(s) nope" in proc.stderr and "hf-backend" in proc.stderr
