"""Stage data builders: tasks + a teacher -> verified training files for the four curriculum stages.

- ``build_stage1`` (reasoning SFT): ``build_messages(task, schema, "single")`` + the teacher's
  ``reasoning`` as the assistant message. Rows ``{"messages": [...], "tools": null}``.
- ``build_stage2`` (tool-use SFT): a multi-turn trajectory per task, run turn by turn on a REAL
  session by ``sqlrl.agent.AgentLoop`` itself -- the teacher is the loop's generation backend
  (through ``TextChatFormat``, a code-point "tokenizer"), so the system prompt, the parsing of
  each turn, the tool execution and the tool messages are the loop's own code path, not a copy.
  Rows ``{"messages": [...], "tools": [tool schemas]}`` (the learner's SFTExample format).
- ``build_stage3`` / ``build_stage4`` (RL): the tasks as verl parquet
  (``sqlrl.tasks.loaders.verl.export_verl``; prompts from ``build_messages`` in single /
  agentic mode) plus our task JSONL alongside; stage 4 sets verl's ``agent_name`` to sqlrl's agent
  loop (``sqlrl_agent``, actors/verl: one database session per trajectory).

Guarantees:
- **Nothing unverified is kept.** A stage-1 response is kept only when it passes the strict
  single-turn format check and its SQL earns at least ``min_score`` (default 1.0: a match / every
  test case passed) from the task's reward (``sqlrl.rewards.compute``, ``hybrid_single``: BIRD EX
  or the BIRD-CRITIC test cases) executed on real sessions. A stage-2 trajectory is kept only
  when every turn parsed (no malformed turn), it ended by ``submit_solution``, and the submitted
  SQL passes ``hybrid_agentic`` likewise. Tasks whose reference itself fails (``excluded``) are
  dropped as ``gold-error``; with ``judge=`` the RL stages drop tasks whose reference does not pass
  its own check.
- **Every task is accounted for.** ``BuildReport`` counts kept and dropped-by-reason (teacher-error,
  prompt-error, format, malformed, no-submit, session-error, gold-error, pred-error, wrong-result,
  failed, …) and lists one ``Outcome`` per task (with the teacher's raw texts), in input order.
  The report is written next to the data (``<name>.report.json``, ``<name>.outcomes.jsonl``).
- A teacher exception, a session that cannot open, or a failing reward for one task drops that
  task with its reason; it never stops the build. A database missing from the catalog is a
  configuration error: ``ValueError`` naming it, before any work. Bad arguments raise
  ``ValueError`` before anything is written.
- Output order = input order (whatever ``workers``); files are written atomically
  (``sqlrl.tasks.io.write_jsonl_atomic``, ``export_verl``). The RL files are read back after
  writing and must give the same tasks (``to_dict``) and prompts, else ``RuntimeError``.
"""

from __future__ import annotations

import copy
import json
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from sqlrl.agent.loop import AgentLoop, LoopConfig, RolloutState
from sqlrl.agent.prompts import build_messages, tools_for
from sqlrl.db import Limits
from sqlrl.policy.types import Generation, SamplingParams
from sqlrl.db.source import LocalSessions, SessionRequest, SessionSource, open_one
from sqlrl.rewards import Judge, compute, extract_single
from sqlrl.tasks.io import read_tasks, write_jsonl_atomic, write_tasks
from sqlrl.tasks.loaders.verl import export_verl, load_verl
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tasks.kinds import kind_of
from sqlrl.tasks.types import Task

from .openai_teacher import progress_bar
from .teachers import Teacher

__all__ = ["BuildReport", "Outcome", "TextChatFormat", "build_stage1", "build_stage2",
           "build_stage3", "build_stage4", "build_rl_data"]


@dataclass(frozen=True)
class Outcome:
    task_id: str
    kind: str  # task kind
    kept: bool
    reason: str  # "ok" or why it was dropped
    detail: str = ""
    texts: tuple[str, ...] = ()  # the teacher's raw responses, in order
    score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "kind": self.kind, "kept": self.kept,
                "reason": self.reason, "detail": self.detail, "texts": list(self.texts),
                "score": self.score}


