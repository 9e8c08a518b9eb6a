"""Conformance over every registered task kind (``sqlrl.tasks.kinds.kinds()``, read at collection):
each kind's tasks load (records and JSONL files), its request class and the rewards it routes to fit
it (``from_task``; each reward exists, scores that response shape and the kind's ``scored_as``),
its tasks prompt (both modes, and its unlabelled request the same), are judged (its gold answer solved, a wrong one not: ``sqlrl.rl.outcome.solved``, the
one definition of success, through the hybrid rewards the jobs use), and have their answers
written by ``jobs.infer``. A kind registered without a sample here fails
``test_every_registered_kind_has_a_sample``, naming it; tests/unit/test_fake_task_kind.py runs a
test-only kind through the layers with nothing else edited."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pytest

from sqlrl.tasks.kinds import get_kind, kind_of, kinds, task_from_dict
from sqlrl.tasks.types import CriticTask, Text2SQLTask


class Sample(NamedTuple):
    task: Any  # on the demo database ``shop`` (SQLite)
    gold: str  # SQL that solves it
    wrong: str  # SQL that runs and does not


SAMPLES: dict[str, Callable[[], Sample]] = {
    "text2sql": lambda: Sample(
        Text2SQLTask("conf-t2s", "shop", "How many customers are there?", "SELECT count(*) FROM customers"),
        "SELECT count(*) FROM customers", "SELECT count(*) FROM orders"),
    "critic": lambda: Sample(
        CriticTask(instance_id="conf-critic", db_id="shop", query="I need the number of customers.",
                   issue_sql=["SELECT count(*) FROM customer"], sol_sql=["SELECT count(*) FROM customers"]),
        "SELECT count(*) FROM customers", "SELECT count(*) FROM orders"),
}
KINDS = [k.name for k in kinds()]


def sample(name: str) -> Sample:
    if name not in SAMPLES:
        pytest.fail(f"task kind {name!r} is registered but has no sample task in "
                    f"tests/conformance/test_task_kinds.py::SAMPLES (add one: a task, a gold and a wrong answer)")
    return SAMPLES[name]()


def test_every_registered_kind_has_a_sample():
    missing = [name for name in KINDS if name not in SAMPLES]
    assert not missing, f"registered task kinds without a conformance sample: {missing}"


@pytest.fixture(scope="module")
def db_root(demo_db_path: str, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("databases")
    (root / "shop").mkdir()
    shutil.copy(demo_db_path, root / "shop" / "shop.sqlite")
    return root


@pytest.fixture(scope="module")
def judge(db_root: Path):
    from sqlrl.rewards import Judge

    return Judge({"shop": {"sqlite": f"sqlite:///{db_root / 'shop' / 'shop.sqlite'}"}})


def request_problems(kind: Any) -> list[str]:
    """What the kind's unlabelled request class lacks (the agent loop, serving and the gateway
    build it with ``from_task`` and read ``kind``/``task_id``/``db_id``/``dialect`` off it)."""
    try:
        cls = kind.request_type()
    except (ImportError, AttributeError, ValueError) as exc:
        return [f"its request {kind.request!r} does not import: {exc}"]
    problems = []
    if getattr(cls, "kind", None) != kind.name:
        problems.append(f"{cls.__name__}.kind must be {kind.name!r} (got {getattr(cls, 'kind', None)!r})")
    if not callable(getattr(cls, "from_task", None)):
        problems.append(f"{cls.__name__} lacks from_task(task) (the unlabelled request of a task)")
    return problems


def reward_problems(kind: Any) -> list[str]:
    """The rewards the kind routes to (``TaskKind.rewards``) exist, score its response shape and
    score its kind of task (``RewardSpec.task_kind`` == ``TaskKind.scored_as``): a reward named
    directly in a stage config would otherwise refuse the kind's tasks, or score them as another
    kind's."""
    from sqlrl.rewards.registry import REWARDS

    problems = []
    for shape, name in kind.rewards.items():
        spec = REWARDS.get(name)
        if spec is None:
            problems.append(f"rewards[{shape!r}] = {name!r} is not in sqlrl.rewards.registry.REWARDS")
        elif spec.response != shape:
            problems.append(f"rewards[{shape!r}] = {name!r} scores {spec.response} responses, not {shape}")
        elif spec.task_kind != kind.scored_as:
            problems.append(f"rewards[{shape!r}] = {name!r} scores {spec.task_kind!r} tasks, but the kind is "
                            f"scored as {kind.scored_as!r} (set TaskKind.scored_as, or name a reward for it)")
    return problems


