"""Task-kind and stage knowledge lives in the registries (``sqlrl/tasks/kinds.py``,
``curriculum/stages.py``): production code neither branches on a kind's or a stage's name nor
lists stages by hand (``registry_guard.py`` says what counts). The guard itself is checked on
planted code."""

from __future__ import annotations

import pytest

from .registry_guard import Words, find_leaks, leaks_in_production

# Known leaks (path, scope, text) in modules other owners are changing. Nothing may be added here:
# route the knowledge through the registry instead.
REMAINING: set[tuple[str, str, str]] = set()

WORDS = Words(kinds=frozenset({"text2sql", "critic"}), kind_classes=frozenset({"CriticTask", "Text2SQLTask"}),
              stages=frozenset({"stage1", "stage2", "stage3", "stage4"}))


def test_production_code_keeps_kind_and_stage_knowledge_in_the_registries():
    found = [str(leak) for leak in leaks_in_production() if (leak.path, leak.scope, leak.text) not in REMAINING]
    assert found == [], "route these through sqlrl.tasks.kinds / curriculum.stages:\n" + "\n".join(found)


@pytest.mark.parametrize("code, what", [
    ('if t.kind == "critic": pass', "kind branch"),
    ('ok = kind in ("text2sql", "critic")', "kind branch"),
    ("same = routed.task_kind == CriticTask.kind", "kind branch"),
    ("if stage == 4: pass", "stage branch"),
    ("if cfg.stage != 3: pass", "stage branch"),
    ('if name == "stage3": pass', "stage branch"),
    ('RL = ("stage3", "stage4")', "stage list"),
    ('SFT = ["stage1", "stage2"]', "stage list"),
])
def test_the_guard_finds_planted_knowledge(code, what):
    [leak] = find_leaks(f"def f(t, kind, stage, cfg, name, routed):\n    {code}\n", "x.py", WORDS)
    assert (leak.what, leak.scope, leak.line) == (what, "f", 2)


@pytest.mark.parametrize("code", [
    'mixture = {"text2sql": 0.5, "critic": 0.5}',  # data: weights per kind
    'if tok.kind == "IDENT": pass',  # not a task kind
    "if step == 4: pass",
    'run(stage="stage3")',  # an argument, not a branch
    'only = ("stage3",)',
    "if spec.trainer == trainer: pass",
])
def test_the_guard_leaves_data_and_other_comparisons_alone(code):
    assert find_leaks(f"def f(tok, step, spec, trainer):\n    {code}\n", "x.py", WORDS) == []
