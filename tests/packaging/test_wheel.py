"""What installing sqlrl puts into site-packages: only the ``sqlrl`` package (docs/architecture.md,
"Packaging"). The app folders (actors, curriculum, jobs, serve, bench) run from the checkout or
the Ray job's working directory and must never be installed as top-level names that could shadow
another project's ``jobs`` or ``serve``.

The wheel is built offline with the environment's setuptools (the project's build backend, no
build isolation) from a copy of the checkout, so the checkout gets no build/ or egg-info folder.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP = {".git", ".venv", ".cache", "runs", "build", "dist", "__pycache__", ".pytest_cache"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    pytest.importorskip("setuptools", reason="the build backend (setuptools) is not installed")
    src = tmp_path_factory.mktemp("src") / "sqlrl"
    shutil.copytree(ROOT, src, ignore=lambda folder, names: [
        n for n in names if n in SKIP or n.endswith(".egg-info")])
    out = src / "dist"
    code = "import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return zipfile.ZipFile(out / proc.stdout.strip().splitlines()[-1])


def test_the_wheel_installs_only_sqlrl(wheel):
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {"sqlrl"}, sorted(tops)
    (info,) = dist_info
    assert wheel.read(f"{info}/top_level.txt").decode().split() == ["sqlrl"]


def test_the_wheel_holds_every_module_of_sqlrl_and_its_data(wheel):
    names = set(wheel.namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "sqlrl").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules - names == set()
    assert "sqlrl/policy/tiny_corpus.jsonl.gz" in names  # read by sqlrl.policy.tiny at run time
