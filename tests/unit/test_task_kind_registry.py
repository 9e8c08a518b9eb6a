"""The task-kind axis has one place to edit: the kinds' descriptors (``sqlrl/tasks/kinds.py``).

These tests fail when a production module outside that file tests a task or request against a
built-in class (``isinstance(t, CriticTask)``: behaviour chosen by kind somewhere else), check
the guard itself on planted code, and check the built-in descriptors against the types they
describe. test_fake_task_kind.py shows a test-only kind working everywhere with nothing else
edited."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sqlrl.agent.request import DebugRequest, GenerateRequest, request_from_task
from sqlrl.tasks.kinds import (CRITIC, TEXT2SQL, get_kind, kind_of, kind_of_record, kinds,
                               task_from_dict)
from sqlrl.tasks.types import CriticTask, TaskError, Text2SQLTask

from .dialect_guard import ROOT, production_files

KIND_CLASSES = frozenset({"CriticTask", "Text2SQLTask", "GenerateRequest", "DebugRequest"})
EXEMPT = "sqlrl/tasks/kinds.py"  # where kind knowledge belongs
# isinstance tests that may stay where they are, and why: argument checks of functions that only
# make sense for one kind (they refuse the others; they choose no behaviour).
ALLOWED = {
    ("sqlrl/eval/critic.py", "run_critic"): "runs BIRD-CRITIC test cases: refuses other tasks",
    ("sqlrl/synth/critic_gen.py", "make_critic_tasks"):
        "injects bugs into text-to-SQL gold queries: refuses other tasks",
    ("jobs/evaluate.py", "_critic_run"): "the BIRD-CRITIC evaluator: refuses a file of other tasks",
}


def isinstance_sites(source: str, path: str) -> list[tuple[str, str, int]]:
    """(path, enclosing function, line) of every ``isinstance(x, C)`` / ``isinstance(x, (C, …))``
    whose classes include a built-in task or request class."""
    out: list[tuple[str, str, int]] = []

    def names(node: ast.AST) -> set[str]:
        elts = node.elts if isinstance(node, ast.Tuple) else [node]
        return {e.id if isinstance(e, ast.Name) else e.attr if isinstance(e, ast.Attribute) else ""
                for e in elts}

    def walk(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope else child.name
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Name)
                    and child.func.id == "isinstance" and len(child.args) == 2
                    and names(child.args[1]) & KIND_CLASSES):
                out.append((path, scope or "<module>", child.lineno))
            walk(child, inner)

    walk(ast.parse(source, filename=path), "")
    return out


def problems(sites: list[tuple[str, str, int]]) -> list[str]:
    keys = {(p, s) for p, s, _ in sites}
    out = [f"{p}:{line} [{s}] isinstance on a task class" for p, s, line in sites
           if (p, s) not in ALLOWED]
    out += [f"stale allow-list entry (nothing found there any more): {k}"
            for k in sorted(ALLOWED.keys() - keys)]
    return out


def production_sites() -> list[tuple[str, str, int]]:
    sites = []
    for path in production_files():
        rel = str(path.relative_to(ROOT))
        if rel != EXEMPT:
            sites += isinstance_sites(path.read_text(), rel)
    return sites


def test_no_production_module_chooses_behaviour_by_task_class() -> None:
    found = problems(production_sites())
    assert not found, ("task-kind behaviour outside sqlrl/tasks/kinds.py: read the task's "
                       "TaskKind (kind_of(task)) instead\n" + "\n".join(found))


def test_the_guard_finds_planted_isinstance_tests() -> None:
    planted = '''
def route(task):
    if isinstance(task, CriticTask):
        return 1
    return 2 if isinstance(task, (int, types.Text2SQLTask)) else 3
class A:
    def f(self, r):
        return isinstance(r, DebugRequest) or isinstance(r, dict)
'''
    sites = isinstance_sites(planted, "sqlrl/planted.py")
    assert sites == [("sqlrl/planted.py", "route", 3), ("sqlrl/planted.py", "route", 5),
                     ("sqlrl/planted.py", "A.f", 8)]
    assert "sqlrl/planted.py:3 [route] isinstance on a task class" in problems(
        production_sites() + sites)
    assert not isinstance_sites("isinstance(x, Task) or isinstance(x, kind.task_type)", "a.py")


def test_the_builtin_kinds_describe_their_types() -> None:
    assert [k.name for k in kinds()][:2] == ["text2sql", "critic"]
    assert (get_kind("text2sql"), get_kind("critic")) == (TEXT2SQL, CRITIC)
    assert (TEXT2SQL.task_type, CRITIC.task_type) == (Text2SQLTask, CriticTask)
    assert (TEXT2SQL.request_type(), CRITIC.request_type()) == (GenerateRequest, DebugRequest)
    assert all(k.task_type.kind == k.name == k.request_type().kind for k in kinds())
    with pytest.raises(KeyError, match="unknown task kind 'essay'; known: text2sql, critic"):
        get_kind("essay")


def test_records_tasks_and_requests_find_their_kind() -> None:
    t2s = Text2SQLTask("q1", "shop", "How many?", "SELECT 1;", evidence="e")
    crit = CriticTask("c1", "shop", "It fails.", ("SELEC 1",), ("SELECT 1", "SELECT 2;"),
                      preprocess_sql=("CREATE TEMP TABLE x(a)",))
    assert kind_of(t2s) is TEXT2SQL and kind_of(crit) is CRITIC
    assert kind_of(request_from_task(crit)) is CRITIC  # requests carry their kind too
    assert task_from_dict(crit.to_dict()) == crit and task_from_dict(t2s.to_dict()) == t2s
    # a record with a question *and* BIRD-CRITIC keys is a BIRD-CRITIC instance
    assert kind_of_record({"question": "q", "instance_id": "x"}) is CRITIC
    with pytest.raises(TaskError, match=r"neither a text-to-SQL task \(no 'question'\) nor a "
                                        r"BIRD-CRITIC instance \(no 'instance_id'/'issue_sql'\)"):
        kind_of_record({"neither": 1})
    with pytest.raises(TypeError, match="not a task: dict"):
        kind_of({"kind": "critic"})
    assert TEXT2SQL.reference(t2s) == "SELECT 1;" and CRITIC.reference(crit) == "SELECT 1;\nSELECT 2"
    assert TEXT2SQL.given_sql(t2s) == () and CRITIC.given_sql(crit) == ("SELEC 1",)
    assert CRITIC.ground_truth(crit) == '["SELECT 1", "SELECT 2;"]'
    assert (TEXT2SQL.rewards, CRITIC.scored_as) == (
        {"single": "bird_ex_single", "agentic": "bird_ex_agentic"}, "critic")


def test_the_guard_reads_every_production_module() -> None:
    files = {str(p.relative_to(ROOT)) for p in production_files()}
    assert {EXEMPT, "sqlrl/agent/prompts.py", "curriculum/teachers.py", "jobs/evaluate.py"} <= files
    assert Path(ROOT, EXEMPT).is_file()


# -- registration checks the kind's contract (a gap is named there, not met in a loader or rollout) --

def _broken(**change):
    """A copy of TEXT2SQL whose task class (a subclass of Text2SQLTask) has ``change`` applied."""
    import dataclasses

    attrs = {"kind": "broken", **change}
    task_type = type("BrokenTask", (Text2SQLTask,), {k: v for k, v in attrs.items() if v is not ...})
    for name in [k for k, v in attrs.items() if v is ...]:  # ... = take the member away
        setattr(task_type, name, None)
    return dataclasses.replace(TEXT2SQL, name="broken", task_type=task_type)


@pytest.mark.parametrize("change, named", [
    ({"from_dict": ...}, "BrokenTask lacks from_dict()"),
    ({"to_dict": ...}, "BrokenTask lacks to_dict()"),
    ({"kind": "text2sql"}, "BrokenTask.kind must be the class attribute 'broken'"),
])
def test_a_kind_whose_task_class_lacks_a_member_does_not_register(change, named) -> None:
    from sqlrl.tasks.kinds import TaskKindError, register

    before = [k.name for k in kinds()]
    with pytest.raises(TaskKindError, match=r"task kind 'broken' cannot register: .*" + named.replace("(", r"\(")
                       .replace(")", r"\)")):
        register(_broken(**change))
    assert [k.name for k in kinds()] == before


def test_a_kind_without_a_field_or_a_reward_per_shape_does_not_register() -> None:
    import dataclasses

    from sqlrl.tasks.kinds import TaskKindError, register

    @dataclasses.dataclass(frozen=True)
    class Bare:  # no db_id, dialect or source
        kind = "bare"
        task_id: str

        def to_dict(self):
            return {"task_id": self.task_id}

        @classmethod
        def from_dict(cls, d):
            return cls(d["task_id"])

    bare = dataclasses.replace(TEXT2SQL, name="bare", task_type=Bare, rewards={"single": "bird_ex_single"},
                               request="sqlrl.agent.request.GenerateRequest")
    with pytest.raises(TaskKindError) as exc:
        register(bare)
    text = str(exc.value)
    assert "Bare lacks db_id, dialect, source" in text
    assert "rewards must name a reward for each response shape ['single', 'agentic']" in text
    assert "request must be 'module:Class'" in text
    assert "bare" not in [k.name for k in kinds()]


def test_the_builtin_kinds_pass_their_registration_check() -> None:
    from sqlrl.tasks.kinds import check_kind

    for kind in kinds():
        assert check_kind(kind) is kind
