"""The sampled held-out evaluation (``eval.samples``): k rollouts a task at a temperature,
success = the mean per-task solve rate (avg@k) with a bootstrap interval over tasks, pass@k, the
paired comparison on per-task rates; the stage evaluates greedy first, then sampled in the modes
``eval.sampled_modes`` names; the main job's table gives the sampled mode columns of its own."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS
import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

import jobs.held_out as held_out
import jobs.main as job_main
from curriculum.config import EvalConfig, load_stage_config
from sqlrl.eval.stats import mean_interval, paired_difference


@dataclass(frozen=True)
class Task:
    task_id: str
    kind: str
    difficulty: str = "simple"
    db_id: str = "shop"


@dataclass
class Breakdown:
    parts: dict
    excluded: bool = False


class SampledRuntime:
    """Fakes the rollouts: task ``t`` is solved by its first ``wins[t]`` samples (in order); the
    samples listed in ``broken`` (task id, sample index) are excluded. Records each group's args."""

    def __init__(self, wins: dict[str, int], broken: set[tuple[str, int]] = frozenset(), *, samples: int = 4,
                 modes: tuple[str, ...] = ()) -> None:
        self.cfg = SimpleNamespace(rollout=SimpleNamespace(batch=5), data=SimpleNamespace(seed=7),
                                   eval=EvalConfig(samples=samples, sample_temperature=0.7, sample_modes=modes))
        self.wins, self.broken, self.groups, self.released = wins, broken, [], 0

    def rollout_group(self, model, mode, temperature, **kw):
        self.groups.append({"mode": mode, "temperature": temperature, **kw})
        return SimpleNamespace(rollout=lambda tasks: [SimpleNamespace(turns=[1], stop_reason="submit") for _ in tasks])

    def release(self, group):
        self.released += 1

    def score(self, trajs, tasks, reward):
        seen: dict[str, int] = {}
        out = []
        for t in tasks:
            i = seen[t.task_id] = seen.get(t.task_id, -1) + 1
            out.append(Breakdown({"result": float(i < self.wins.get(t.task_id, 0)), "format": 1.0},
                                 (t.task_id, i) in self.broken))
        return out


TASKS = [Task(f"t{i}", "text2sql" if i % 2 else "critic") for i in range(6)]


def test_a_sampled_evaluation_reports_mean_solve_rate_pass_at_k_and_per_task_rates():
    rt = SampledRuntime({"t0": 4, "t1": 2, "t2": 1}, broken={("t1", 3), ("t5", 0), ("t5", 1), ("t5", 2), ("t5", 3)})
    ev = held_out.evaluate_sampled(rt, "m", TASKS, "single", 4, 0.7)
    assert isinstance(ev, held_out.Evaluation) and ev.sampling["samples"] == 4 and ev.per_task["t1"].samples == 3
    out = ev.to_dict()
    assert json.loads(json.dumps(out)) == out
    assert out["mode"] == "single@4" and out["rollout_mode"] == "single" and out["samples"] == 4
    assert rt.groups == [{"mode": "single", "temperature": 0.7, "seed": 7}] and rt.released == 1
    assert out["rollouts"] == 24 and out["n"] == 6 and out["scored"] == 5  # t5: every sample excluded
    rates = {t: v["success"] for t, v in out["per_task"].items()}
    assert rates == {"t0": 1.0, "t1": pytest.approx(2 / 3), "t2": 0.25, "t3": 0.0, "t4": 0.0, "t5": None}
    assert out["per_task"]["t1"]["samples"] == 3
    assert out["success"] == pytest.approx((1 + 2 / 3 + 0.25) / 5)
    assert out["pass_at_k"] == pytest.approx(3 / 5) and out["successes"] == 4 + 2 + 1
    assert out["success_critic"] == pytest.approx((1 + 0.25 + 0) / 3)
    lo, hi = out["success_ci95"]
    assert lo <= out["success"] <= hi and 0 <= lo < hi <= 1
    assert json.loads(json.dumps(out)) == out  # summary.json-ready
    for k, temp in ((1, 0.7), (4, 0.0)):
        with pytest.raises(ValueError, match="k >= 2 and temperature > 0"):
            held_out.evaluate_sampled(rt, "m", TASKS, "single", k, temp)


def test_two_sampled_evaluations_compare_on_per_task_rates():
    before = held_out.evaluate_sampled(SampledRuntime({"t0": 1, "t1": 2}), "a", TASKS, "single", 4, 0.7)
    after = held_out.evaluate_sampled(SampledRuntime({"t0": 3, "t1": 2, "t2": 4, "t3": 1}), "b", TASKS, "single", 4, 0.7)
    d = held_out.compare(before, after)
    assert d["fractional"] and d["n"] == 6 and d["gained"] == 3 and d["lost"] == 0
    assert d["diff"] == pytest.approx((0.5 + 1.0 + 0.25) / 6) and d["ci95"][0] > 0
    back = held_out.compare(after, before)
    assert back["diff"] == pytest.approx(-d["diff"]) and back["lost"] == 3 and back["ci95"][1] < 0
    greedy = held_out.compare({"per_task": {"t0": {"success": 0}}}, {"per_task": {"t0": {"success": 1}}})
    assert not greedy["fractional"]


