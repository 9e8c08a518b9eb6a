"""Finds task-kind and stage knowledge kept outside their registries (``sqlrl/tasks/kinds.py``,
``curriculum/stages.py``).

Reported, in the production folders:
- a *kind branch*: a comparison with a registered task kind's name (``t.kind == "critic"``,
  ``kind in ("text2sql", "critic")``) or with a built-in task class's ``kind`` attribute
  (``x == CriticTask.kind``): a module that must be edited when a kind is added;
- a *stage branch*: a comparison with a registered stage's name (``name == "stage3"``) or of a
  ``stage`` variable or attribute with a number (``stage == 4``);
- a *stage list*: a tuple, list or set literal naming two or more registered stages
  (``("stage3", "stage4")``): a new stage would be missing from it.
Mixture weights keyed by kind (``{"text2sql": 0.5, "critic": 0.5}``) are data, not knowledge,
and are not reported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("sqlrl", "bench", "curriculum", "jobs", "actors", "serve")
REGISTRIES = (ROOT / "sqlrl" / "tasks" / "kinds.py", ROOT / "curriculum" / "stages.py")


@dataclass(frozen=True)
class Words:
    kinds: frozenset[str]  # registered task kinds' names
    kind_classes: frozenset[str]  # their task classes' names (``CriticTask``)
    stages: frozenset[str]  # registered stage names


def registered() -> Words:
    from curriculum.stages import STAGES
    from sqlrl.tasks.kinds import kinds

    return Words(frozenset(k.name for k in kinds()) | frozenset(k.scored_as for k in kinds()),
                 frozenset(k.task_type.__name__ for k in kinds()), frozenset(STAGES))


@dataclass(frozen=True)
class Leak:
    path: str
    scope: str  # the enclosing function/class (dotted), or <module>
    line: int
    what: str  # "kind branch" | "stage branch" | "stage list"
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} [{self.scope}] {self.what}: {self.text}"


def _strings(node: ast.AST) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _is_kind_attr(node: ast.AST, words: Words) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "kind" and isinstance(node.value, ast.Name)
            and node.value.id in words.kind_classes)


def _is_stage_var(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name == "stage" or name.endswith("_stage")


def _is_number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool)


def _leaks(node: ast.AST, words: Words) -> Iterator[str]:
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        if any(s in words.kinds for o in operands for s in _strings(o)) or any(_is_kind_attr(o, words) for o in operands):
            yield "kind branch"
        if any(s in words.stages for o in operands for s in _strings(o)) or (
                any(_is_stage_var(o) for o in operands) and any(_is_number(o) for o in operands)):
            yield "stage branch"
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(set(_strings(node)) & words.stages) >= 2:
        yield "stage list"


def find_leaks(source: str, path: str = "<source>", words: Words | None = None) -> list[Leak]:
    words = words or registered()
    found: list[Leak] = []

    def walk(node: ast.AST, scope: tuple[str, ...]) -> None:
        for what in _leaks(node, words):
            text = (ast.get_source_segment(source, node) or "").split("\n")[0][:100]
            found.append(Leak(path, ".".join(scope) or "<module>", node.lineno, what, text))
        inner = (*scope, node.name) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else scope
        for child in ast.iter_child_nodes(node):
            walk(child, inner)

    walk(ast.parse(source, filename=path), ())
    return found


def leaks_in_production() -> list[Leak]:
    words = registered()
    out: list[Leak] = []
    for top in PRODUCTION:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path not in REGISTRIES:
                out += find_leaks(path.read_text(), str(path.relative_to(ROOT)), words)
    return out
