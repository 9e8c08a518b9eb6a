"""scripts/setup.sh on bad machines: a one-line error naming what is missing and how to fix it, a
non-zero exit, and never 'setup: ok' for a half-made environment. Each case fails before anything
slow happens (no install is attempted against the real registry)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _exe(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _setup(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SQLRL_", "VIRTUAL_ENV"))}
    base.update(SQLRL_VENV=str(tmp_path / "venv"), SQLRL_TOOLS=str(tmp_path / "tools"))
    base.update(env)
    return subprocess.run(["bash", str(ROOT / "scripts/setup.sh")], capture_output=True, text=True,
                          env=base, timeout=600)


def _failed_with(out: subprocess.CompletedProcess, *words: str) -> str:
    assert out.returncode != 0, out.stdout + out.stderr
    assert "setup: ok" not in out.stdout
    errors = [line for line in out.stderr.splitlines() if line.startswith("setup: error:")]
    assert len(errors) == 1, out.stderr
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


def test_a_python_older_than_3_11_is_refused_by_name(tmp_path: Path) -> None:
    old = _exe(tmp_path / "python3.10", 'if [ "$1" = --version ]; then echo "Python 3.10.12"; exit 0; fi\n'
                                        "exit 1\n")
    _failed_with(_setup(tmp_path, PYTHON=str(old)), "Python 3.10.12", ">= 3.11", "PYTHON=")
    assert not (tmp_path / "venv").exists()


def test_a_missing_python_is_named(tmp_path: Path) -> None:
    _failed_with(_setup(tmp_path, PYTHON=str(tmp_path / "nope")), "no '", "Python >= 3.11")


def test_a_failing_apt_is_reported_with_the_command_to_run(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    _exe(fake / "ldconfig", "exit 0\n")                         # libodbc not found
    _exe(fake / "apt-get", 'echo "E: Unable to locate package tdsodbc" >&2; exit 100\n')
    out = _setup(tmp_path, PATH=f"{fake}:{os.environ['PATH']}", PYTHON=sys.executable)
    _failed_with(out, "apt-get could not install unixodbc tdsodbc", "apt-get install -y unixodbc tdsodbc")


def test_no_registry_for_the_uv_bootstrap_is_reported(tmp_path: Path) -> None:
    out = _setup(tmp_path, PYTHON=sys.executable, PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="",
                 PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_EXTRA_INDEX_URL="", PIP_RETRIES="0",
                 PIP_TIMEOUT="2")
    _failed_with(out, "could not install uv", "package registry reachable")


def test_no_registry_for_the_lock_leaves_the_environment_not_reported_as_done(tmp_path: Path) -> None:
    """uv is there (bootstrapped once), the registry is not: the sync fails, setup says so, exit 1."""
    tools = Path(os.environ.get("SQLRL_TOOLS", ROOT / ".cache" / "tools"))  # where setup.sh put uv
    if not any(tools.glob("uv-*/bin/uv")):
        pytest.skip(f"needs uv bootstrapped by scripts/setup.sh in {tools}")
    out = _setup(tmp_path, PYTHON=sys.executable, SQLRL_TOOLS=str(tools), UV_OFFLINE="1",
                 UV_CACHE_DIR=str(tmp_path / "empty-cache"))
    _failed_with(out, "installing locks/cpu.txt failed", "registry reachable")
    assert (tmp_path / "venv" / "bin" / "python").exists()   # made, but never reported as set up
    shutil.rmtree(tmp_path / "venv")


def test_a_missing_cpu_torch_wheel_names_the_folder(tmp_path: Path) -> None:
    tools = Path(os.environ.get("SQLRL_TOOLS", ROOT / ".cache" / "tools"))
    if not any(tools.glob("uv-*/bin/uv")):
        pytest.skip(f"needs uv bootstrapped by scripts/setup.sh in {tools}")
    empty = tmp_path / "wheels"
    empty.mkdir()
    out = _setup(tmp_path, PYTHON=sys.executable, SQLRL_TOOLS=str(tools), PIP_FIND_LINKS=str(empty))
    _failed_with(out, "torch-2.13.0+cpu", f"PIP_FIND_LINKS={empty}")