def test_a_stage_evaluates_greedy_then_sampled_in_the_named_modes():
    calls = []
    rt = SampledRuntime({}, samples=4, modes=("single",))
    orig = held_out.evaluate
    try:
        held_out.evaluate = lambda rt, model, tasks, mode: calls.append(mode) or NS(mode=mode)
        out = held_out.evaluations(rt, "m", TASKS, ("single", "agentic"))
    finally:
        held_out.evaluate = orig
    assert calls == ["single", "agentic"] and [e.mode for e in out] == ["single", "agentic", "single@4"]
    rt.cfg.eval = EvalConfig()  # off by default: greedy only
    held_out.evaluate = lambda rt, model, tasks, mode: NS(mode=mode)
    try:
        assert [e.mode for e in held_out.evaluations(rt, "m", TASKS, ("single",))] == ["single"]
    finally:
        held_out.evaluate = orig


def test_the_eval_config_refuses_one_sample_and_a_zero_temperature():
    assert EvalConfig().sampled_modes(["single"]) == []
    assert EvalConfig(samples=8).sampled_modes(["single", "agentic"]) == ["single", "agentic"]
    assert EvalConfig(samples=8, sample_modes=("single",)).sampled_modes(["agentic"]) == []
    with pytest.raises(ValueError, match="eval.samples must be 0"):
        EvalConfig(samples=1)
    with pytest.raises(ValueError, match="eval.samples must be 0"):
        EvalConfig(samples=-2)
    with pytest.raises(ValueError, match="sample_temperature must be > 0"):
        EvalConfig(samples=4, sample_temperature=0.0)
    cfg = load_stage_config(None, ["stage=stage3", "eval.samples=8", "eval.sample_modes=[single]"])
    assert cfg.eval.samples == 8 and cfg.eval.sample_modes == ("single",)


def test_fractional_paired_differences_and_the_mean_interval():
    binary_b, binary_a = {"a": 0, "b": 1, "c": 1, "d": 0}, {"a": 1, "b": 1, "c": 0, "d": 1}
    x, y = paired_difference(binary_b, binary_a), paired_difference(binary_b, binary_a, fractional=True)
    assert (x.diff, x.gained, x.lost, x.n) == (y.diff, y.gained, y.lost, y.n) and not x.fractional and y.fractional
    d = paired_difference({"a": 0.25, "b": 0.5, "c": None}, {"a": 0.75, "b": 0.5, "c": 1.0, "e": 0.0}, fractional=True)
    assert d.n == 2 and d.diff == pytest.approx(0.25) and d.gained == 1 and d.lost == 0
    assert d.unscored == ("c",) and d.only_after == ("e",) and d.ci95[0] <= d.diff <= d.ci95[1]
    assert paired_difference({"a": 0.5}, {"a": 0.5}, fractional=True).ci95 == (0.0, 0.0)
    again = paired_difference(dict(reversed(list({"a": 0.25, "b": 0.5}.items()))), {"a": 0.75, "b": 0.5},
                              fractional=True)
    assert again.ci95 == paired_difference({"a": 0.25, "b": 0.5}, {"a": 0.75, "b": 0.5}, fractional=True).ci95
    for bad in (1.5, -0.1, math.nan, "0.5"):
        with pytest.raises(ValueError, match="task 'a': a rate must be"):
            paired_difference({"a": bad}, {"a": 0.5}, fractional=True)
    with pytest.raises(ValueError, match="an outcome must be 0, 1"):
        paired_difference({"a": 0.5}, {"a": 0.5})  # not fractional: rates are refused
    values = [0.0, 0.25, 1.0, 0.5, None]
    lo, hi = mean_interval(values)
    assert lo <= 0.4375 <= hi and mean_interval(values) == (lo, hi) and mean_interval([]) == (0.0, 1.0)
    assert mean_interval([0.5, 0.5]) == (0.5, 0.5)
    with pytest.raises(ValueError):
        mean_interval([2.0])


def test_the_main_table_gives_a_sampled_mode_its_columns_with_pass_at_k():
    rt = SampledRuntime({"t0": 2}, samples=4)
    s1 = held_out.evaluate_sampled(rt, "s1", TASKS, "single", 4, 0.7).to_dict()
    s3 = held_out.evaluate_sampled(SampledRuntime({"t0": 4, "t1": 1}), "s3", TASKS, "single", 4, 0.7).to_dict()
    rows = [{"name": "base", "variant": "", "eval": {}, "seconds": 1.0},
            {"name": "+ stage1", "variant": "", "eval": {"single@4": s1}, "seconds": 2.0},
            {"name": "+ stage3", "variant": "", "eval": {"single@4": s3}, "seconds": 3.0}]
    job_main.add_changes(rows, ["single@4"])
    assert "single@4" not in rows[1]["change"] and rows[2]["change"]["single@4"]["vs"] == "+ stage1"
    _, md = job_main.results_table(rows, ["single@4"], "generated")
    assert "single@4 success" in md and "pass@4 0.33" in md and "single@4 +0.12" in md
    assert "k samples a task" in job_main.table_title("generated", True)
    assert job_main.table_title("generated") == "Success on held-out tasks: generated (greedy; format = well-formed answers)"
