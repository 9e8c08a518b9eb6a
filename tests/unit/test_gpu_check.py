"""scripts/gpu_check.py on a machine without a GPU (every CI machine): a clear refusal, exit 2;
a module the machine lacks is reported as a skip naming it, never as a pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
