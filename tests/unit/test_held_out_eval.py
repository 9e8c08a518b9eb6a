"""jobs.held_out with the rollouts and rewards faked: the summary keeps its keys and gains per-task
outcomes and the Wilson interval; two evaluations compare task by task; a stage's summary finds the
latest earlier stage evaluated in the same mode; jobs.stage_data draws one stratified held-out set
for every stage; jobs.main's table shows intervals and changes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

import jobs.held_out as held_out
import jobs.main as job_main
import jobs.stage_data as stage_data
from sqlrl.eval.stats import wilson_interval


@dataclass(frozen=True)
class Task:
    task_id: str
    kind: str
    difficulty: str
    db_id: str


@dataclass
class Breakdown:
    parts: dict
    excluded: bool = False


class FakeRuntime:
    """Rolls out nothing; the reward solves the tasks named in ``solved`` and excludes ``broken``;
    the "model" writes token 7 on every task, or ``answers[task_id]``."""

    def __init__(self, solved: set[str], broken: set[str] = frozenset(), answers: dict | None = None) -> None:
        self.cfg = SimpleNamespace(rollout=SimpleNamespace(batch=3), eval=SimpleNamespace(temperature=0.0))
        self.solved, self.broken, self.released, self.answers = solved, broken, 0, answers or {}

    def rollout_group(self, model, mode, temperature):
        def traj(t):  # prompt id 5 (masked out), then what the model wrote
            return SimpleNamespace(turns=[1], stop_reason="submit", token_ids=(5, self.answers.get(t.task_id, 7)),
                                   loss_mask=(0, 1))
        return SimpleNamespace(rollout=lambda tasks: [traj(t) for t in tasks])

    def release(self, group):
        self.released += 1

    def score(self, trajs, tasks, reward):
        return [Breakdown({"result": float(t.task_id in self.solved), "format": 1.0}, t.task_id in self.broken)
                for t in tasks]


TASKS = [Task(f"t{i}", "text2sql" if i % 2 else "critic", "simple", "shop") for i in range(8)]


def test_evaluate_keeps_its_keys_and_adds_per_task_outcomes_and_the_interval():
    ev = held_out.evaluate(FakeRuntime({"t1", "t2", "t3"}, broken={"t7"}), "tiny", TASKS, "single")
    assert isinstance(ev, held_out.Evaluation) and isinstance(ev.per_task["t1"], held_out.TaskResult)
    assert (ev.scored, ev.successes, ev.per_task["t7"].success, ev.by_kind["text2sql"]) == (7, 3, None, 2 / 3)
    with pytest.raises(AttributeError):
        ev.success = 1.0  # frozen
    out = ev.to_dict()
    assert {"model", "mode", "n", "scored", "success", "success_critic", "success_text2sql", "format_ok",
            "mean_turns", "stop_reasons", "seconds"} <= set(out)
    assert out["n"] == 8 and out["scored"] == 7 and out["successes"] == 3 and out["success"] == pytest.approx(3 / 7)
    assert out["success_ci95"] == list(wilson_interval(3, 7))
    answer = out["per_task"]["t1"].pop("answer")
    assert out["per_task"]["t1"] == {"success": 1, "kind": "text2sql", "difficulty": "simple", "domain": "shop"}
    assert len(answer) == 16 and answer == out["per_task"]["t2"]["answer"]  # the same generated ids
    assert out["per_task"]["t0"]["success"] == 0 and out["per_task"]["t7"]["success"] is None
    assert json.loads(json.dumps(out)) == out  # summary.json-ready


def test_compare_matches_by_task_and_reports_what_does_not_match():
    before = held_out.evaluate(FakeRuntime({"t1"}), "a", TASKS, "single")
    after = held_out.evaluate(FakeRuntime({"t1", "t2", "t3", "t4"}, broken={"t7"}), "b", TASKS, "single")
    d = held_out.compare(before, after)
    assert d["n"] == 7 and d["gained"] == 3 and d["lost"] == 0 and d["unscored"] == ["t7"]
    assert d["diff"] == pytest.approx(3 / 7) and d["ci95"][0] > 0
    assert "unmatched tasks!" in held_out.change_text(d) and held_out.change_text(d).startswith("+0.43 [+")
    assert held_out.compare({"success": 0.5}, after) is None  # an old summary without per-task outcomes
    assert d["answers_compared"] == 8 and d["answers_changed"] == 0  # the fake wrote the same ids both times


def test_compare_counts_the_tasks_whose_generated_output_changed():
    before = held_out.evaluate(FakeRuntime({"t1"}), "a", TASKS, "single")
    after = held_out.evaluate(FakeRuntime({"t1"}, answers={"t0": 8, "t3": 9}), "b", TASKS, "single")
    d = held_out.compare(before, after)
    assert d["diff"] == 0 and (d["answers_changed"], d["answers_compared"]) == (2, 8)
    assert held_out.change_text(d) == "+0.00 [+0.00, +0.00] (n=8, +0/-0, 2 answers changed)"
    old = {"per_task": {t: {k: v for k, v in x.items() if k != "answer"}
                        for t, x in before.to_dict()["per_task"].items()}}
    assert "answers_changed" not in held_out.compare(old, after)  # a summary from before fingerprints
    assert held_out.success_text({"success": 0.5}) == "0.50"


def test_a_stage_summary_compares_with_the_latest_earlier_stage_in_the_same_mode(tmp_path):
    def write(stage, evals):
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "summary.json").write_text(json.dumps({"eval": evals}))

    single1 = held_out.evaluate(FakeRuntime(set()), "s1", TASKS, "single")
    agentic2 = held_out.evaluate(FakeRuntime({"t0"}), "s2", TASKS, "agentic")
    write("stage1", [single1.to_dict()])
    write("stage2", [agentic2.to_dict()])
    now = [held_out.evaluate(FakeRuntime({"t0", "t1"}), "s3", TASKS, "single"),
           held_out.evaluate(FakeRuntime({"t0", "t1"}), "s3", TASKS, "agentic")]
    changes = held_out.changes_since_earlier(tmp_path, "stage3", now)
    assert changes["single"]["vs"] == "stage1" and changes["single"]["gained"] == 2
    assert changes["agentic"]["vs"] == "stage2" and changes["agentic"]["gained"] == 1
    assert held_out.changes_since_earlier(tmp_path, "stage1", now) == {}  # nothing before stage 1


def test_every_stage_config_draws_the_same_stratified_held_out_set():
    pool = [Task(f"{k}/{db}/{lvl}/{i}", k, lvl, db) for k in ("text2sql", "critic")
            for db in ("shop", "music", "clinic") for lvl in ("simple", "moderate", "challenging") for i in range(4)]
    data = SimpleNamespace(eval_size=64, seed=0, held_out_mixture={"text2sql": 0.5, "critic": 0.5})
    a = stage_data.held_out_tasks(pool, SimpleNamespace(data=data))
    b = stage_data.held_out_tasks(list(reversed(pool)), SimpleNamespace(data=data))
    assert [t.task_id for t in a] == [t.task_id for t in b] and len({t.task_id for t in a}) == 64
    assert sum(t.kind == "critic" for t in a) == 32


def test_a_talon_run_is_trained_on_debugging_and_scored_on_both_kinds(monkeypatch, tmp_path):
    from curriculum.config import DataConfig, load_stage_config

    assert DataConfig(mixture={"critic": 1.0}).held_out_mixture == {"critic": 1.0}
    talon = DataConfig(mixture={"critic": 1.0}, eval_mixture={"text2sql": 0.5, "critic": 0.5})
    assert talon.held_out_mixture == {"text2sql": 0.5, "critic": 0.5}
    with pytest.raises(ValueError):
        DataConfig(eval_mixture={"text2sql": -1.0})
    (tmp_path / "manifest.json").write_text("{}")
    loaded = {}

    def load_split(root, split, kinds):
        loaded[split] = list(kinds)
        return []

    monkeypatch.setattr(stage_data, "_load_split", load_split)
    cfg = load_stage_config(None, ["stage=stage1", f"data.synth_dir={tmp_path}", "data.mixture={critic: 1.0}",
                                   "data.eval_mixture={text2sql: 0.5, critic: 0.5}"])
    stage_data.generated(cfg)
    assert loaded == {"train": ["critic"], "test": ["text2sql", "critic"]}


def test_an_eval_split_may_name_several_splits_and_never_a_training_one(monkeypatch, tmp_path):
    """``data.eval_split: test+dev`` reads both held-out splits of every kind; a missing file is
    named; a split on both the training and the held-out side is refused."""
    import sqlrl.tasks.loaders as loaders
    from curriculum.config import DataConfig

    for name in ("text2sql_test", "critic_test", "text2sql_dev"):
        (tmp_path / f"{name}.jsonl").write_text("")
    monkeypatch.setattr(loaders, "load", lambda fmt, path, db_root: path.name)
    assert stage_data._load_split(tmp_path, "test", ["text2sql", "critic"]) == [
        "text2sql_test.jsonl", "critic_test.jsonl"]
    with pytest.raises(FileNotFoundError, match="critic_dev.jsonl does not exist"):
        stage_data._load_split(tmp_path, "test+dev", ["text2sql", "critic"])
    (tmp_path / "critic_dev.jsonl").write_text("")
    assert stage_data._load_split(tmp_path, "test+dev", ["text2sql", "critic"]) == [
        "text2sql_test.jsonl", "critic_test.jsonl", "text2sql_dev.jsonl", "critic_dev.jsonl"]
    assert DataConfig(eval_split="test+dev").eval_split == "test+dev"
    for train, held in (("train", "test+train"), ("train+dev", "dev"), ("test", "test")):
        with pytest.raises(ValueError, match="would be trained on"):
            DataConfig(train_split=train, eval_split=held)


@dataclass(frozen=True)
class OriginTask:
    task_id: str
    kind: str
    meta: dict
    difficulty: str = "simple"
    db_id: str = "shop"


def test_unseen_training_tasks_leave_out_every_origin_an_earlier_stage_trained_on(monkeypatch, tmp_path):
    """``data.unseen``: stage 3 draws from the pool less the questions stage 1 trained on, a
    debugging task made from such a question included; without it, stage 3 re-draws stage 1's tasks."""
    from curriculum.config import load_stage_config
    from sqlrl.config import dump_config

    questions = [OriginTask(f"q{i}", "text2sql", {}) for i in range(12)]
    bugs = [OriginTask(f"bug/{i}", "critic", {"origin_task_id": f"q{(i * 5) % 12}"}) for i in range(12)]
    monkeypatch.setitem(stage_data.SOURCES, "generated", lambda cfg: (questions + bugs, [], {}, {}, "fake"))

    def config(stage, *extra):
        return load_stage_config(None, [f"stage={stage}", f"run_dir={tmp_path}", *extra])

    origins = lambda data: {stage_data.task_origin(t) for t in data.train}  # noqa: E731
    assert stage_data.prepare_data(config("stage3", "data.train_size=4", "data.unseen=true")).train  # nothing before it
    stage1 = config("stage1", "data.train_size=8")
    (tmp_path / "stage1").mkdir()
    dump_config(stage1, tmp_path / "stage1" / "config.yaml")
    seen = origins(stage_data.prepare_data(stage1))
    assert stage_data.seen_origins(config("stage3"))[0] == seen and len(seen) > 4
    again = stage_data.prepare_data(config("stage3", "data.train_size=4"))
    assert origins(again) & seen  # the default draws what stage 1 trained on
    fresh = stage_data.prepare_data(config("stage3", "data.train_size=4", "data.unseen=true"))
    assert len(fresh.train) == 4 and not origins(fresh) & seen
    # a debugging task whose question stage 1 trained on as text-to-SQL is left out too
    assert any(t.kind == "critic" and t.meta["origin_task_id"] in seen for t in bugs)
    assert all(stage_data.task_origin(t) not in seen for t in fresh.train if t.kind == "critic")


