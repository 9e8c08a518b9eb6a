"""scripts/setup.sh on bad machines: a one-line error naming what is missing and how to fix it, a
non-zero exit, and never 'setup: ok' for a half-made environment. Each case fails before anything
slow happens (no install is attempted against the real registry)."""
from __future__ import annotations

import os
import re
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


def _stub_tools(tmp_path: Path) -> tuple[Path, Path]:
    """A stub uv (at the path setup.sh bootstraps it to) that records each call's arguments, one
    line each, and whose ``venv`` makes a stub interpreter that imports anything; a stub ldconfig
    that reports the ODBC library. Returns (the SQLRL_TOOLS folder, the PATH folder)."""
    log = tmp_path / "uv-calls.txt"
    tools = tmp_path / "tools"
    uv = tools / "uv-0.13.9" / "bin" / "uv"  # scripts/common.sh: SQLRL_UV_VERSION
    uv.parent.mkdir(parents=True)
    python = '#!/bin/sh\n[ "$1" = --version ] && echo "Python 3.11.0"\nexit 0\n'
    _exe(uv, f'echo "$*" >> {log}\n'
             'if [ "$1" = venv ]; then for a; do dir=$a; done; mkdir -p "$dir/bin"\n'
             f"  printf '{python}' > \"$dir/bin/python\"; chmod +x \"$dir/bin/python\"; fi\nexit 0\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "ldconfig", 'echo "libodbc.so.2 (libc6,x86-64) => /usr/lib/libodbc.so.2"\n')
    return tools, bin_dir


def _sync_find_links(tmp_path: Path, wheels: Path) -> tuple[list[str], subprocess.CompletedProcess]:
    tools, bin_dir = _stub_tools(tmp_path)
    out = _setup(tmp_path, PYTHON=sys.executable, SQLRL_TOOLS=str(tools), PIP_FIND_LINKS=str(wheels),
                 PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert out.returncode == 0, out.stdout + out.stderr
    syncs = [line.split() for line in (tmp_path / "uv-calls.txt").read_text().splitlines()
             if line.startswith("pip sync")]
    assert len(syncs) == 1, syncs
    args = syncs[0]
    assert "locks/cpu.txt" in args
    return [args[i + 1] for i, a in enumerate(args) if a == "--find-links"], out


def test_the_local_cpu_torch_wheel_is_used_when_the_folder_has_it(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    links, out = _sync_find_links(tmp_path, wheels)
    assert links == [str(wheels)]
    assert "download.pytorch.org" not in out.stdout + out.stderr


def test_without_the_local_wheel_torch_comes_from_pytorchs_cpu_index(tmp_path: Path) -> None:
    """No route to that index here: the command line is what is checked. The lock pins torch with
    its sha256 (uv checks it), so only the same file can install."""
    empty = tmp_path / "wheels"
    empty.mkdir()
    (empty / "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")  # another version
    links, out = _sync_find_links(tmp_path, empty)
    assert links == ["https://download.pytorch.org/whl/cpu/torch/"]
    assert "https://download.pytorch.org/whl/cpu/torch/" in out.stderr and str(empty) in out.stderr
    assert "setup: ok" in out.stdout
    lock = (ROOT / "locks/cpu.txt").read_text()
    pinned = re.search(r"^torch==(\S+) \\\n((?:\s+--hash=sha256:\w+ ?\\?\n)+)", lock, re.M)
    assert pinned and "--hash=sha256:" in pinned.group(2)
    # the wheel setup.sh looks for is the lock's version (a torch bump in the lock must change both)
    assert f"SQLRL_TORCH_WHEEL=torch-{pinned.group(1)}\n" in (ROOT / "scripts/common.sh").read_text()
