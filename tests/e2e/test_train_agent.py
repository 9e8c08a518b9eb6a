"""``jobs.train_agent`` end to end on the tiny model: the job (in this process, on a thread) serves the
gateway; one client process claims a rollout, makes a call and is killed; then TWO client processes
of the LangGraph example (``examples/run_clients.py``, unchanged) drain 2 GRPO steps x 2 embedded
tasks x 2 rollouts. Checked: the killed client's rollout expired and its step still completed; every
traced call's ids are what the engine sampled (re-scored by the learner's forward pass at the
weights they were sampled with, log-probs equal within tolerance); prompts and observations masked;
the policy version each call records; the weights changed; every DB lease released; and then
(issue 44 item 5) the job's checkpoint, served as is by the serving app, answers the same agent.

The random-init tiny model earns no reward (the Judge gives every rollout 0.0, so no group has a
signal). As in tests/gateway/test_seq_e2e.py, step 1's traces are handed to the learner with the
first completed rollout of each group given reward 1 (``run(rewards=...)``, a test-only hook); step
2 keeps the Judge's zeros, so it trains nothing and the final checkpoint holds exactly the weights
step 2's calls were sampled with (version 1) -- which lets those calls be re-scored too.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

pytest.importorskip("langgraph", reason="the agents extra (langgraph, langchain-openai) is not installed")
torch = pytest.importorskip("torch", reason="the policy stack (torch) is not installed")

pytestmark = pytest.mark.slow  # a training job, three client processes, a Ray Serve app

KEY = "k-train-agent"
DEADLINE_S = 40.0  # the killed client's rollout expires this long after its claim (the gateway's own clock)

KILLED_CLIENT = r"""
import sys, time, httpx
url, key = sys.argv[1], sys.argv[2]
h = {"Authorization": f"Bearer {key}"}
while True:
    r = httpx.post(url + "/v1/rollouts", json={}, headers=h, timeout=60)
    if r.status_code == 200:
        break
    time.sleep(float(r.headers.get("retry-after", "1")))  # 204: the protocol's wait
c = r.json()
q = httpx.post(c["base_url"] + "/chat/completions", headers=h, timeout=300, json={
    "model": "policy", "max_tokens": 4, "messages": [{"role": "user", "content": c["task"]["question"]}]})
q.raise_for_status()
print(c["rollout_id"], flush=True)
sys.stdin.read()  # mid-rollout until killed
"""


def first_rewarded(traces):
    """Step 1 (test-only): the first completed rollout of each group gets reward 1; later steps unchanged."""
    firsts = {}
    for t in traces:
        if t.status == "completed":
            firsts.setdefault(t.group_id, t.rollout_id)
    return [dataclasses.replace(t, reward=1.0, reward_parts={"result": 1.0}) if firsts.get(t.group_id) == t.rollout_id
            else t for t in traces]


@pytest.fixture(scope="module")
def trained():
    from examples.run_clients import run_clients
    from jobs.train_agent import run
    from sqlrl.gateway.job import AgentJobConfig, DataSpec
    from sqlrl.learn.config import GRPOConfig
    from sqlrl.learn.optim import OptimConfig
    from sqlrl.policy.spec import PolicySpec

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="sqlrl-train-agent-"))
    cfg = AgentJobConfig(run_dir=str(tmp / "run"), policy=PolicySpec("tiny", backend="hf"), max_batch_size=4,
                         steps=2, tasks_per_step=2, group_size=2, rollout_deadline_s=DEADLINE_S, tick_s=0.5,
                         api_keys=(KEY,), loss=GRPOConfig(), optim=OptimConfig(lr=1e-3, micro_batch_size=2),
                         data=DataSpec(synth_dir=str(tmp / "synth"), n_per_domain=12, size=4))
    steps: list[list] = []

    def rewards(traces):
        steps.append(list(traces))
        return first_rewarded(traces) if len(steps) == 1 else traces

    url_ready, out = threading.Event(), {}

    def job():
        try:
            out["summary"] = run(cfg, rewards=rewards, on_url=lambda u: (out.update(url=u), url_ready.set()))
        except BaseException as exc:  # surfaced by the test
            out["error"] = exc
        finally:
            url_ready.set()

    thread = threading.Thread(target=job, name="train-agent-job")
    thread.start()
    killed = codes = None
    try:
        url_ready.wait()
        assert "error" not in out, out.get("error")
        # a client that dies mid-rollout: it claims, makes one call, and is killed
        proc = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, out["url"], KEY], stdout=subprocess.PIPE,
                                stdin=subprocess.PIPE, text=True)
        killed = proc.stdout.readline().strip()
        proc.kill()
        proc.wait()
        codes = run_clients(out["url"], KEY, "langgraph", 2, {"max_turns": 2, "max_tokens": 12, "temperature": 1.0})
    finally:
        thread.join()
        torch.set_num_threads(threads)
    if "error" in out:
        raise out["error"]
    yield {"cfg": cfg, "summary": out["summary"], "steps": steps, "killed": killed, "codes": codes,
           "catalog_db": next((tmp / "synth" / "databases").glob("*/*.sqlite"))}


def test_the_job_trains_two_steps_from_two_langgraph_clients_and_survives_a_killed_one(trained):
    s, steps = trained["summary"], trained["steps"]
    assert trained["codes"] == [0, 0] and trained["killed"]
    assert len(s["steps"]) == 2 and len(steps) == 2
    one, two = s["steps"]
    # the killed client's rollout expired at its deadline; step 1 completed without it and trained
    assert (one["rollouts"], one["expired"], one["completed"]) == (4, 1, 3)
    assert [t.status for t in steps[0] if t.rollout_id == trained["killed"]] == ["expired"]
    assert one["updated"] and one["groups_trained"] >= 1 and one["policy_version"] == 1
    assert (two["rollouts"], two["completed"], two["expired"]) == (4, 4, 0)
    assert not two["updated"] and two["groups_signal"] == 0  # the Judge's zeros: no signal, no update
    assert all(t.reward == 0.0 for t in steps[1])  # the random-init model solves nothing (see module doc)
    # every rollout ended, every session and lease released
    assert two["gateway_active"] == 0 and two["gateway_in_flight"] == 0 and two["gateway_waiting"] == 0
    assert s["db_active_leases"] == 0 and s["failed_at_stop"] == 0
    # the metrics went to the run dir like the stage jobs' (existing + gateway columns)
    lines = (Path(trained["cfg"].run_dir) / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"gateway_calls"' in lines[0] and '"learner_loss"' in lines[0]
    assert (Path(trained["cfg"].run_dir) / "gateway.json").is_file()
    # calls carry the LangGraph roles' tags and the policy version they were sampled with
    for k, traces in enumerate(steps):
        calls = [c for t in traces for c in t.calls if t.rollout_id != trained["killed"]]
        assert calls and {c.tag for c in calls} <= {"write", "check", "rewrite"}
        assert {v for c in calls for v in c.versions} == {k}


def _rescored(model, traces, pad_id, turn_end_ids):
    """Every traced sequence (no group filter) re-scored by the learner's forward pass."""
    from sqlrl.gateway.sequences import SequenceConfig
    from sqlrl.gateway.train import TraceTrainConfig, build_step
    from sqlrl.learn.config import GRPOConfig
    from sqlrl.learn.losses import forward_logprobs

    cfg = TraceTrainConfig(SequenceConfig(turn_end_ids=tuple(turn_end_ids), unfinished="zero"), min_group_size=1,
                           drop_equal_groups=False)
    build = build_step(traces, cfg, GRPOConfig(), pad_id=pad_id)
    with torch.no_grad():
        logprobs, _ = forward_logprobs(model.eval(), build.batch)
    return build, logprobs