@dataclass(frozen=True)
class BuildReport:
    stage: str
    total: int
    kept: int
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> count
    files: dict[str, str] = field(default_factory=dict)  # role -> path
    outcomes: tuple[Outcome, ...] = ()

    @property
    def n_dropped(self) -> int:
        return self.total - self.kept

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "total": self.total, "kept": self.kept,
                "dropped": dict(sorted(self.dropped.items())), "files": dict(self.files)}

    def summary(self) -> str:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(self.dropped.items())) or "none"
        return f"{self.stage}: kept {self.kept} of {self.total} (dropped: {why})"


def _report(stage: str, outcomes: Sequence[Outcome], files: dict[str, str]) -> BuildReport:
    dropped: dict[str, int] = {}
    for o in outcomes:
        if not o.kept:
            dropped[o.reason] = dropped.get(o.reason, 0) + 1
    return BuildReport(stage, len(outcomes), sum(o.kept for o in outcomes), dropped, files,
                       tuple(outcomes))


def _write_report(report: BuildReport, base: Path) -> BuildReport:
    files = dict(report.files)
    files["report"] = str(base.with_name(base.name + ".report.json"))
    files["outcomes"] = str(base.with_name(base.name + ".outcomes.jsonl"))
    report = BuildReport(report.stage, report.total, report.kept, report.dropped, files,
                         report.outcomes)
    write_jsonl_atomic(files["outcomes"], (o.to_dict() for o in report.outcomes))
    tmp = Path(files["report"] + ".tmp")
    tmp.write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(files["report"])
    return report


# -- shared checks ---------------------------------------------------------------------------------

def _tasks(tasks: Iterable[Task]) -> list[Task]:
    out = list(tasks)
    for i, t in enumerate(out):
        if not hasattr(t, "kind") or not hasattr(t, "task_id"):
            raise ValueError(f"item {i} is not a task: {type(t).__name__}")
    return out


def _judge(judge: Judge | None, catalog: Mapping[str, Mapping[str, str]] | None,
           tasks: Sequence[Task], limits: Limits | None) -> Judge:
    if judge is None:
        if catalog is None:
            raise ValueError("give catalog= ({db_id: {dialect: url}}) or judge= to verify the data")
        judge = Judge(catalog, limits=limits)
    missing = sorted({f"{t.db_id} ({t.dialect})" for t in tasks
                      if t.dialect not in judge.catalog.get(t.db_id, {})})
    if missing:
        raise ValueError(f"{len(missing)} database(s) are not in the catalog: {', '.join(missing[:10])}"
                         f"{' …' if len(missing) > 10 else ''}")
    return judge


def _check_common(min_score: float, workers: int) -> None:
    if not 0.0 < min_score <= 1.0:
        raise ValueError(f"min_score must be in (0, 1], got {min_score!r}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")


def _run_all(fn: Callable[[Task], Any], tasks: Sequence[Task], workers: int, progress: bool,
             desc: str) -> list[Any]:
    out: list[Any] = [None] * len(tasks)
    bar = progress_bar(len(tasks), progress, desc)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(fn, t): i for i, t in enumerate(tasks)}
        for fut in as_completed(futures):
            out[futures[fut]] = fut.result()
            bar.update(1)
    bar.close()
    return out


def _write_sft(stage: str, results: Sequence[tuple[Outcome, dict[str, Any] | None]],
               out_path: str | Path) -> tuple[list[dict[str, Any]], BuildReport]:
    """The kept rows of an SFT build to ``out_path`` (JSONL), its report beside them."""
    rows = [r for _, r in results if r is not None]
    out = Path(out_path)
    write_jsonl_atomic(out, rows)
    report = _report(stage, [o for o, _ in results], {"sft": str(out)})
    return rows, _write_report(report, out)


