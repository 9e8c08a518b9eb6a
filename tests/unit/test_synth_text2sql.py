"""Text-to-SQL generation: verified, deterministic, varied; the default dataset writer."""

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from sqlrl.db import open_session
from sqlrl.tasks.io import read_tasks
from sqlrl.tasks.loaders import load_jsonl
from sqlrl.synth import build_default_dataset
from sqlrl.synth.domains import DOMAINS, build_domain_db
from sqlrl.synth.phrasing import QUESTIONS, condition, plural, question
from sqlrl.synth.text2sql import (MAX_ROWS, TEMPLATES, Draft, GenerationError, generate_text2sql,
                                        verify)
from sqlrl.tasks.types import DIFFICULTIES, Text2SQLTask

N = 60


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    root = tmp_path_factory.mktemp("t2s")
    return {name: build_domain_db(name, str(root / f"{name}.sqlite"), seed=0) for name in DOMAINS}


@pytest.fixture(scope="module")
def generated(dbs):
    return {name: generate_text2sql(name, path, N, seed=0) for name, path in dbs.items()}


def all_tasks(generated):
    return [t for tasks in generated.values() for t in tasks]


def test_every_domain_gets_n_tasks_balanced_over_difficulties(generated):
    for name, tasks in generated.items():
        assert len(tasks) == N, name
        assert Counter(t.difficulty for t in tasks) == {d: N // 3 for d in DIFFICULTIES}
        for i, t in enumerate(tasks):
            assert t.task_id == f"synth/{name}/{i}"
            assert t.source == f"synthetic/{name}" and t.db_id == name and t.dialect == "sqlite"
            assert t.meta["template"] in TEMPLATES
            assert TEMPLATES[t.meta["template"]][0] == t.difficulty
            assert Text2SQLTask.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_same_seed_same_tasks_other_seed_other_tasks(dbs, generated):
    again = generate_text2sql("library", dbs["library"], N, seed=0)
    assert [t.to_dict() for t in again] == [t.to_dict() for t in generated["library"]]
    other = generate_text2sql("library", dbs["library"], N, seed=1)
    assert [t.gold_sql for t in other] != [t.gold_sql for t in generated["library"]]


def test_every_gold_runs_and_returns_a_bounded_non_empty_result(dbs, generated):
    for name, tasks in generated.items():
        with open_session("sqlite:///" + str(Path(dbs[name]).resolve())) as s:
            for t in tasks:
                r = s.execute(t.gold_sql)
                assert r.ok, (t.gold_sql, r.error)
                assert 1 <= r.row_count <= MAX_ROWS, t.gold_sql
                assert not (r.row_count == 1 and all(v in (None, 0) for v in r.rows[0])), t.gold_sql


def test_limit_is_only_used_where_the_cut_is_not_a_tie(dbs, generated):
    seen = 0
    for name, tasks in generated.items():
        with open_session("sqlite:///" + str(Path(dbs[name]).resolve())) as s:
            for t in tasks:
                m = re.search(r"ORDER BY (\w+) (?:ASC|DESC), [\w, ]+ LIMIT (\d+)$", t.gold_sql)
                if "LIMIT" not in t.gold_sql:
                    continue
                assert m, t.gold_sql  # LIMIT always follows ORDER BY <value>, <primary key>
                k = int(m.group(2))
                rows = s.execute(t.gold_sql[:m.start(2)] + str(k + 1)).rows
                assert len(rows) == k + 1 and rows[k - 1][1] != rows[k][1], t.gold_sql
                assert t.meta["order_matters"] is True
                seen += 1
    assert seen > 0


def test_no_duplicate_golds_within_a_domain(generated):
    for tasks in generated.values():
        golds = [" ".join(t.gold_sql.split()) for t in tasks]
        assert len(golds) == len(set(golds))


def constructs(sql):
    tree = sqlglot.parse_one(sql, read="sqlite")
    found = set()
    checks = {
        "join": exp.Join, "group-by": exp.Group, "having": exp.Having, "set-op": (exp.Union, exp.Intersect,
                                                                                   exp.Except),
        "window": exp.Window, "cte": exp.CTE, "order-limit": exp.Limit, "like": exp.Like,
        "between": exp.Between, "is-null": exp.Is, "count": exp.Count, "minmax": (exp.Min, exp.Max),
        "avg": exp.Avg,
    }
    for name, kind in checks.items():
        if tree.find(kind) is not None:
            found.add(name)
    if any(isinstance(s.parent, (exp.In, exp.Subquery)) or isinstance(s.parent, exp.Select) is False
           and s is not tree and s.find_ancestor(exp.Where) for s in tree.find_all(exp.Select)):
        found.add("subquery")
    if tree.find(exp.Not) and tree.find(exp.In):
        found.add("not-in")
    if tree.find(exp.In) and tree.find(exp.In).args.get("query") is not None:
        found.add("in-subquery")
    if isinstance(tree, exp.Select) and tree.args.get("distinct") or tree.find(exp.Distinct):
        found.add("distinct")
    for w in tree.find_all(exp.Window):
        found.add(w.this.key)  # rank / denserank / rownumber
    for kind in (exp.Union, exp.Intersect, exp.Except):
        if tree.find(kind) is not None:
            found.add(kind.key)
    return found


def test_every_difficulty_and_construct_family_is_produced(generated):
    by_level = {lvl: set() for lvl in DIFFICULTIES}
    for t in all_tasks(generated):
        by_level[t.difficulty] |= constructs(t.gold_sql)
    assert {"like", "between", "is-null", "order-limit", "count", "minmax"} <= by_level["simple"]
    assert {"join", "group-by", "having", "distinct"} <= by_level["moderate"]
    assert {"subquery", "in-subquery", "not-in", "window", "cte", "avg", "union", "intersect", "except",
            "rank", "denserank"} <= by_level["challenging"]
    assert "join" not in by_level["simple"] and "window" not in by_level["moderate"]


def test_questions_are_varied(generated):
    tasks = all_tasks(generated)
    openings = Counter(" ".join(t.question.split()[:2]) for t in tasks)
    first_words = Counter(t.question.split()[0] for t in tasks)
    assert len(openings) >= 40 and len(first_words) >= 12
    assert {"List", "Which", "How", "What", "Show"} <= set(first_words)
    assert max(openings.values()) < 0.15 * len(tasks)
    assert len({t.question for t in tasks}) >= 0.97 * len(tasks)
    for t in tasks:
        assert "{" not in t.question and "}" not in t.question and t.question[0].isupper()


def test_evidence_explains_the_encodings_the_gold_uses(generated):
    with_evidence = [t for t in all_tasks(generated) if t.evidence]
    assert len(with_evidence) >= 10
    for t in with_evidence:
        for part in t.evidence.split("; "):
            m = re.fullmatch(r"(.+) refers to (\w+) = ('?[^']*'?)", part)
            assert m, t.evidence
            assert m.group(2) in t.gold_sql, (t.evidence, t.gold_sql)
    # a coded filter value is phrased by its meaning, never as the raw code
    coded = [t for t in with_evidence if t.meta["template"] == "filter_list"]
    for t in coded:
        meaning = t.evidence.split(" refers to ")[0]
        assert meaning in t.question


def test_verify_rejects_bad_golds(demo_db_path):
    with open_session("sqlite:///" + demo_db_path) as s:
        ok = Draft("x", "SELECT name FROM customers WHERE city = 'Oslo'", "q", ())
        assert verify(s, ok) is None
        assert verify(s, Draft("x", "SELECT nope FROM customers", "q", ())).startswith("error")
        assert verify(s, Draft("x", "SELECT name FROM customers WHERE 0", "q", ())) == "empty result"
        assert verify(s, Draft("x", "SELECT * FROM order_items", "q", ()), max_rows=50) == "result too large"
        assert verify(s, Draft("x", "SELECT COUNT(*) FROM customers WHERE 0", "q", ())).startswith("degenerate")
        tie = "SELECT status FROM orders ORDER BY status, order_id LIMIT "
        assert verify(s, Draft("x", tie + "2", "q", (), cut=(tie + "3", 2, 0))) == "tie at the LIMIT cut"
        few = "SELECT name FROM customers WHERE customer_id < 3 ORDER BY name LIMIT "
        assert verify(s, Draft("x", few + "5", "q", (), cut=(few + "6", 5, 0))) == "LIMIT does not cut the result"


def test_bad_arguments_raise_clear_errors(dbs, tmp_path):
    with pytest.raises(ValueError, match="non-negative"):
        generate_text2sql("shop", dbs["shop"], -1)
    with pytest.raises(ValueError, match="difficulty 'trivial'"):
        generate_text2sql("shop", dbs["shop"], 3, difficulties=("trivial",))
    with pytest.raises(ValueError, match="at least one difficulty"):
        generate_text2sql("shop", dbs["shop"], 3, difficulties=())
    with pytest.raises(ValueError, match="not found"):
        generate_text2sql("shop", str(tmp_path / "missing.sqlite"), 3)
    with pytest.raises(ValueError, match="unknown domain"):
        generate_text2sql("atlantis", dbs["shop"], 3)
    assert generate_text2sql("shop", dbs["shop"], 0) == []


def test_a_request_the_database_cannot_satisfy(tmp_path):
    tiny = build_domain_db("music", str(tmp_path / "tiny.sqlite"), seed=0, scale=0.01)
    got = generate_text2sql("music", tiny, 300, seed=0, difficulties=("simple",), attempts_per_task=2)
    assert 0 < len(got) < 300
    assert len({t.gold_sql for t in got}) == len(got)
    with pytest.raises(GenerationError, match="of 300 tasks"):
        generate_text2sql("music", tiny, 300, seed=0, difficulties=("simple",), attempts_per_task=2,
                          strict=True)


def test_one_difficulty_only(dbs):
    tasks = generate_text2sql("flights", dbs["flights"], 9, seed=2, difficulties=("hard",))
    assert len(tasks) == 9 and {t.difficulty for t in tasks} == {"challenging"}


def test_phrasing_patterns_and_errors():
    assert all(len(p) >= 3 for p in QUESTIONS.values())
    slots = {"thing": "book", "things": "books", "label": "title", "labels": "titles", "cond": "whose genre is x"}
    a = [question("filter_list", slots, random.Random(7)) for _ in range(2)]
    assert a[0] == a[1]
    assert len({question("filter_list", slots, random.Random(i)) for i in range(40)}) >= 10
    with pytest.raises(KeyError, match="intent 'nope'"):
        question("nope", slots, random.Random(0))
    with pytest.raises(KeyError, match=r"slot '(k|measure|ext)' missing"):
        question("top_k", slots, random.Random(0))
    with pytest.raises(KeyError, match="condition 'approx'"):
        condition("approx", "price", "3")
    assert condition("between", "price", "1", None, "2") == "whose price is between 1 and 2"
    assert [plural(w) for w in ("title", "city", "class", "day")] == ["titles", "cities", "classes", "days"]


# --- the default dataset -----------------------------------------------------------------------------

@pytest.mark.slow
def test_default_dataset_layout_splits_and_manifest(tmp_path):
    out = tmp_path / "ds"
    m = build_default_dataset(out, seed=1, n_per_domain=24, domains=["shop", "library", "clinic"])
    for name in ("shop", "library", "clinic"):
        assert (out / "databases" / name / f"{name}.sqlite").is_file()
    split = {s: read_tasks(out / f"text2sql_{s}.jsonl") for s in ("train", "dev", "test")}
    ids = [t.task_id for part in split.values() for t in part]
    assert len(ids) == len(set(ids)) == 72
    assert len(split["train"]) > len(split["dev"]) > 0 and len(split["test"]) > 0
    held = {s: read_tasks(out / f"text2sql_heldout_{s}.jsonl") for s in ("train", "test")}
    assert m.held_out and {t.db_id for t in held["test"]} == set(m.held_out)
    assert not {t.db_id for t in held["train"]} & set(m.held_out)
    assert len(held["train"]) + len(held["test"]) == 72
    loaded = load_jsonl(out / "text2sql_dev.jsonl", db_root=out / "databases")
    assert loaded.n_skipped == 0 and set(loaded.catalog) == {t.db_id for t in split["dev"]}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 1 and manifest["counts"]["library"] == {"simple": 8, "moderate": 8, "challenging": 8}
    assert set(manifest["files"]) == {"databases/shop/shop.sqlite", "databases/library/library.sqlite",
                                      "databases/clinic/clinic.sqlite", "text2sql_train.jsonl",
                                      "text2sql_dev.jsonl", "text2sql_test.jsonl",
                                      "text2sql_heldout_train.jsonl", "text2sql_heldout_test.jsonl",
                                      "critic_train.jsonl", "critic_dev.jsonl", "critic_test.jsonl",
                                      "critic_heldout_train.jsonl", "critic_heldout_test.jsonl"}
    assert manifest == m.to_dict()
    # debugging tasks are made from the text-to-SQL tasks of their own split: no gold crosses splits
    for s in ("train", "dev", "test"):
        critic = read_tasks(out / f"critic_{s}.jsonl")
        sources = {t.task_id for t in split[s]}
        assert critic and all(c.instance_id.split("/bug/")[0] in sources for c in critic)
        assert all(c.kind == "critic" and c.sol_sql for c in critic)
    again = build_default_dataset(tmp_path / "ds2", seed=1, n_per_domain=24, domains=["shop", "library", "clinic"])
    assert again.files == m.files  # byte-identical files


def test_default_dataset_rejects_bad_arguments_before_writing(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(ValueError, match="unknown domain"):
        build_default_dataset(out, domains=["shop", "atlantis"])
    with pytest.raises(ValueError, match="n_per_domain"):
        build_default_dataset(out, n_per_domain=0)
    with pytest.raises(ValueError, match="held-out domains"):
        build_default_dataset(out, domains=["shop", "library"], held_out=["music"])
    with pytest.raises(ValueError, match="fractions"):
        build_default_dataset(out, fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="twice"):
        build_default_dataset(out, domains=["shop", "shop"])
    assert not out.exists()
