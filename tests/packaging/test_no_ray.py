"""The core package never imports ray: Ray stays at the edges (actors/, jobs/, serve/)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "sqlrl"


def test_no_module_in_sqlrl_imports_ray():
    offenders = []
    for path in CORE.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.relative_to(CORE.parent)}: {n}" for n in names
                          if n == "ray" or n.startswith("ray.")]
    assert offenders == []


@pytest.mark.slow  # a subprocess importing every core module (the slowest fast-tier test measured)
def test_importing_every_core_module_leaves_ray_unloaded():
    modules = sorted(".".join(p.relative_to(CORE.parent).with_suffix("").parts)
                     for p in CORE.rglob("*.py") if p.name != "__main__.py")
    modules = [m.removesuffix(".__init__") for m in modules]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n"
            "    try: importlib.import_module(m)\n"
            "    except ImportError as e:\n"
            "        if 'pyodbc' not in str(e) and 'oracledb' not in str(e): raise\n"
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
