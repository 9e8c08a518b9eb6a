"""Conformance over every registered task source (``sqlrl.tasks.loaders.LOADERS``, read at
collection): each loader, given its sample input here (``SAMPLES``: a few files around the demo
database ``shop``), returns a ``TaskSet`` -- a tuple of tasks, each of a registered task kind
(``sqlrl.tasks.kinds``), a catalog whose URLs are of the dialects they are filed under
(``TaskSet.to_catalog``), a source label, skipped counts per database -- and raises
``FileNotFoundError`` naming the path for input that is not there (the loaders' shared guarantee,
``sqlrl/tasks/loaders/__init__.py``). The jobs (``jobs.stage_data``, ``jobs.infer``'s
``tasks.source``) read only ``LOADERS``, so a loader that passes here is usable by name. A loader
registered without a sample fails ``test_every_registered_loader_has_a_sample``, naming it; each
loader's own formats and error paths are tests/unit/test_loaders.py's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pytest

from sqlrl.tasks.kinds import kind_of
from sqlrl.tasks.loaders import LOADERS, TaskSet
from sqlrl.tasks.types import CriticTask, Text2SQLTask

QUESTION = {"db_id": "shop", "question": "How many customers are there?", "query": "SELECT count(*) FROM customers"}


class Input(NamedTuple):
    path: Path  # what the loader reads (a file or a folder)
    kwargs: dict[str, Any]  # the keywords the jobs would give it (split, db_root, ...)


def _databases(root: Path, demo_db: str, name: str = "shop.sqlite") -> Path:
    (root / "shop").mkdir(parents=True, exist_ok=True)
    shutil.copy(demo_db, root / "shop" / name)
    return root


def _spider(tmp: Path, demo_db: str) -> Input:
    root = tmp / "spider"
    _databases(root / "database", demo_db)
    tables = {"db_id": "shop", "table_names_original": ["customers"], "table_names": ["customers"],
              "column_names_original": [[-1, "*"], [0, "customer_id"]], "column_names": [[-1, "*"], [0, "id"]],
              "column_types": ["text", "number"], "primary_keys": [1], "foreign_keys": []}
    (root / "tables.json").write_text(json.dumps([tables]))
    (root / "dev.json").write_text(json.dumps([QUESTION]))
    return Input(root, {"split": "dev"})


def _bird(tmp: Path, demo_db: str) -> Input:
    path = tmp / "mini_dev_sqlite.json"
    path.write_text(json.dumps([{"question_id": 1, "db_id": "shop", "question": QUESTION["question"],
                                 "evidence": "", "SQL": QUESTION["query"], "difficulty": "simple"}]))
    return Input(path, {"db_root": _databases(tmp / "dev_databases", demo_db)})


def _critic(tmp: Path, demo_db: str) -> Input:
    path = tmp / "critic.jsonl"
    path.write_text(json.dumps({"instance_id": 1, "db_id": "shop", "dialect": "SQLite", "query": "Duplicates!",
                                "issue_sql": ["SELECT city FROM customers"],
                                "sol_sql": ["SELECT DISTINCT city FROM customers"], "test_cases": []}) + "\n")
    return Input(path, {"db_root": _databases(tmp / "dbs", demo_db, "shop_template.sqlite")})


def _verl(tmp: Path, demo_db: str) -> Input:
    from sqlrl.tasks.loaders import export_verl

    path = tmp / "train.parquet"
    export_verl([Text2SQLTask("v1", "shop", QUESTION["question"], QUESTION["query"]),
                 CriticTask(instance_id="v2", db_id="shop", query="Fix it.", issue_sql=["SELEC 1"],
                            sol_sql=["SELECT 1"])], path)
    return Input(path, {})


def _jsonl(tmp: Path, demo_db: str) -> Input:
    from sqlrl.tasks.io import write_tasks

    path = tmp / "tasks.jsonl"
    write_tasks(path, [Text2SQLTask("j1", "shop", QUESTION["question"], QUESTION["query"])])
    return Input(path, {"db_root": _databases(tmp / "databases", demo_db)})


# loader name -> its sample input (tmp folder, the demo database's path) -> Input
SAMPLES: dict[str, Callable[[Path, str], Input]] = {
    "spider": _spider, "bird": _bird, "critic": _critic, "verl": _verl, "jsonl": _jsonl}
NAMES = list(LOADERS)


def loader_problems(name: str, loader: Callable[..., Any], given: Input) -> list[str]:
    """What ``loader`` breaks of the shared contract (module docstring), on ``given``."""
    problems = []
    try:
        got = loader(given.path, **given.kwargs)
    except Exception as exc:  # noqa: BLE001 -- the suite names whatever it raises
        return [f"raises {type(exc).__name__} on its sample input: {exc}"]
    if not isinstance(got, TaskSet):
        return [f"returns {type(got).__name__}, not a sqlrl.tasks.loaders.TaskSet "
                "(tasks + catalog + schemas + source + skipped)"]
    if not isinstance(got.tasks, tuple) or not got.tasks:
        problems.append(f"TaskSet.tasks must be a non-empty tuple on its sample, got {got.tasks!r:.80}")
    for task in got.tasks if isinstance(got.tasks, tuple) else ():
        try:
            kind_of(task)
        except TypeError:
            problems.append(f"returns a {type(task).__name__}, which is not a task of a registered kind")
            break
    try:
        got.to_catalog()
    except Exception as exc:  # noqa: BLE001
        problems.append(f"its catalog is not {{db_id: {{dialect: url}}}} with URLs of those dialects: {exc}")
    if not isinstance(got.source, str) or not got.source:
        problems.append("TaskSet.source must say where the tasks came from (e.g. 'spider-dev')")
    if not all(isinstance(k, str) and isinstance(v, int) for k, v in got.skipped.items()):
        problems.append(f"TaskSet.skipped must count left-out tasks per db_id, got {got.skipped!r}")
    missing = given.path.parent / "not-there"
    try:
        loader(missing, **given.kwargs)
        problems.append(f"loads a path that does not exist ({missing}) instead of raising FileNotFoundError")
    except FileNotFoundError as exc:
        if "not-there" not in str(exc):
            problems.append(f"its FileNotFoundError does not name the path: {exc}")
    except Exception as exc:  # noqa: BLE001
        problems.append(f"a missing path raises {type(exc).__name__}, not FileNotFoundError naming it: {exc}")
    return problems


def test_every_registered_loader_has_a_sample():
    missing = [name for name in NAMES if name not in SAMPLES]
    assert not missing, (f"registered task sources without a conformance sample: {missing} (add one to "
                         "tests/conformance/test_loaders.py::SAMPLES: the files the loader reads and its keywords)")


@pytest.mark.parametrize("name", NAMES)
def test_the_loader_keeps_the_shared_contract(name, tmp_path, demo_db_path):
    if name not in SAMPLES:
        pytest.fail(f"task source {name!r} is registered but has no sample in tests/conformance/test_loaders.py::SAMPLES")
    problems = loader_problems(name, LOADERS[name], SAMPLES[name](tmp_path, demo_db_path))
    assert not problems, f"task source {name!r}: " + "; ".join(problems)


def test_the_suite_names_what_a_planted_loader_breaks(tmp_path, demo_db_path):
    given = _jsonl(tmp_path, demo_db_path)

    def as_list(path, db_root=None):  # the tasks, not a TaskSet
        from sqlrl.tasks.io import read_tasks

        return read_tasks(path)

    def lenient(path, db_root=None):  # a TaskSet, but no source, and nothing for a missing file
        from sqlrl.tasks.io import read_tasks

        return TaskSet(tasks=tuple(read_tasks(path)) if Path(path).exists() else ())

    assert loader_problems("planted", as_list, given) == [
        "returns list, not a sqlrl.tasks.loaders.TaskSet (tasks + catalog + schemas + source + skipped)"]
    assert loader_problems("planted", lenient, given) == [
        "TaskSet.source must say where the tasks came from (e.g. 'spider-dev')",
        f"loads a path that does not exist ({tmp_path / 'not-there'}) instead of raising FileNotFoundError"]
