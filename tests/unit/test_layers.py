"""The layer order of ``sqlrl/`` (docs/architecture.md, "Layers"): a unit imports only units of a
lower tier, never one of its own tier or above -- so a back edge (e.g. ``eval`` importing the data
generator, ``policy`` importing ``tasks``) fails here, wherever the import sits (module level, inside
a function, under ``TYPE_CHECKING``); and ``sqlrl`` never imports the application folders above it
(actors, bench, curriculum, jobs, serve).

Inside ``sqlrl/db`` the same file holds its modules to more: no import cycle between them (all
imports counted, wherever they sit), every ``sqlrl`` import at module level (a function-level
import is how a cycle hides), its subsystems in their order (``DB_TIERS``), and ``importlib`` only
where a descriptor names a module to load (``IMPORT_BY_NAME``).

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


# --- inside sqlrl/db: no import cycle between modules, every sqlrl import at the top --------------
#
# docs/architecture.md ("Layout", sqlrl/db): the shared base (types, descriptor < statements, url <
# dialects/contract < dialects/base < the engine modules) < provisioning/ < sessions/ < leases/ <
# source.py. An import kept inside a function (or under TYPE_CHECKING) is how a cycle hides: the
# module graph below is acyclic only because every such import was resolved by moving the shared
# piece down (``postgresql_connect``/``mysql_connect``: the admin and the adapter both import it)
# or by inverting the dependency through a declared Protocol (``contract.CloneSource``: scratch
# registers itself with ``dialects.base.use_clone_source``; the adapters never import it).
#
# No import statement in sqlrl/db sits inside a function any more (third-party ones are not
# counted here, but none is left either). The lazy loads that stay are by name: the modules a
# descriptor names (adapter, admin class, lexer) are loaded with ``importlib`` on first use, so
# that an engine's driver (psycopg2, pymysql, pyodbc, oracledb; pglast) is imported only by its
# users; those calls are allowed in the places ``IMPORT_BY_NAME`` lists, nowhere else.

DB = SQLRL / "db"

# (file relative to sqlrl/, imported module) -> why it may be imported inside a function. Empty:
# every sqlrl import in sqlrl/db is at module level. Add an entry only with a reason that is not
# "it would be a cycle" (that is what this test exists to refuse).
ALLOWED_LOCAL_IMPORTS: dict[tuple[str, str], str] = {}

# file relative to sqlrl/ -> why it calls importlib.import_module (data-driven, lazy loads)
IMPORT_BY_NAME: dict[str, str] = {
    "db/dialects/base.py": "get_dialect: the adapter module a descriptor names (its driver is "
                           "optional: pyodbc, oracledb)",
    "db/dialects/contract.py": "admin_class: the admin class a descriptor names (imports the "
                               "engine's driver)",
    "db/statements.py": "_lexer: the lexer module a descriptor names (pglast only for PostgreSQL)",
}


# the subsystems of sqlrl/db, lowest first: a module imports modules of its own tier or lower
DB_TIERS: tuple[frozenset[str], ...] = (
    frozenset({"types", "url", "statements", "dialects"}),  # the shared base (acyclic inside)
    frozenset({"provisioning"}),  # server bases and per-session clones (scratch)
    frozenset({"sessions"}),  # the session engine: a server session's clone comes from scratch
    frozenset({"leases"}),  # the pool's lease protocol over sessions
    frozenset({"source", "__init__"}),  # SessionSource; the package's public names
)
DB_RANK = {unit: i for i, tier in enumerate(DB_TIERS) for unit in tier}


def db_unit_of(module: str) -> str:
    """``sqlrl.db.sessions.pool`` -> ``sessions``; ``sqlrl.db`` (its ``__init__``) -> ``__init__``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def _db_modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / "db").rglob("*.py"))}


def _nested_imports(tree: ast.Module) -> set[int]:
    """ids of import nodes that are not plain module-level statements (inside a function or a
    class, or under ``if TYPE_CHECKING:``)."""
    nested: set[int] = set()
    for top in tree.body:
        if isinstance(top, (ast.Import, ast.ImportFrom)):
            continue
        for node in ast.walk(top):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                nested.add(id(node))
    return nested


def db_imports(root: Path = SQLRL) -> list[tuple[str, int, str, bool]]:
    """(module, line, imported sqlrl module, nested) for every sqlrl import in sqlrl/db; a
    ``from package import name`` of a submodule is an import of that submodule."""
    modules = _db_modules(root)
    out = []
    for here, path in modules.items():
        package = here if path.name == "__init__.py" else here.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        nested = _nested_imports(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target
                           for a in node.names]
            else:
                continue
            for target in dict.fromkeys(targets):
                if target.split(".")[0] == "sqlrl":
                    out.append((here, node.lineno, target, id(node) in nested))
    return out


