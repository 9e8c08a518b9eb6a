"""The layer order of ``sqlrl/`` (docs/architecture.md, "Layers"): a unit imports only units of a
lower tier, never one of its own tier or above -- so a back edge (e.g. ``eval`` importing the data
generator, ``policy`` importing ``tasks``) fails here, wherever the import sits (module level, inside
a function, under ``TYPE_CHECKING``); and ``sqlrl`` never imports the application folders above it
(actors, bench, curriculum, jobs, serve).

A unit is a top-level package or module of ``sqlrl`` (``db``, ``tools``, ``config.py`` -> ``config``).
``synth`` (the generated data) sits above ``eval``: it verifies the debugging tasks it generates
with the evaluator (``run_critic``), while ``eval`` reads only ``tasks`` (types, loaders).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SQLRL = Path(__file__).resolve().parents[2] / "sqlrl"

# lowest first; a unit may import units of strictly lower tiers only
TIERS: tuple[frozenset[str], ...] = (
    frozenset({"memory"}),  # the process's heap and peak memory (the learner and vLLM's close free through it)
    frozenset({"db", "policy", "config", "metrics"}),  # foundations, independent of each other
    frozenset({"tools", "learn"}),  # tools: the SQL tools on db; learn: the learner on policy
    frozenset({"tasks"}),  # task types, io, schema, loaders, task kinds
    frozenset({"eval"}),  # judging by execution
    frozenset({"synth"}),  # data generated and verified by eval
    frozenset({"suites"}),  # test-suite match: variants from synth, distilled per gold
    frozenset({"rewards"}),  # scorers on the judge (which checks test suites)
    frozenset({"agent"}),  # the loop: policy + tools + tasks + rewards
    frozenset({"rl"}),  # the GRPO step loop over rollout/score/update callables (on learn's group filters)
    frozenset({"gateway"}),  # external agents: traces, the training sequences and step built from them
)
RANK = {unit: i for i, tier in enumerate(TIERS) for unit in tier}
APP_FOLDERS = {"actors", "bench", "curriculum", "jobs", "serve"}  # above sqlrl; never imported by it


def unit_of(module: str) -> str | None:
    """``sqlrl.synth.bugs`` -> ``synth``; ``sqlrl.db.sessions.pool`` -> ``db``; ``sqlrl`` -> None."""
    parts = module.split(".")
    if parts[0] != "sqlrl" or len(parts) < 2:
        return None
    return parts[1]


def module_name(path: Path, root: Path = SQLRL) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path = SQLRL) -> list[tuple[int, str]]:
    """Every ``sqlrl`` module ``path`` imports (absolute or relative), with its line."""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            # ``from . import x`` / ``from sqlrl import tasks``: the names may be sub-modules
            out += [(node.lineno, f"{target}.{alias.name}") for alias in node.names
                    if not node.module or target.count(".") < 1]
    return [(line, m) for line, m in out if m.split(".")[0] in {"sqlrl"} | APP_FOLDERS]


def back_edges(root: Path = SQLRL) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        src = unit_of(module_name(path, root))
        if src is None:
            continue
        for line, target in imported_modules(path, root):
            if target.split(".")[0] in APP_FOLDERS:
                found.append(f"{path.relative_to(root.parent)}:{line}: {src} imports the application "
                             f"folder {target} (sqlrl is the layer below all of them)")
                continue
            dst = unit_of(target)
            if dst is None or dst == src:
                continue
            if src not in RANK or dst not in RANK:
                found.append(f"{path.relative_to(root.parent)}:{line}: {src} -> {dst} (a unit not "
                             f"in TIERS: place it in the layer order)")
            elif RANK[dst] >= RANK[src]:
                found.append(f"{path.relative_to(root.parent)}:{line}: {src} (tier {RANK[src]}) "
                             f"imports {target} ({dst}, tier {RANK[dst]})")
    return found


def test_every_unit_of_sqlrl_has_a_tier():
    units = {unit_of(module_name(p)) for p in SQLRL.rglob("*.py")} - {None}
    assert units <= set(RANK), f"place these in TIERS (and docs/architecture.md): {units - set(RANK)}"


def test_sqlrl_has_no_back_edge():
    assert back_edges() == []


def test_a_back_edge_is_found(tmp_path):
    """The checker itself: an import from a lower tier to a higher one (relative or absolute,
    inside a function) is reported; the same import in the other direction is not."""
    pkg = tmp_path / "sqlrl"
    for sub in ("db", "synth", "eval", "policy"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "eval" / "ok.py").write_text("from sqlrl.db import open_session\nfrom ..tasks import types\n")
    (pkg / "synth" / "gen.py").write_text("def f():\n    from ..eval import critic\n")
    (pkg / "policy" / "tiny.py").write_text("def g():\n    from ..synth import gen\n")
    (pkg / "db" / "x.py").write_text("import sqlrl.eval.critic\n")
    (pkg / "eval" / "app.py").write_text("def h():\n    from jobs.runtime import Runtime\n")
    found = back_edges(pkg)
    assert len(found) == 3, found
    assert any("sqlrl/eval/app.py:2: eval imports the application folder jobs.runtime" in f for f in found)
    assert any("sqlrl/policy/tiny.py:2: policy (tier 1) imports sqlrl.synth" in f for f in found)
    assert any("sqlrl/db/x.py:1: db (tier 1) imports sqlrl.eval.critic" in f for f in found)


@pytest.mark.parametrize("module, unit", [("sqlrl.synth.bugs", "synth"),
                                          ("sqlrl.tasks.schema", "tasks"), ("sqlrl.config", "config"),
                                          ("sqlrl", None), ("sqlglot", None)])
def test_unit_of(module, unit):
    assert unit_of(module) == unit
