"""Stage data builders on a small generated dataset (real SQLite sessions): what is kept is
verified, what is dropped is counted with its reason, stage-2 messages are exactly AgentLoop's,
and the RL parquet round-trips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from curriculum.builders import TextChatFormat, build_stage1, build_stage2, build_stage3, build_stage4
from curriculum.openai_teacher import OpenAIConfig, OpenAITeacher
from curriculum.teachers import ProgrammaticTeacher, reference_sql, tool_call_text
from sqlrl.agent import AgentLoop, HFChatFormat, LoopConfig, build_messages, tools_for
from sqlrl.db import SessionPool, open_session
from sqlrl.db.source import LocalSessions
from sqlrl.policy.types import SamplingParams
from sqlrl.rewards import Judge, extract_single
from sqlrl.tasks.loaders import load_jsonl, load_spider, load_verl
from sqlrl.synth import build_default_dataset
from sqlrl.tasks.types import CriticTask, Text2SQLTask
from tests.unit.test_agent_chat_format import FakeTokenizer
from tests.unit.test_agent_loop import ScriptedBackend
from tests.unit.test_curriculum_teachers import FakeServer


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("synth")
    build_default_dataset(out, seed=0, n_per_domain=10, domains=["shop", "library"], scale=0.2)
    t2s = load_jsonl(out / "text2sql_train.jsonl", db_root=out / "databases")
    crit = load_jsonl(out / "critic_train.jsonl", db_root=out / "databases")
    return {"tasks": list(t2s.tasks) + list(crit.tasks), "catalog": t2s.catalog,
            "schemas": t2s.schemas}


def kw(data: dict[str, Any]) -> dict[str, Any]:
    return {"catalog": data["catalog"], "schemas": data["schemas"]}


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


class Scripted:
    """A teacher that answers some tasks badly (by task id) and the rest like ``ProgrammaticTeacher``."""

    def __init__(self, bad: dict[str, str]) -> None:
        self.bad, self.good = bad, ProgrammaticTeacher(0)

    def _how(self, task: Any) -> str | None:
        return self.bad.get(task.task_id)

    def reasoning(self, task: Any, schema: Any) -> Any:
        how = self._how(task)
        if how == "raise":
            raise RuntimeError("teacher down")
        if how == "format":
            return "SELECT 1"
        if how == "wrong":
            return "<thought>guess</thought><solution>SELECT 12345</solution>"
        if how == "error":
            return "<thought>guess</thought><solution>SELECT nope FROM nowhere</solution>"
        if how == "bytes":
            return b"<thought>x</thought>"
        return self.good.reasoning(task, schema)

    def next_turn(self, task: Any, schema: Any, messages: list[dict]) -> str:
        how = self._how(task)
        turn = sum(m["role"] == "assistant" for m in messages)
        if how == "raise" and turn == 1:
            raise RuntimeError("teacher down")
        if how == "format" and turn == 1:
            return "I will just answer: SELECT 1"
        if how == "wrong" and turn == 1:
            return tool_call_text("Done.", "submit_solution", "SELECT 12345")
        if how == "explore":
            return tool_call_text("More.", "execute_sql", "SELECT 1")
        return self.good.next_turn(task, schema, messages)


# -- stage 1 ---------------------------------------------------------------------------------------

def test_stage1_keeps_verified_reasoning_in_the_sft_format(data, tmp_path):
    tasks = data["tasks"]
    rows, report = build_stage1(tasks, ProgrammaticTeacher(0), tmp_path / "s1.jsonl", **kw(data))
    assert report.total == len(tasks) and report.kept == len(rows) == len(tasks)  # the data is verified
    assert lines(tmp_path / "s1.jsonl") == rows
    for task, row in zip(tasks, rows):
        assert set(row) == {"messages", "tools"} and row["tools"] is None
        assert row["messages"][:2] == build_messages(task, data["schemas"][task.db_id], mode="single")
        assert row["messages"][2]["role"] == "assistant" and len(row["messages"]) == 3
        assert extract_single(row["messages"][2]["content"]).sql == reference_sql(task)
    saved = json.loads(Path(report.files["report"]).read_text())
    assert saved == {"stage": "stage1", "total": len(tasks), "kept": len(tasks), "dropped": {},
                     "files": report.files}
    assert len(lines(Path(report.files["outcomes"]))) == len(tasks)


def test_stage1_drops_unverified_answers_with_reasons(data, tmp_path):
    t2s = [t for t in data["tasks"] if t.kind == "text2sql"][:6]
    crit = [t for t in data["tasks"] if t.kind == "critic"][:2]
    bad = {t2s[0].task_id: "raise", t2s[1].task_id: "format", t2s[2].task_id: "wrong",
           t2s[3].task_id: "error", t2s[4].task_id: "bytes", crit[0].task_id: "wrong"}
    rows, report = build_stage1(t2s + crit, Scripted(bad), tmp_path / "s1.jsonl", **kw(data))
    assert report.kept == 2 and len(rows) == 2
    assert report.dropped == {"teacher-error": 2, "format": 1, "wrong-result": 1, "pred-error": 1,
                              "failed": 1}
    by_id = {o.task_id: o for o in report.outcomes}
    assert [o.task_id for o in report.outcomes] == [t.task_id for t in t2s + crit]
    assert by_id[t2s[0].task_id].detail == "RuntimeError: teacher down"
    assert by_id[t2s[2].task_id].texts == ("<thought>guess</thought><solution>SELECT 12345</solution>",)
    assert by_id[t2s[5].task_id].kept and by_id[crit[1].task_id].kept


def test_a_broken_gold_is_dropped_as_gold_error(data, tmp_path):
    broken = Text2SQLTask(task_id="broken", db_id="shop", question="Q?", gold_sql="SELECT x FROM missing_table")
    _, r1 = build_stage1([broken], ProgrammaticTeacher(), tmp_path / "a.jsonl", **kw(data))
    _, r2 = build_stage2([broken], ProgrammaticTeacher(), tmp_path / "b.jsonl", **kw(data))
    assert r1.dropped == {"gold-error": 1} and r2.dropped == {"gold-error": 1}


@pytest.mark.parametrize("build", [build_stage1, build_stage2])
def test_bad_arguments_fail_before_anything_is_written(build, data, tmp_path):
    out = tmp_path / "x.jsonl"
    orphan = Text2SQLTask(task_id="o", db_id="no_such_db", question="Q?", gold_sql="SELECT 1")
    with pytest.raises(ValueError, match=r"not in the catalog: no_such_db \(sqlite\)"):
        build([orphan], ProgrammaticTeacher(), out, **kw(data))
    with pytest.raises(ValueError, match="catalog= .* or judge="):
        build(data["tasks"][:1], ProgrammaticTeacher(), out)
    with pytest.raises(ValueError, match="min_score"):
        build(data["tasks"][:1], ProgrammaticTeacher(), out, min_score=0.0, **kw(data))
    with pytest.raises(ValueError, match="not a task"):
        build(["SELECT 1"], ProgrammaticTeacher(), out, **kw(data))
    assert not out.exists()


def test_output_order_does_not_depend_on_workers(data, tmp_path):
    tasks = data["tasks"][::3]
    one, _ = build_stage2(tasks, ProgrammaticTeacher(2), tmp_path / "a.jsonl", workers=1, **kw(data))
    many, _ = build_stage2(tasks, ProgrammaticTeacher(2), tmp_path / "b.jsonl", workers=4, **kw(data))
    assert one == many and (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


# -- stage 2 ---------------------------------------------------------------------------------------

def test_stage2_trajectories_run_on_real_sessions_and_are_verified(data, tmp_path):
    tasks = data["tasks"]
    rows, report = build_stage2(tasks, ProgrammaticTeacher(0), tmp_path / "s2.jsonl", **kw(data))
    assert report.kept == len(rows) == len(tasks)
    assert lines(tmp_path / "s2.jsonl") == rows
    n_calls = set()
    for task, row in zip(tasks, rows):
        assert row["tools"] == tools_for("agentic")
        msgs = row["messages"]
        assert msgs[:2] == build_messages(task, data["schemas"][task.db_id], mode="agentic")
        calls = [m["tool_calls"][0]["function"] for m in msgs if m["role"] == "assistant"]
        assert calls[-1] == {"name": "submit_solution", "arguments": {"sql": reference_sql(task)}}
        assert msgs[-1]["role"] == "assistant"
        n_calls.add(len(calls) - 1)
        # every observation is what a fresh real session shows for that call (read-only SQL here)
        url = data["catalog"][task.db_id]["sqlite"]
        pre = task.preprocess_sql if isinstance(task, CriticTask) else ()
        with open_session(url, preprocess_sql=pre) as s:
            from sqlrl.tools import format_observation
            for call, tool in zip(calls, [m for m in msgs if m["role"] == "tool"]):
                assert tool == {"role": "tool", "name": "execute_sql",
                                "content": format_observation(s.execute(call["arguments"]["sql"]))}
    assert n_calls == {1, 2, 3}  # the data is not uniform


def test_stage2_messages_are_exactly_what_agent_loop_produces(data, tmp_path):
    """Replay the teacher's texts through AgentLoop with a real (Qwen2.5) chat template and a
    scripted backend: same messages; the template re-renders every teacher text verbatim."""
    tasks = [t for t in data["tasks"] if t.kind == "text2sql"][:3] + \
            [t for t in data["tasks"] if t.kind == "critic"][:3]
    rows, report = build_stage2(tasks, ProgrammaticTeacher(4), tmp_path / "s2.jsonl", **kw(data))
    assert report.kept == len(tasks)
    tok = FakeTokenizer()
    for task, row, outcome in zip(tasks, rows, report.outcomes):
        key = task.question if isinstance(task, Text2SQLTask) else task.query
        backend = ScriptedBackend(tok, {key: list(outcome.texts)})
        url = data["catalog"][task.db_id]["sqlite"]
        pre = task.preprocess_sql if isinstance(task, CriticTask) else ()
        with open_session(url, preprocess_sql=pre) as session:
            traj = AgentLoop([task], [session], backend, HFChatFormat(tok),
                             LoopConfig(max_total_tokens=200_000,
                                        sampling=SamplingParams(max_new_tokens=4000)),
                             schemas=data["schemas"]).run()[0]
        assert traj.stop_reason == "submitted"
        assert list(traj.messages) == row["messages"]
        rendered = tok.render(row["messages"], row["tools"])
        for text in outcome.texts:
            assert text in rendered


def test_stage2_drops_unverified_trajectories_with_reasons(data, tmp_path):
    t2s = [t for t in data["tasks"] if t.kind == "text2sql"][:5]
    bad = {t2s[0].task_id: "raise", t2s[1].task_id: "format", t2s[2].task_id: "wrong",
           t2s[3].task_id: "explore"}
    rows, report = build_stage2(t2s, Scripted(bad), tmp_path / "s2.jsonl", max_turns=4, **kw(data))
    assert report.kept == 1 and len(rows) == 1
    assert report.dropped == {"teacher-error": 1, "malformed": 1, "wrong-result": 1, "no-submit": 1}
    by_id = {o.task_id: o for o in report.outcomes}
    assert "no tool call found" in by_id[t2s[1].task_id].detail
    assert by_id[t2s[3].task_id].detail == "stopped by max_turns" and len(by_id[t2s[3].task_id].texts) == 4


def test_stage2_session_failure_drops_only_that_task(data, tmp_path):
    class NoLibrary(LocalSessions):
        def open_many(self, requests):
            if any("library" in r.db for r in requests):
                raise ConnectionError("no session for you")
            return super().open_many(requests)
    tasks = data["tasks"]
    rows, report = build_stage2(tasks, ProgrammaticTeacher(), tmp_path / "s2.jsonl", sessions=NoLibrary(),
                                **kw(data))
    n_lib = sum(t.db_id == "library" for t in tasks)
    assert 0 < n_lib < len(tasks)
    assert report.dropped == {"session-error": n_lib} and report.kept == len(tasks) - n_lib


def test_stage2_on_a_session_pool_gives_the_same_rows(data, tmp_path):
    tasks = data["tasks"][::4]
    local, _ = build_stage2(tasks, ProgrammaticTeacher(), tmp_path / "a.jsonl", **kw(data))
    with SessionPool() as pool:
        pooled, report = build_stage2(tasks, ProgrammaticTeacher(), tmp_path / "b.jsonl",
                                      sessions=LocalSessions(pool=pool), **kw(data))
        assert pool.stats().leases >= len(tasks)  # the trajectories ran on the pool's sessions
    assert pooled == local and report.kept == len(tasks)


def test_text_chat_format_is_a_concatenable_code_point_format():
    fmt = TextChatFormat()
    m = [{"role": "user", "content": "é"}]
    assert fmt.decode(fmt.prompt_ids(m)) == json.dumps(m[0], ensure_ascii=False, sort_keys=True) + "\n"
    assert fmt.continuation_ids(m, m, close_turn=True)[:1] == [0x1E]


# -- an OpenAI-compatible teacher end to end (the fake server) -------------------------------------

def test_openai_teacher_output_is_verified_by_the_builders(data, tmp_path):
    tasks = [t for t in data["tasks"] if t.kind == "text2sql"][:4]
    gold = {t.question: t.gold_sql for t in tasks}

    def reply(body: dict) -> str:
        text = "\n".join(m["content"] for m in body["messages"])
        q = next(q for q in gold if q in text)
        wrong = q == tasks[0].question
        sql = "SELECT 999" if wrong else gold[q]
        if "<thought>" in body["messages"][0]["content"]:  # single-turn prompt
            return f"<thought>I read the question.</thought>\n<solution>{sql}</solution>"
        if text.count("<tool_response>") == 0:
            return tool_call_text("Let me check.", "execute_sql", sql)
        return tool_call_text("Good.", "submit_solution", sql)

    server = FakeServer(reply)
    try:
        teacher = OpenAITeacher(OpenAIConfig(base_url=server.url, model="fake", workers=2,
                                             cache_path=str(tmp_path / "cache.jsonl")), progress=False)
        rows1, r1 = build_stage1(tasks, teacher, tmp_path / "s1.jsonl", **kw(data))
        rows2, r2 = build_stage2(tasks, teacher, tmp_path / "s2.jsonl", **kw(data))
        sent = len(server.requests)
        again, _ = build_stage2(tasks, teacher, tmp_path / "s2b.jsonl", **kw(data))
    finally:
        server.close()
    assert r1.kept == r2.kept == 3 and r1.dropped == r2.dropped == {"wrong-result": 1}
    assert sent == 4 + 4 * 2 and again == rows2  # the rerun came from the cache
    assert all(len([m for m in r["messages"] if m["role"] == "tool"]) == 1 for r in rows2)


# -- stages 3 and 4 --------------------------------------------------------------------------------

@pytest.mark.parametrize("build, mode, agent", [(build_stage3, "single", None),
                                                 (build_stage4, "agentic", "sqlrl_agent")])
def test_rl_data_round_trips_through_verl_parquet(build, mode, agent, data, tmp_path):
    tasks = data["tasks"]
    kept, report = build(tasks, tmp_path, schemas=data["schemas"])
    assert kept == tasks and report.kept == len(tasks)
    parquet = Path(report.files["parquet"])
    assert [t.to_dict() for t in load_verl(parquet).tasks] == [t.to_dict() for t in tasks]
    assert [t.to_dict() for t in load_jsonl(report.files["tasks"]).tasks] == [t.to_dict() for t in tasks]
    table = pq.read_table(parquet)
    assert table.column("prompt").to_pylist() == [
        build_messages(t, data["schemas"][t.db_id], mode=mode) for t in tasks]
    assert ("agent_name" in table.column_names) == (agent is not None)
    if agent:
        assert set(table.column("agent_name").to_pylist()) == {agent}
    info = table.column("extra_info").to_pylist()
    crit = next(i for i, t in enumerate(tasks) if isinstance(t, CriticTask))
    assert info[crit]["tools_kwargs"]["execute_sql"]["create_kwargs"]["db_id"] == tasks[crit].db_id


def test_rl_data_with_a_judge_drops_broken_references(data, tmp_path):
    broken = Text2SQLTask(task_id="broken", db_id="shop", question="Q?", gold_sql="SELECT x FROM missing_table")
    tasks = data["tasks"][:5] + [broken]
    kept, report = build_stage3(tasks, tmp_path, schemas=data["schemas"], judge=Judge(data["catalog"]))
    assert kept == data["tasks"][:5] and report.dropped == {"gold-error": 1}
    assert len(load_verl(report.files["parquet"]).tasks) == 5


def test_rl_data_bad_arguments(data, tmp_path):
    with pytest.raises(ValueError, match="mode"):
        from curriculum.builders import build_rl_data
        build_rl_data(data["tasks"], tmp_path, "x", mode="multi")
    with pytest.raises(ValueError, match="file stem"):
        build_stage3(data["tasks"], tmp_path, name="a/b")
    assert list(tmp_path.iterdir()) == []


# -- Spider (real benchmark SQL) -------------------------------------------------------------------

@pytest.mark.spider
def test_stage1_and_stage2_on_spider_dev(spider_dir, tmp_path):
    ts = load_spider(spider_dir, "dev")
    tasks = list(ts.tasks[:24])
    _, r1 = build_stage1(tasks, ProgrammaticTeacher(), tmp_path / "s1.jsonl", catalog=ts.catalog,
                         schemas=ts.schemas)
    rows, r2 = build_stage2(tasks, ProgrammaticTeacher(), tmp_path / "s2.jsonl", catalog=ts.catalog,
                            schemas=ts.schemas)
    # the gold answers are kept unless the gold itself is unusable (errors / empty for critic)
    assert set(r1.dropped) <= {"gold-error"} and r1.kept >= 20
    assert r2.kept == r1.kept and set(r2.dropped) <= {"gold-error"}
    assert all(json.dumps(r) for r in rows)


# -- stage 2's replay of single-turn rows (sft.replay) -----------------------------------------------

@pytest.mark.parametrize("replay", [0.0, 0.5])
def test_tooluse_sft_replays_verified_single_turn_rows_for_a_fraction_of_the_tasks(data, tmp_path, replay,
                                                                                   monkeypatch):
    from curriculum.config import load_stage_config
    from curriculum.stages import STAGES, BuildInputs, build_tooluse_sft

    tasks = data["tasks"][:6]
    bad = {tasks[0].task_id: "wrong"}  # its single-turn answer fails: dropped, counted as replay-*
    cfg = load_stage_config(STAGES["stage2"].config_path(),
                            [f"run_dir={tmp_path}", f"sft.replay={replay}", "teacher.explore=0"])
    inp = BuildInputs(cfg=cfg, tasks=tasks, sessions=LocalSessions(), **kw(data))
    monkeypatch.setattr("curriculum.config.TeacherConfig.build", lambda self, stage_dir: Scripted(bad))
    examples, report = build_tooluse_sft(inp)
    agentic = [e for e in examples if e.tools]
    single = [e for e in examples if not e.tools]
    assert len(agentic) == 5  # the "wrong" task's trajectory submits a wrong answer: dropped
    if replay == 0:
        assert single == [] and "replay" not in report.files
        assert not (tmp_path / "stage2" / "replay_data.jsonl").exists()
        return
    # the first round(6 * 0.5) = 3 tasks get a single-turn row; the "wrong" one is dropped
    assert len(single) == 2 and report.total == 6 + 3 and report.kept == 5 + 2
    assert report.dropped == {"wrong-result": 1, "replay-wrong-result": 1}
    assert report.files["replay"] == str(tmp_path / "stage2" / "replay_data.jsonl")
    kept = lines(tmp_path / "stage2" / "replay_data.jsonl")
    assert len(kept) == 2
    for row, ex in zip(kept, single):
        answer = row["messages"][-1]["content"]
        assert extract_single(answer).format_ok and ex.messages[-1]["content"] == answer


def test_replay_must_be_a_fraction():
    from curriculum.config import SFTSettings

    for bad in (-0.1, 1.5, True, "half"):
        with pytest.raises(ValueError, match=r"sft.replay must be a fraction in \[0, 1\]"):
            SFTSettings(replay=bad)