def test_traced_ids_are_what_the_engine_sampled_and_the_weights_changed(trained):
    from sqlrl.agent.chat_format import HFChatFormat
    from sqlrl.policy.load import load_policy

    initial = load_policy("tiny")
    final = load_policy(trained["summary"]["checkpoint"])
    turn_end = HFChatFormat(initial.tokenizer).turn_end_ids
    # step k's calls were sampled at version k: the initial weights, then the checkpoint's (step 2 made no update)
    for policy, traces in ((initial, trained["steps"][0]), (final, trained["steps"][1])):
        build, logprobs = _rescored(policy.model, traces, initial.pad_token_id, turn_end)
        batch = build.batch
        trained_pos = batch.loss_mask.bool()
        assert torch.allclose(logprobs[trained_pos], batch.old_logprobs[trained_pos], atol=2e-3)
        by_call = {(c.rollout_id, c.index): c for t in traces for c in t.calls}
        for row, i in enumerate(build.kept):
            seq = build.rows.sequences[i]
            calls = [by_call[(seq.rollout_id, j)] for j in seq.call_indices]
            assert seq.token_ids == calls[-1].prompt_ids + calls[-1].response_ids  # nothing re-tokenised
            mask = batch.loss_mask[row, :len(seq.token_ids)]
            # trained positions are exactly the calls' sampled ids; prompts and observations are masked
            assert int(mask.sum()) == sum(len(c.response_ids) for c in calls)
            assert not mask[:len(calls[0].prompt_ids)].any()
            last = calls[-1]
            assert mask[len(last.prompt_ids):].all()
    before, after = initial.model.state_dict(), final.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the update reached the checkpoint


def test_the_checkpoint_is_served_as_is_and_the_same_agent_runs_on_it(trained):
    """Issue 44 item 5: serve/'s app on ``<run_dir>/final`` (no conversion), the LangGraph agent unchanged."""
    import ray
    from ray import serve

    from examples.langgraph_sql_agent.agent import run_agent
    from examples.sql_exec import SQLiteExecutor, load_task
    from serve.app import build_app

    from tests.examples.fake_gateway import free_port

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    agent = {"policy": {"model": trained["summary"]["checkpoint"], "backend": "hf"}, "max_batch_size": 2}
    args = {"models": {"agent": agent},
            "databases": {}, "colocate": True, "sql_models": {"debug": "agent", "generate": "agent"},
            "limits": {"max_tokens": 32, "default_max_tokens": 16}, "auth": {"api_keys": [KEY]}}
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             namespace="sqlrl-train-agent-tests", _temp_dir=f"/tmp/sqlrl-ta-{os.getpid()}")
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(args, (2.0, 0.0)), name="agent", route_prefix="/")
        execute = SQLiteExecutor(trained["catalog_db"])
        task = load_task({"question": "How many customers are there?"}, execute)
        out = run_agent(f"http://127.0.0.1:{port}/v1", KEY, task, execute, model="agent", max_tokens=16,
                        temperature=0.0)
        assert isinstance(out["query"], str) and 1 <= out["calls"] <= 6
    finally:
        serve.shutdown()
        ray.shutdown()
