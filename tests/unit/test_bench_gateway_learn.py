"""bench/gateway_learn.py's report helpers on hand-made traces (no engine, no agent): where follow-up
calls leave the call they share most with, the outcome per task, and ``--from-run`` rebuilding the
report from gateway journals (and refusing, with the counts, when a phase has no ended rollout)."""

from __future__ import annotations

import json

import pytest

from bench.gateway_learn import (_agent_args, _data, divergences, earlier_before, journal_traces, main, outcomes,
                                 parse_args, train_config)
from sqlrl.gateway.journal import JOURNAL_FILE
from sqlrl.gateway.trace import RolloutTrace, TracedCall

END = 9  # the turn-end id of these hand-made prompts


def call(rid: str, i: int, tag: str, prompt: tuple[int, ...], response: tuple[int, ...]) -> TracedCall:
    n = len(response)
    return TracedCall(rollout_id=rid, index=i, tag=tag, prompt_ids=prompt, response_ids=response,
                      logprobs=(-0.5,) * n, versions=(0,) * n, finish_reason="eos")


def trace(rid: str, task: str, calls: list[tuple[str, tuple[int, ...], tuple[int, ...]]], solved: bool,
          status: str = "completed") -> RolloutTrace:
    done = status == "completed"
    return RolloutTrace(rollout_id=rid, task_id=task, group_id=f"g/{task}",
                        calls=tuple(call(rid, i, *c) for i, c in enumerate(calls)), status=status,
                        reward=(1.0 if solved else 0.0) if done else None, reward_source="judge" if done else "none",
                        reward_parts={"result": 1.0 if solved else 0.0} if done else {})


def test_divergences_name_the_message_and_the_calls_that_extend():
    write = (1, 2, END, 3, END)
    t = trace("r", "t", [
        ("write", write, (5, 6)),
        ("check", (1, 7, END, 3, 5, 6, END), (8,)),  # another system prompt; holds the write's reply ids
        ("check", (1, 7, END, 3, 5, 6, END), (11, 12)),  # the same prompt again: leaves at the response
        ("rewrite", (1, 2, END, 13, END), (14,)),  # the write's system prompt, another user message
        ("write", write + (5, 6, END, 4, END), (7,)),  # the write's prompt + reply + a new turn: extends
    ], solved=True)
    d = divergences([t], (END,))
    assert d["where"] == {"write > check @ message 0": 1, "check > check @ message 2": 1,
                          "write > rewrite @ message 1": 1, "write > write extends it": 1}
    assert d["earlier_reply_in_prompt"] == 3  # calls 1, 2 and 4 hold the write's reply (5, 6)
    assert divergences([trace("s", "t", [("write", write, (5,))], solved=False)], (END,)) == {
        "where": {}, "earlier_reply_in_prompt": 0}  # one call: nothing follows


def test_outcomes_count_only_completed_solved_rollouts():
    ts = [trace("a", "t1", [("write", (1,), (2,))], solved=True),
          trace("b", "t2", [("write", (1,), (2,))], solved=False),
          trace("c", "t3", [], solved=False, status="expired")]
    assert outcomes(ts) == {"t1": 1, "t2": 0, "t3": 0}