def _graded(task: Task, reward: str, response: Any, judge: Judge, min_score: float,
            texts: tuple[str, ...]) -> Outcome:
    try:
        b = compute(reward, task, response, judge)
    except Exception as exc:  # a reward/judge failure on one task must not stop the build
        return Outcome(task.task_id, task.kind, False, "reward-error",
                       f"{type(exc).__name__}: {exc}", texts)
    if b.excluded:
        return Outcome(task.task_id, task.kind, False, "gold-error", b.reason, texts, b.score)
    if b.score < min_score:
        reason = b.reason.split(":", 1)[0].split(",", 1)[0] or "low-score"
        return Outcome(task.task_id, task.kind, False, reason, b.reason, texts, b.score)
    return Outcome(task.task_id, task.kind, True, "ok", "", texts, b.score)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# -- stage 1: reasoning SFT ------------------------------------------------------------------------

def build_stage1(tasks: Iterable[Task], teacher: Teacher, out_path: str | Path, *,
                 catalog: Mapping[str, Mapping[str, str]] | None = None, judge: Judge | None = None,
                 schemas: Mapping[str, DatabaseSchema] | None = None, min_score: float = 1.0,
                 reward: str = "hybrid_single", limits: Limits | None = None, workers: int = 4,
                 progress: bool = False, schema_style: str | None = None
                 ) -> tuple[list[dict[str, Any]], BuildReport]:
    """Single-turn reasoning examples, verified by execution; writes ``out_path`` (JSONL).
    ``schema_style`` (here and below): the prompts' schema rendering, as ``build_messages``'s."""
    tasks = _tasks(tasks)
    _check_common(min_score, workers)
    judge = _judge(judge, catalog, tasks, limits)
    schemas = schemas or {}

    def one(task: Task) -> tuple[Outcome, dict[str, Any] | None]:
        try:
            messages = build_messages(task, schemas.get(task.db_id), mode="single", style=schema_style)
        except Exception as exc:
            return Outcome(task.task_id, task.kind, False, "prompt-error", _describe(exc)), None
        try:
            text = teacher.reasoning(task, schemas.get(task.db_id))
        except Exception as exc:
            return Outcome(task.task_id, task.kind, False, "teacher-error", _describe(exc)), None
        if not isinstance(text, str):
            return Outcome(task.task_id, task.kind, False, "teacher-error",
                           f"the teacher returned {type(text).__name__}, not text"), None
        text = text.strip()
        ex = extract_single(text)
        if not ex.format_ok:
            return Outcome(task.task_id, task.kind, False, "format", ex.problem, (text,)), None
        outcome = _graded(task, reward, text, judge, min_score, (text,))
        row = {"messages": messages + [{"role": "assistant", "content": text}], "tools": None}
        return outcome, row if outcome.kept else None

    return _write_sft("stage1", _run_all(one, tasks, workers, progress, "stage1"), out_path)


# -- stage 2: tool-use SFT -------------------------------------------------------------------------

class TextChatFormat:
    """A ``ChatFormat`` at the text level (token id = Unicode code point), to drive ``AgentLoop``
    with a teacher instead of a model. Messages render as one JSON line each; a turn ends with
    the record separator ``\\x1e``. Ids here are not a model's tokens: only ``messages`` matter."""

    end_of_turn = "\x1e"
    turn_end_ids = (0x1E,)

    @staticmethod
    def _ids(messages: Sequence[dict[str, Any]]) -> list[int]:
        text = "".join(json.dumps(m, ensure_ascii=False, sort_keys=True) + "\n" for m in messages)
        return [ord(c) for c in text]

    def prompt_ids(self, messages: Sequence[dict], tools: list[dict] | None = None) -> list[int]:
        return self._ids(messages)

    def continuation_ids(self, messages: Sequence[dict], new_messages: Sequence[dict],
                         tools: list[dict] | None = None, *, close_turn: bool = False) -> list[int]:
        tail = self._ids(new_messages)
        return list(self.turn_end_ids) + tail if close_turn else tail

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)


_HUGE = 1 << 40  # no token budget at the text level (the learner filters by its own lengths)


