"""``jobs.train_agent`` stopped mid-step and resumed (``resume=true``) ends as a run never stopped.

The whole job in this process (tiny model, the HF engine behind the real gateway, the in-process
learner and DB pool), checkpointing every step, with one in-process client (``examples.run_clients``'
loop with the plain-openai example agent, greedy, one call a rollout) so that the rollouts come out
the same in every run. Run A: 3 steps, never stopped. Run B: stopped in step 2 from the job's step
hook (``observe`` raises once step 2's rollouts have ended: they are lost with the job). Run C: B's
run dir with ``resume=true``: it restores step 1's checkpoint, starts a new gateway (its address in
``gateway.json``), gives its engine the restored weights as policy version 1 before any offer,
redoes step 2 and does step 3. Checked: C's final weights equal A's bitwise, its rows A's, its calls
carry A's policy versions, its mid-run checkpoints are gone once ``final/`` is saved.

The random-init tiny model earns reward 0 everywhere, so (as in tests/e2e/test_train_agent.py) each
step's first completed rollout of a group is given reward 1 (``run(rewards=...)``, test-only) and
every step updates.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the policy stack (torch) is not installed")

pytestmark = pytest.mark.slow  # three runs of the job

KEY = "k-train-agent-resume"


class Stopped(Exception):
    """Stands in for the kill (raised from the job's step hook, mid-step)."""


def first_rewarded(traces):
    firsts = {}
    for t in traces:
        if t.status == "completed":
            firsts.setdefault(t.group_id, t.rollout_id)
    return [dataclasses.replace(t, reward=1.0, reward_parts={"result": 1.0}) if firsts.get(t.group_id) == t.rollout_id
            else t for t in traces]


def run_job(cfg, stop_in=None):
    """``jobs.train_agent.run(cfg)`` on a thread, one client against its gateway; returns what it saw."""
    from examples.run_clients import client_loop
    from jobs.train_agent import run

    seen: dict = {"steps": [], "urls": []}
    out: dict = {}

    def observe(step, traces):
        seen["steps"].append((step, sorted({v for t in traces for c in t.calls for v in c.versions})))
        if step == stop_in:
            raise Stopped(step)

    def client(url):
        try:  # greedy, one call a rollout, no retries: the same calls in every run; ends when the job does
            out["client"] = client_loop(0, url, KEY, "openai", {"max_tokens": 4, "temperature": 0.0, "max_turns": 1,
                                                               "max_retries": 0}, connect_timeout_s=0.0)
        except Exception as exc:  # the job stopped under it (run B)
            out["client_error"] = exc

    clients: list[threading.Thread] = []

    def on_url(url):
        seen["urls"].append(url)
        clients.append(threading.Thread(target=client, args=(url,), name="agent-client"))
        clients[-1].start()

    try:
        out["summary"] = run(cfg, rewards=first_rewarded, observe=observe, on_url=on_url)
    except Stopped:
        out["stopped"] = True
    finally:
        for c in clients:
            c.join(timeout=300)
    return out, seen


def final_weights(summary):
    from safetensors.torch import load_file

    return load_file(str(Path(summary["checkpoint"]) / "model.safetensors"))


def rows(history):
    return [{k: v for k, v in r.items() if "time" not in k and not k.endswith("_per_s") and not k.startswith("gateway_")}
            for r in history]


def test_a_stopped_agent_job_resumes_to_the_weights_of_a_run_never_stopped():
    from sqlrl.gateway.job import AgentJobConfig, DataSpec
    from sqlrl.learn.config import GRPOConfig
    from sqlrl.learn.optim import OptimConfig
    from sqlrl.learn.resume import CheckpointSettings
    from sqlrl.policy.spec import PolicySpec

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="sqlrl-agent-resume-"))
    base = AgentJobConfig(run_dir=str(tmp / "a"), policy=PolicySpec("tiny", backend="hf"), max_batch_size=2,
                          steps=3, tasks_per_step=1, group_size=2, rollout_deadline_s=300.0, tick_s=0.5,
                          api_keys=(KEY,), loss=GRPOConfig(), optim=OptimConfig(lr=1e-3, micro_batch_size=2),
                          checkpoint=CheckpointSettings(every_steps=1),
                          data=DataSpec(synth_dir=str(tmp / "synth"), n_per_domain=12, size=3))
    try:
        a, seen_a = run_job(base)
        b, seen_b = run_job(dataclasses.replace(base, run_dir=str(tmp / "b")), stop_in=1)
        c, seen_c = run_job(dataclasses.replace(base, run_dir=str(tmp / "b"), resume=True))
    finally:
        torch.set_num_threads(threads)
    for run in (a, c):
        assert "summary" in run and "client_error" not in run, run
    assert b.get("stopped") and "summary" not in b
    # every step updated (versions 1, 2, 3); the calls of step k carry version k - 1
    assert [r["policy_version"] for r in a["summary"]["steps"]] == [1, 2, 3]
    assert seen_a["steps"] == [(0, [0]), (1, [1]), (2, [2])] and seen_b["steps"] == [(0, [0]), (1, [1])]
    # the resumed job: step 2 again (its rollouts were lost with B) at the restored version 1, then step 3
    assert seen_c["steps"] == [(1, [1]), (2, [2])]
    assert c["client"].completed == 4  # two steps of one task x 2 rollouts: step 1's tasks not offered again
    wa, wc = final_weights(a["summary"]), final_weights(c["summary"])
    assert wa.keys() == wc.keys() and all(torch.equal(wa[k], wc[k]) for k in wa)
    assert rows(c["summary"]["steps"]) == rows(a["summary"]["steps"])
    assert c["summary"]["db_active_leases"] == 0 and c["summary"]["failed_at_stop"] == 0
    # a new gateway: its address is the one gateway.json holds; the mid-run checkpoints went with final/
    run_dir = Path(c["summary"]["checkpoint"]).parent
    assert json.loads((run_dir / "gateway.json").read_text())["url"] == seen_c["urls"][-1]
    assert not (run_dir / "checkpoints").exists()
    logged = {json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()}
    assert logged == {0, 1, 2}  # step 2 logged again by C replaces nothing: B never logged it
