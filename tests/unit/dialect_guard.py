"""Finds per-dialect knowledge kept outside the engines' descriptors (``sqlrl/db/dialects/``).

A *per-dialect map* is a dict literal keyed by two or more dialect spellings (names, aliases or
sqlglot names of the registered engines: ``{"sqlite": …, "postgresql": …}``); a *per-dialect
branch* compares with one (``dialect == "mysql"``, ``d in ("sqlite", "mysql")``,
``case "oracle":``). Both mean a module that must be edited when an engine is added. Default
argument values, keyword arguments (``read="sqlite"``) and one-key catalog entries
(``{"sqlite": url}``) are data, not engine knowledge, and are not reported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from sqlrl.db.dialects.descriptor import dialects

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("sqlrl", "bench", "curriculum", "jobs", "actors", "serve")
EXEMPT = ROOT / "sqlrl" / "db" / "dialects"  # where engine knowledge belongs


def dialect_words() -> frozenset[str]:
    """Every spelling of a registered engine, lower-cased."""
    words: set[str] = set()
    for d in dialects():
        words |= {d.name.lower(), d.sqlglot.lower(), *(a.lower() for a in d.aliases)}
    return frozenset(words)


@dataclass(frozen=True)
class Finding:
    path: str  # relative to the repository root
    scope: str  # enclosing function/class (dotted), or the module-level name assigned
    line: int
    kind: str  # "map" | "branch"
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} [{self.scope}] per-dialect {self.kind}: {self.text}"


def _is_word(node: ast.AST, words: frozenset[str]) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in words


def _mentions(node: ast.AST, words: frozenset[str]) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_word(e, words) for e in node.elts)
    return _is_word(node, words)


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str, source: str, words: frozenset[str]) -> None:
        self.path, self.source, self.words = path, source, words
        self.scopes: list[str] = []
        self.found: list[Finding] = []

    def _add(self, node: ast.AST, kind: str) -> None:
        text = (ast.get_source_segment(self.source, node) or "").split("\n")[0][:100]
        self.found.append(Finding(self.path, ".".join(self.scopes) or "<module>",
                                  node.lineno, kind, text))

    def _scoped(self, name: str, node: ast.AST) -> None:
        self.scopes.append(name)
        self.generic_visit(node)
        self.scopes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scoped(node.name, node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped(node.name, node)

    def visit_Assign(self, node: ast.Assign) -> None:
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if not self.scopes and names:
            self._scoped(names[0], node)
        else:
            self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if not self.scopes and isinstance(node.target, ast.Name):
            self._scoped(node.target.id, node)
        else:
            self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        if sum(1 for k in node.keys if k is not None and _is_word(k, self.words)) >= 2:
            self._add(node, "map")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        ops = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
        if any(isinstance(op, ops) for op in node.ops) and any(
                _mentions(operand, self.words) for operand in [node.left, *node.comparators]):
            self._add(node, "branch")
        self.generic_visit(node)

    def visit_MatchValue(self, node: ast.MatchValue) -> None:
        if _is_word(node.value, self.words):
            self._add(node, "branch")
        self.generic_visit(node)


def find_in_source(source: str, path: str = "<source>",
                   words: frozenset[str] | None = None) -> list[Finding]:
    finder = _Finder(path, source, words if words is not None else dialect_words())
    finder.visit(ast.parse(source, filename=path))
    return finder.found


def production_files() -> list[Path]:
    return sorted(p for top in PRODUCTION for p in (ROOT / top).rglob("*.py")
                  if EXEMPT not in p.parents)


def find_in_production() -> list[Finding]:
    words = dialect_words()
    out: list[Finding] = []
    for path in production_files():
        out += find_in_source(path.read_text(), str(path.relative_to(ROOT)), words)
    return out
