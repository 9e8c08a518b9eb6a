"""The training job survives a restart of its gateway actor (issue 44): the real job's combination --
the gateway as a Ray actor (``start_gateway(..., max_restarts)``), its rollout sessions leased from
the Ray DB pool (``PoolSessions``, as ``jobs.train_agent`` wires them), the driver's ``ActorGateway``
running ``run_steps`` -- and the actor's process SIGKILLed mid-step, while a client holds a live
rollout. Waits are on state (claims, the driver's step), never fixed sleeps."""

from __future__ import annotations

import os
import signal
import threading

import httpx
import numpy as np
import pytest

from tests.actors.conftest import _ray_instance, ray_session  # noqa: F401  (the one local Ray of the session)

from .conftest import GOLD, KEY, SCRIPT, shop_task


class Learner:
    """``StepLearner``: each step changes the weights (their value is the number of steps taken)."""

    def __init__(self) -> None:
        self.steps = 0

    def step(self, batch, loss, cfg) -> dict:
        self.steps += 1
        return {"loss": 0.0}

    def state_dict(self) -> dict:
        return {"scripted.weight": np.full(1, float(self.steps))}


def _leases(pool) -> int:
    return sum(s.active_leases for s in pool.stats().values() if s is not None)


@pytest.mark.slow
def test_the_job_goes_on_across_a_gateway_actor_restart(ray_session, shop_catalog, tmp_path):  # noqa: F811
    from actors.gateway import ActorGateway, start_gateway
    from curriculum.placement import load_profile
    from jobs.runtime import session_pool
    from sqlrl.db.source import PoolSessions
    from sqlrl.gateway.job import AgentJobConfig, run_steps
    from sqlrl.gateway.trace import LostReason

    pool = session_pool(shop_catalog, ["sqlite"], workers=1, reward=False, asks=load_profile("cpu"))
    spec = {"model": {"policy": {"model": "tiny", "backend": "scripted", "engine_options": {"script": SCRIPT}}},
            "catalog": shop_catalog, "auth": {"api_keys": [KEY]}, "run_dir": str(tmp_path),
            "gateway": {"deadline_s": 120}, "rebind_wait_s": 60}
    handle, url = start_gateway(spec, num_cpus=0.5, sessions=PoolSessions(pool.client(worker=0)), max_restarts=1)
    lines: list[str] = []
    gateway = ActorGateway(handle, max_restarts=1, restart_timeout_s=240, log=lines.append)
    h = {"Authorization": f"Bearer {KEY}"}
    state = {"killed": None, "lost_answer": None, "leases_at_kill": None, "error": None}
    completed: dict[str, int] = {}

    def post(client, where, body):  # the gateway may be restarting: its port refuses until it serves again
        delay = 0.05
        while True:
            try:
                return client.post(where, json=body, headers=h)
            except httpx.TransportError:
                threading.Event().wait(delay)  # between connection attempts while Ray restarts the actor
                delay = min(delay * 2, 1.0)

    def clients() -> None:
        """Claim until 410; per group the first rollout to complete answers the gold SQL, the others
        a wrong one (unequal rewards: every group trains). The first claim of step 2 is held live and
        the gateway's process killed under it."""
        try:
            with httpx.Client(timeout=120) as client:
                while True:
                    got = post(client, f"{url}/v1/rollouts", {})
                    if got.status_code == 410:
                        return
                    if got.status_code == 204:
                        threading.Event().wait(float(got.headers["Retry-After"]))  # the protocol's own pause
                        continue
                    assert got.status_code == 200, got.text
                    c = got.json()
                    chat = post(client, f"{c['base_url']}/chat/completions", {
                        "model": "m", "messages": [{"role": "user", "content": c["task"]["question"]}]})
                    if state["killed"] is None and c["task"]["task_id"] == "t2":
                        state["leases_at_kill"] = _leases(pool)
                        state["killed"] = ray_session.get(handle.process_id.remote())
                        os.kill(state["killed"], signal.SIGKILL)
                        state["lost_answer"] = post(client, c["complete_url"], {"sql": GOLD}).status_code
                        continue
                    assert chat.status_code == 200, chat.text
                    n = completed.get(c["task"]["task_id"], 0)
                    done = post(client, c["complete_url"], {"sql": GOLD if n == 0 else "SELECT 1"})
                    assert done.status_code == 200, done.text
                    completed[c["task"]["task_id"]] = n + 1
        except BaseException as exc:  # reported by the test thread
            state["error"] = exc

    tasks = [shop_task("t0"), shop_task("t1"), shop_task("t2")]
    seen: dict[int, list] = {}

    def observe(step, traces):
        seen[step] = traces
        if step == 2:
            state["leases_after_step"] = _leases(pool)  # before the gateway stops: the restart released them

    worker = threading.Thread(target=clients)
    worker.start()
    try:
        cfg = AgentJobConfig(steps=3, tasks_per_step=1, group_size=2, redraws=1)
        learner = Learner()
        rows = run_steps(cfg, tasks, gateway, learner, pad_id=0, observe=observe)
        worker.join(timeout=300)
        assert state["error"] is None, state["error"]
        assert not worker.is_alive()

        # the kill happened mid-step 2 with the rollout's lease held; the driver went on
        assert state["killed"] is not None and state["leases_at_kill"] >= 1
        assert gateway.restarts == 1 and gateway.lost == 1
        assert len(lines) == 1 and "restart 1 of 1" in lines[0] and "1 live rollout(s) lost" in lines[0] \
            and "policy version 2 restored" in lines[0], lines
        assert state["lost_answer"] == 409  # the live rollout went with the process: its client is told
        assert ray_session.get(handle.process_id.remote()) != state["killed"]
        # the lost rollout was redrawn (redraws: 1): its group completed with two members and trained
        assert [r["updated"] for r in rows] == [True, True, True]
        assert [r["policy_version"] for r in rows] == [1, 2, 3]
        assert rows[2]["redrawn"] == 1 and rows[2]["gateway_lost"] == 1 and rows[2]["completed"] == 2
        assert [t.status for t in seen[2]] == ["completed", "completed"]
        assert not any(t.lost is LostReason.GATEWAY_RESTART for t in seen[2])
        # the lost rollout's pool lease was released by the restarted gateway, before the job stops it
        assert state["leases_after_step"] == 0
        # step 2 was sampled on the restored weights, under their version (2), not the start weights (0)
        # nor the new engine's own count (1); the restored weights are the learner's after step 1
        assert {v for t in seen[2] for c in t.calls for v in c.versions} == {2}
        assert {v for t in seen[1] for c in t.calls for v in c.versions} == {1}
        assert gateway.version == 3 and ray_session.get(gateway._weights)["scripted.weight"].tolist() == [3.0]
    finally:
        worker.join(timeout=60)
        try:
            assert gateway.close() == 0
            assert _leases(pool) == 0
        finally:
            pool.shutdown()