@pytest.mark.parametrize("name", KINDS)
def test_the_kinds_request_class_and_rewards_fit_it(name):
    problems = request_problems(get_kind(name)) + reward_problems(get_kind(name))
    assert not problems, f"task kind {name!r}: " + "; ".join(problems)


def test_the_suite_names_a_bad_request_class_and_a_reward_of_another_kind():
    import dataclasses

    from sqlrl.tasks.kinds import TEXT2SQL

    bad = dataclasses.replace(TEXT2SQL, name="planted", request="sqlrl.tasks.types:Text2SQLTask",
                              rewards={"single": "critic_single", "agentic": "bird_ex_single"})
    assert request_problems(bad) == [
        "Text2SQLTask.kind must be 'planted' (got 'text2sql')",
        "Text2SQLTask lacks from_task(task) (the unlabelled request of a task)"]
    assert reward_problems(bad) == [
        "rewards['single'] = 'critic_single' scores 'critic' tasks, but the kind is scored as 'text2sql' "
        "(set TaskKind.scored_as, or name a reward for it)",
        "rewards['agentic'] = 'bird_ex_single' scores single responses, not agentic"]
    assert request_problems(dataclasses.replace(bad, request="sqlrl.nowhere:X"))[0].startswith(
        "its request 'sqlrl.nowhere:X' does not import")


@pytest.mark.parametrize("name", KINDS)
def test_the_kind_loads_from_records_and_files(name, db_root, tmp_path):
    from sqlrl.tasks.io import read_tasks, write_tasks
    from sqlrl.tasks.loaders import load_jsonl

    task = sample(name).task
    assert kind_of(task) is get_kind(name), f"{name}: its sample is not a task of the kind"
    assert task_from_dict(json.loads(json.dumps(task.to_dict()))) == task, f"{name}: to_dict/from_dict lose something"
    write_tasks(tmp_path / "tasks.jsonl", [task])
    assert read_tasks(tmp_path / "tasks.jsonl") == [task]
    loaded = load_jsonl(tmp_path / "tasks.jsonl", db_root=db_root)
    assert list(loaded.tasks) == [task] and set(loaded.catalog) == {"shop"}, f"{name}: the JSONL loader drops it"


@pytest.mark.parametrize("mode", ["single", "agentic"])
@pytest.mark.parametrize("name", KINDS)
def test_the_kind_prompts_and_its_request_prompts_the_same(name, mode):
    from sqlrl.agent.prompts import build_messages
    from sqlrl.agent.request import request_from_task

    kind, s = get_kind(name), sample(name)
    system, user = build_messages(s.task, None, mode=mode)
    assert f"Your job: {kind.job}." in system["content"], f"{name}: the system prompt lacks the kind's job"
    assert user["content"] == kind.user_prompt(s.task)
    assert kind.reference(s.task) not in user["content"], f"{name}: the prompt gives the reference answer away"
    request = request_from_task(s.task)
    assert isinstance(request, kind.request_type()), f"{name}: request_from_task gives {type(request).__name__}"
    assert build_messages(request, None, mode=mode) == [system, user], f"{name}: its request prompts differently"


@pytest.mark.parametrize("name", KINDS)
def test_the_kind_judges_its_gold_answer_solved_and_a_wrong_one_not(name, judge):
    from sqlrl.rewards.registry import compute
    from sqlrl.rl.outcome import solved

    s = sample(name)
    assert get_kind(name).check_reference(judge, s.task)[0], f"{name}: its sample's own reference fails its check"
    for sql, want in ((s.gold, True), (s.wrong, False)):
        single = compute("hybrid_single", s.task, f"<thought>t</thought><solution>{sql}</solution>", judge)
        agentic = compute("hybrid_agentic", s.task, [{"name": "submit_solution", "arguments": {"sql": sql}}], judge)
        for b in (single, agentic):
            assert not b.excluded and solved(b) is want, (name, sql, b)


@pytest.mark.parametrize("name", KINDS)
def test_jobs_infer_writes_the_kinds_answers(name, tmp_path):
    from jobs.infer import InferConfig, TaskSource, write_predictions

    s = sample(name)
    write_predictions(tmp_path, [s.task], [s.gold], InferConfig(tasks=TaskSource(db_root="DBS")))
    rows = [json.loads(x) for x in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert rows == [{"task_id": s.task.task_id, "kind": name, "sql": s.gold}], f"{name}: its answers are not written"