class _TeacherBackend:
    """``GenerationBackend`` for one rollout: asks the teacher for the next turn given the
    rollout's messages so far (read from the loop's own state)."""

    def __init__(self, teacher: Teacher, task: Task, schema: DatabaseSchema | None) -> None:
        self.teacher, self.task, self.schema = teacher, task, schema
        self.state: RolloutState | None = None
        self.texts: list[str] = []

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if self.state is None or len(prompts) != 1 or list(prompts[0]) != self.state.ids:
            raise RuntimeError("the teacher backend serves exactly its own rollout")
        text = self.teacher.next_turn(self.task, self.schema, copy.deepcopy(self.state.messages))
        if not isinstance(text, str):
            raise TypeError(f"the teacher returned {type(text).__name__}, not text")
        self.texts.append(text)
        body = text + TextChatFormat.end_of_turn
        ids = tuple(ord(c) for c in body)
        return [Generation(ids, (0.0,) * len(ids), body, "eos")]


def build_stage2(tasks: Iterable[Task], teacher: Teacher, out_path: str | Path, *,
                 catalog: Mapping[str, Mapping[str, str]] | None = None, judge: Judge | None = None,
                 schemas: Mapping[str, DatabaseSchema] | None = None, min_score: float = 1.0,
                 reward: str = "hybrid_agentic", sessions: SessionSource | None = None,
                 limits: Limits | None = None, max_turns: int = 8, parser: str = "hermes",
                 workers: int = 4, progress: bool = False, schema_style: str | None = None
                 ) -> tuple[list[dict[str, Any]], BuildReport]:
    """Multi-turn tool-use examples run on real sessions, verified; writes ``out_path`` (JSONL).
    ``sessions``: the ``SessionSource`` the trajectories run on (``LocalSessions()`` when None;
    ``PoolSessions(client)`` on a job's DB pool)."""
    tasks = _tasks(tasks)
    _check_common(min_score, workers)
    config = LoopConfig(max_turns=max_turns, max_total_tokens=_HUGE * 2, parser=parser, schema_style=schema_style,
                        mode="agentic", sampling=SamplingParams(max_new_tokens=_HUGE))
    judge = _judge(judge, catalog, tasks, limits)
    limits = limits or judge.limits
    sessions = sessions if sessions is not None else LocalSessions()
    schemas = schemas or {}
    tools = tools_for("agentic")
    fmt = TextChatFormat()

    def one(task: Task) -> tuple[Outcome, dict[str, Any] | None]:
        schema = schemas.get(task.db_id)
        url = judge.url(task.db_id, task.dialect)
        preprocess = tuple(getattr(task, "preprocess_sql", ()))
        backend = _TeacherBackend(teacher, task, schema)
        try:
            with open_one(sessions, SessionRequest(url, preprocess_sql=preprocess, limits=limits)) as session:
                loop = AgentLoop([task], [session], backend, fmt, config, schemas=[schema])
                backend.state = loop.states[0]
                traj = loop.run()[0]
        except Exception as exc:  # the session could not open (or close)
            return Outcome(task.task_id, task.kind, False, "session-error", _describe(exc),
                           tuple(backend.texts)), None
        texts = tuple(backend.texts)
        if traj.stop_reason == "error":
            error = traj.error or ""
            reason = "teacher-error" if error.startswith("generation failed") else (
                "prompt-error" if error.startswith("building the prompt") else "session-error")
            return Outcome(task.task_id, task.kind, False, reason, error, texts), None
        if traj.n_malformed:
            detail = next((t.error for t in traj.turns if t.call is None and t.error), "")
            return Outcome(task.task_id, task.kind, False, "malformed", detail or "", texts), None
        if traj.stop_reason != "submitted":
            return Outcome(task.task_id, task.kind, False, "no-submit",
                           f"stopped by {traj.stop_reason}", texts), None
        messages = json.loads(json.dumps(list(traj.messages), ensure_ascii=False))
        calls = [c["function"] for m in messages for c in m.get("tool_calls", ())]
        outcome = _graded(task, reward, calls, judge, min_score, texts)
        return outcome, ({"messages": messages, "tools": tools} if outcome.kept else None)

    return _write_sft("stage2", _run_all(one, tasks, workers, progress, "stage2"), out_path)


