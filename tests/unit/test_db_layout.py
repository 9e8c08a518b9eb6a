"""``sqlrl/db`` is split by subsystem (docs/architecture.md, "Layout"): a shared base (``types``,
``url``, ``statements``, ``dialects/``), then ``sessions/`` (the session engine) and
``provisioning/`` (bases, scratch clones, loading), which do not import each other, then
``leases/`` (the pool's lease protocol), then ``source.py``. This reads every import of every
module (module level and inside functions) and fails on an edge against that order, and on an
import cycle through any module outside the base."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import sqlrl

DB = Path(sqlrl.__file__).parent / "db"
RANK = {"base": 0, "sessions": 1, "provisioning": 1, "leases": 2, "source": 3, "package": 4}
# The server-clone adapters take their connection from the scratch manager (inside connect and
# close, not at import): the one edge from the base up, until the session engine does it.
ALLOWED_UP = {("sqlrl.db.dialects.postgresql", "sqlrl.db.provisioning.scratch"),
              ("sqlrl.db.dialects.mysql", "sqlrl.db.provisioning.scratch")}


def modules() -> dict[str, Path]:
    out = {}
    for f in DB.rglob("*.py"):
        parts = ("sqlrl",) + f.relative_to(DB.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[tuple[str, bool]]]:
    """module -> {(imported sqlrl.db module, at module level?)}"""
    edges: dict[str, set[tuple[str, bool]]] = {}
    for name, f in mods.items():
        pkg = name if f.name == "__init__.py" else name.rsplit(".", 1)[0]
        tree = ast.parse(f.read_text())
        top = {id(n) for n in tree.body}
        out = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    stem = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(stem + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            out |= {(t, id(node) in top) for t in targets if t in mods and t != name}
        edges[name] = out
    return edges


def group(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 2:
        return "package"
    if parts[2] in ("sessions", "provisioning", "leases", "source"):
        return parts[2]
    return "base"  # types, url, statements, dialects/


def test_imports_follow_the_subsystem_order() -> None:
    mods = modules()
    assert {"sqlrl.db.sessions.session", "sqlrl.db.provisioning.scratch", "sqlrl.db.leases.shard",
            "sqlrl.db.source"} <= set(mods)
    bad = []
    for a, targets in imports(mods).items():
        for t, top_level in targets:
            ga, gt = group(a), group(t)
            if ga == gt or RANK[ga] > RANK[gt]:
                continue
            if (a, t) in ALLOWED_UP and not top_level:
                continue
            bad.append(f"{a} ({ga}) imports {t} ({gt})")
    assert not bad, "\n".join(bad)


def test_no_import_cycle_outside_the_base() -> None:
    edges = {a: {t for t, _ in ts} for a, ts in imports(modules()).items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 and any(group(m) != "base" for m in component):
                cycles.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_check_sees_a_back_edge_and_a_cycle(tmp_path, monkeypatch) -> None:
    """The two checks above fail on what they are for (a copy of the tree with one bad import)."""
    import shutil

    copy = tmp_path / "db"
    shutil.copytree(DB, copy, ignore=shutil.ignore_patterns("__pycache__"))
    admin = copy / "provisioning" / "admin.py"
    admin.write_text(admin.read_text() + "\n\ndef _late():\n    from .provision import session_url\n"
                     "    from ..leases.shard import ShardCore\n")
    monkeypatch.setattr(sys.modules[__name__], "DB", copy)
    edges = imports(modules())
    assert ("sqlrl.db.leases.shard", False) in edges["sqlrl.db.provisioning.admin"]
    try:
        test_imports_follow_the_subsystem_order()
    except AssertionError as exc:
        assert "sqlrl.db.provisioning.admin (provisioning) imports sqlrl.db.leases.shard" in str(exc)
    else:
        raise AssertionError("the back edge was not found")
    try:
        test_no_import_cycle_outside_the_base()
    except AssertionError as exc:
        assert "sqlrl.db.provisioning.admin" in str(exc) and "sqlrl.db.provisioning.provision" in str(exc)
    else:
        raise AssertionError("the cycle admin -> provision -> scratch -> admin was not found")