@pytest.mark.skipif(not (SPIDER := __import__("pathlib").Path(__file__).resolve().parents[3] / "shared" / "data" / "spider").is_dir(),
                    reason="../shared/data/spider is absent (Spider is read from the shared data folder, never copied)")
def test_the_spider_subset_is_fixed_balanced_and_from_databases_never_trained_on():
    a = stage_data.spider_held_out(SPIDER, 100, seed=1)
    b = stage_data.spider_held_out(SPIDER, 100, seed=1)
    assert [t.task_id for t in a.eval] == [t.task_id for t in b.eval] and len({t.task_id for t in a.eval}) == 100
    assert {t.kind for t in a.eval} == {"text2sql"} and all(t.db_id in a.catalog for t in a.eval)
    assert len({t.db_id for t in a.eval}) >= 15 and {t.difficulty for t in a.eval} == {"simple", "moderate", "challenging"}
    train_dbs = {t.db_id for t in __import__("sqlrl.tasks.loaders", fromlist=["load"]).load("spider", SPIDER, split="train").tasks}
    assert not train_dbs & {t.db_id for t in a.eval}


def test_a_missing_spider_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="dev.json does not exist: give the Spider folder"):
        stage_data.spider_held_out(tmp_path, 100)


def test_the_results_table_shows_intervals_and_paired_changes():
    base = held_out.evaluate(FakeRuntime({"t1"}), "base", TASKS, "single").to_dict()
    after = held_out.evaluate(FakeRuntime({"t1", "t2", "t3", "t4", "t5"}, answers=dict.fromkeys(["t2", "t3", "t4", "t5"], 8)),
                              "s1", TASKS, "single").to_dict()
    rows = [{"name": "base (tiny)", "eval": {"single": base}, "seconds": 1.0},
            {"name": "+ stage1", "eval": {"single": after}, "seconds": 2.0}]
    job_main.add_changes(rows, ["single"])
    assert rows[0]["change"] == {} and rows[1]["change"]["single"]["vs"] == "base (tiny)"
    _, md = job_main.results_table(rows, ["single"], "generated")
    lo, hi = wilson_interval(5, 8)
    assert f"| + stage1 | 0.62 [{lo:.2f}, {hi:.2f}] (format 1.00, n=8) |" in md
    assert "single +0.50 [+" in md and "(n=8, +4/-0, 4 answers changed)" in md
    assert "change: single +0.50" in job_main.phase_line(rows[1], ["single"])