# -- stages 3 and 4: RL data (verl parquet + task JSONL) --------------------------------------------

def _reference_passes(task: Task, judge: Judge) -> tuple[bool, str, str]:
    """(ok, reason, detail): does the task's own reference pass its check?"""
    try:
        return kind_of(task).check_reference(judge, task)
    except Exception as exc:
        return False, "gold-error", _describe(exc)


def build_rl_data(tasks: Iterable[Task], out_dir: str | Path, name: str, *, mode: str,
                  schemas: Mapping[str, DatabaseSchema] | None = None, judge: Judge | None = None,
                  split: str = "train", data_source: str | None = None,
                  agent_name: str | None = None, workers: int = 4,
                  progress: bool = False, schema_style: str | None = None) -> tuple[list[Task], BuildReport]:
    """Write ``<out_dir>/<name>.parquet`` (verl) and ``<name>.jsonl`` (tasks); prompts are
    ``build_messages(task, schema, mode)``. With ``judge``, tasks whose reference fails are dropped."""
    tasks = _tasks(tasks)
    if mode not in ("single", "agentic"):
        raise ValueError(f"mode must be 'single' or 'agentic', got {mode!r}")
    if not name or "/" in name:
        raise ValueError(f"name must be a plain file stem, got {name!r}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    schemas = schemas or {}
    if judge is not None:
        _judge(judge, None, tasks, None)
        checks = _run_all(lambda t: _reference_passes(t, judge), tasks, workers, progress, name)
    else:
        checks = [(True, "ok", "")] * len(tasks)
    outcomes = [Outcome(t.task_id, t.kind, ok, reason, detail)
                for t, (ok, reason, detail) in zip(tasks, checks)]
    kept = [t for t, o in zip(tasks, outcomes) if o.kept]

    def prompt(task: Task) -> list[dict[str, str]]:
        return build_messages(task, schemas.get(task.db_id), mode=mode, style=schema_style)

    out = Path(out_dir)
    parquet, jsonl = out / f"{name}.parquet", out / f"{name}.jsonl"
    write_tasks(jsonl, kept)
    export_verl(kept, parquet, prompt_fn=prompt, split=split, data_source=data_source,
                agent_name=agent_name)
    _verify_round_trip(kept, parquet, jsonl, prompt)
    report = _report(name, outcomes, {"parquet": str(parquet), "tasks": str(jsonl)})
    return kept, _write_report(report, out / name)


def _verify_round_trip(tasks: Sequence[Task], parquet: Path, jsonl: Path,
                       prompt: Callable[[Task], list[dict[str, str]]]) -> None:
    import pyarrow.parquet as pq

    want = [t.to_dict() for t in tasks]
    if [t.to_dict() for t in load_verl(parquet).tasks] != want:
        raise RuntimeError(f"{parquet}: the tasks read back differ from the tasks written")
    if [t.to_dict() for t in read_tasks(jsonl)] != want:
        raise RuntimeError(f"{jsonl}: the tasks read back differ from the tasks written")
    prompts = pq.read_table(parquet, columns=["prompt"]).column("prompt").to_pylist()
    if prompts != [prompt(t) for t in tasks]:
        raise RuntimeError(f"{parquet}: the prompts read back differ from the prompts written")


def build_stage3(tasks: Iterable[Task], out_dir: str | Path, **kw: Any) -> tuple[list[Task], BuildReport]:
    """Single-turn RL data (``<thought>…</thought><solution>…</solution>`` responses)."""
    return build_rl_data(tasks, out_dir, kw.pop("name", "stage3"), mode="single", **kw)


def build_stage4(tasks: Iterable[Task], out_dir: str | Path, **kw: Any) -> tuple[list[Task], BuildReport]:
    """Agentic RL data; verl's ``agent_name`` defaults to sqlrl's agent loop (``sqlrl_agent``)."""
    from sqlrl.tasks.loaders.verl import AGENT_NAME

    kw.setdefault("agent_name", AGENT_NAME)
    return build_rl_data(tasks, out_dir, kw.pop("name", "stage4"), mode="agentic", **kw)