def _journal(run_dir, traces):
    run_dir.mkdir(parents=True)
    lines = [{"kind": "serve", "port": 1}] + [{"kind": "end", "trace": t.to_dict(), "key": "k"} for t in traces]
    (run_dir / JOURNAL_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_from_run_rebuilds_the_report_from_the_journals(tmp_path, capsys):
    w = (1, 2, END, 3, END)
    _journal(tmp_path / "eval_before", [trace("b1", "t1", [("write", w, (5,))], solved=True),
                                        trace("b2", "t2", [("write", w, (5,))], solved=False),
                                        trace("b3", "t3", [("write", w, (5,))], solved=False)])
    _journal(tmp_path / "eval_after", [trace("a1", "t1", [("write", w, (5,))], solved=True),
                                       trace("a2", "t2", [("write", w, (5,))], solved=True)])  # t3 never ended
    assert [t.rollout_id for t in journal_traces(tmp_path / "eval_before")] == ["b1", "b2", "b3"]
    assert journal_traces(tmp_path / "train") == []
    assert main(["--from-run", "--quick", "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["from_run"] and rep["rollouts_ended"] == {"eval_before": 3, "train": 0, "eval_after": 2}
    assert (rep["before"]["successes"], rep["before"]["n"]) == (1, 3)
    assert (rep["after"]["successes"], rep["after"]["n"]) == (2, 2)
    assert rep["paired"]["n"] == 2 and rep["paired"]["gained"] == 1 and rep["paired"]["lost"] == 0
    assert rep["exactness"]["calls_captured"] == 5 and rep["exactness"]["merged"] == 0
    assert "change (paired)" in capsys.readouterr().out


def test_from_run_without_an_after_phase_says_what_it_found(tmp_path):
    _journal(tmp_path / "eval_before", [trace("b1", "t1", [("write", (1, END), (5,))], solved=True)])
    with pytest.raises(SystemExit, match="eval_before: 1, train: 0, eval_after: 0"):
        main(["--from-run", "--quick", "--out", str(tmp_path)])
    assert not (tmp_path / "report.json").exists()


def test_the_agent_temperature_greedy_evaluation_and_training_as_given(tmp_path):
    a = parse_args(["--quick", "--out", str(tmp_path)])
    assert a.eval_temperature == 0.0 and a.train_temperature is None and a.reward == "hybrid_agentic"
    assert _agent_args(a, a.eval_temperature) == ["--max-tokens", "32", "--max-turns", "1", "--timeout-s", "300.0",
                                                 "--temperature", "0.0"]
    assert "--temperature" not in _agent_args(a, a.train_temperature)  # none sent: the server's default
    b = parse_args(["--quick", "--train-temperature", "0.7", "--eval-temperature", "0.5"])
    assert _agent_args(b, b.train_temperature)[-2:] == ["--temperature", "0.7"]
    assert _agent_args(b, b.eval_temperature)[-2:] == ["--temperature", "0.5"]


def test_the_training_reward_and_lr_reach_the_job_config(tmp_path):
    a = parse_args(["--quick", "--reward", "hybrid_agentic_shaped", "--lr", "2e-5", "--out", str(tmp_path)])
    cfg = train_config(a, "key")
    assert cfg.reward == "hybrid_agentic_shaped" and cfg.gateway_config().reward == "hybrid_agentic_shaped"
    assert cfg.optim.lr == 2e-5 and cfg.data.split == "train" and cfg.run_dir == str(tmp_path / "train")
    assert train_config(parse_args(["--quick"]), "key").reward == "hybrid_agentic"  # the default


@pytest.mark.parametrize("bad", [["--reward", "no_such_reward"], ["--eval-temperature", "-1"],
                                 ["--train-temperature", "-0.5"], ["--call-timeout-s", "0"]])
def test_bad_reward_or_temperature_refused_before_anything_runs(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as exc:
        main(["--quick", "--out", str(tmp_path / "out"), *bad])
    assert exc.value.code == 2 and bad[0] in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before the "before" phase made its folder


def test_before_from_reads_an_earlier_runs_evaluation_of_the_same_model(tmp_path):
    from jobs.train_agent import load_tasks

    data = tmp_path / "data"
    a = parse_args(["--quick", "--model", "run1/train/final", "--data-dir", str(data), "--out", str(tmp_path / "run2"),
                    "--before-from", str(tmp_path / "run1" / "eval_after")])
    ids = [t.task_id for t in load_tasks(_data(a, "test", a.eval_tasks))[0]]
    assert len(ids) == 8
    w = (1, 2, END, 3, END)
    _journal(tmp_path / "run1" / "eval_after", [trace(f"r{i}", tid, [("write", w, (5,))], solved=i < 3)
                                                for i, tid in enumerate(ids)])
    report = {"model": "start", "checkpoint": "run1/train/final", "max_tokens": 32, "max_turns": 1,
              "eval_temperature": 0.0}
    (tmp_path / "run1" / "report.json").write_text(json.dumps(report))
    seen: list = []
    got = earlier_before(a, seen)
    assert got == {tid: int(i < 3) for i, tid in enumerate(ids)} and len(seen) == 8

    def refused(match, **change):
        b = parse_args(["--quick", "--model", "run1/train/final", "--data-dir", str(data),
                        "--before-from", str(tmp_path / "run1" / "eval_after")])
        for k, v in change.items():
            setattr(b, k, v)
        with pytest.raises(SystemExit, match=match):
            earlier_before(b, [])

    refused("scored 'run1/train/final', not --model 'start'", model="start")
    refused("max_tokens 32 \\(here 64\\)", max_tokens=64)
    refused("eval_temperature 0.0 \\(here 0.7\\)", eval_temperature=0.7)
    refused("not the eval_before / eval_after folder", before_from=tmp_path / "run1")
    _journal(tmp_path / "run3" / "eval_before", [trace("x", ids[0], [("write", w, (5,))], solved=True)])
    (tmp_path / "run3" / "report.json").write_text(json.dumps({**report, "model": "run1/train/final"}))
    refused("has 1 of this run's 8 held-out tasks", before_from=tmp_path / "run3" / "eval_before")