def db_cycles(root: Path = SQLRL) -> list[list[str]]:
    """Every import cycle between modules of sqlrl/db (strongly connected components of the
    module graph, all imports counted wherever they sit), each as its sorted modules."""
    modules = _db_modules(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for here, _, target, _ in db_imports(root):
        while target and target not in modules:  # ``import sqlrl.db.x.y`` names a package
            target = target.rpartition(".")[0]
        if target:
            graph[here].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
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
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def db_local_imports(root: Path = SQLRL) -> list[str]:
    found = []
    for here, line, target, nested in db_imports(root):
        path = str(_db_modules(root)[here].relative_to(root))
        if nested and (path, target) not in ALLOWED_LOCAL_IMPORTS:
            found.append(f"sqlrl/{path}:{line}: imports {target} inside a function (or under "
                         "TYPE_CHECKING): move it to the top; if that is a cycle, move the shared "
                         "piece to the lower module")
    return found


def db_import_by_name(root: Path = SQLRL) -> list[str]:
    found = []
    for path in sorted((root / "db").rglob("*.py")):
        rel = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr == "import_module"
                    and rel not in IMPORT_BY_NAME):
                found.append(f"sqlrl/{rel}:{node.lineno}: importlib.import_module outside "
                             f"IMPORT_BY_NAME")
    return found


def db_order_breaks(root: Path = SQLRL) -> list[str]:
    found = []
    for here, line, target, _ in db_imports(root):
        if not target.startswith("sqlrl.db"):
            continue
        src, dst = db_unit_of(here), db_unit_of(target)
        if src not in DB_RANK or dst not in DB_RANK:
            found.append(f"{here}:{line}: {src} -> {dst}: place it in DB_TIERS")
        elif DB_RANK[dst] > DB_RANK[src]:
            found.append(f"{here}:{line}: {src} (db tier {DB_RANK[src]}) imports {target} "
                         f"(db tier {DB_RANK[dst]})")
    return found


def test_sqlrl_db_has_no_import_cycle():
    assert db_cycles() == []


def test_sqlrl_db_subsystems_keep_their_order():
    assert db_order_breaks() == []


def test_every_sqlrl_import_in_sqlrl_db_is_at_module_level():
    assert db_local_imports() == []


def test_sqlrl_db_imports_by_name_only_what_descriptors_name():
    assert db_import_by_name() == []


def test_a_cycle_and_a_hidden_import_are_found(tmp_path):
    """The checkers themselves: a cycle through a function-level import is a cycle, a hidden
    import and (a dialect module reaching up into provisioning) a break of the subsystem order;
    ``from package import submodule`` is an edge to the submodule; an ``importlib`` call outside
    the listed places is reported."""
    db = tmp_path / "sqlrl" / "db"
    (db / "dialects").mkdir(parents=True)
    for init in (tmp_path / "sqlrl", db, db / "dialects"):
        (init / "__init__.py").write_text("")
    (db / "types.py").write_text("import enum\n")
    (db / "dialects" / "pg.py").write_text("from ..types import X\ndef f():\n"
                                           "    from ..provisioning import scratch\n")
    (db / "provisioning").mkdir()
    (db / "provisioning" / "__init__.py").write_text("")
    (db / "provisioning" / "scratch.py").write_text(
        "from sqlrl.db.dialects import pg\nimport importlib\nimportlib.import_module('x')\n")
    root = tmp_path / "sqlrl"
    assert db_cycles(root) == [["sqlrl.db.dialects.pg", "sqlrl.db.provisioning.scratch"]]
    local = db_local_imports(root)
    assert len(local) == 1 and local[0].startswith("sqlrl/db/dialects/pg.py:3: imports "
                                                   "sqlrl.db.provisioning.scratch inside a function")
    assert db_import_by_name(root) == ["sqlrl/db/provisioning/scratch.py:3: importlib.import_module "
                                       "outside IMPORT_BY_NAME"]
    assert db_order_breaks(root) == ["sqlrl.db.dialects.pg:3: dialects (db tier 0) imports "
                                     "sqlrl.db.provisioning.scratch (db tier 1)"]
    (db / "dialects" / "pg.py").write_text("from ..types import X\n")  # the cycle broken
    assert db_cycles(root) == db_local_imports(root) == db_order_breaks(root) == []
