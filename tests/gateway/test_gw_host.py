"""The gateway host (``actors/gateway.py``): in-process (``n=0``, no Ray) and as a Ray actor --
started from a spec on a scripted policy, its address in the run dir, tasks offered, a rollout
driven over HTTP, traces drained, weights pushed through the engine, gauges on Prometheus."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest

from actors.gateway import GatewayServer, load_gateway_spec
from tests.actors.conftest import _ray_instance, ray_session  # noqa: F401  (the one local Ray of the session)

from .conftest import GOLD, KEY, SCRIPT, shop_task


def spec(catalog, run_dir, **kw):
    return {"model": {"policy": {"model": "tiny", "backend": "scripted", "engine_options": {"script": SCRIPT}}},
            "catalog": catalog, "auth": {"api_keys": [KEY]}, "run_dir": str(run_dir),
            "gateway": {"deadline_s": 60}, **kw}


def rollout(client, url) -> dict:
    """One rollout through HTTP: claim, a chat call, SQL, complete."""
    h = {"Authorization": f"Bearer {KEY}"}
    claim = client.post(f"{url}/v1/rollouts", json={}, headers=h).json()
    chat = client.post(f"{claim['base_url']}/chat/completions", headers=h, json={
        "model": "m", "messages": [{"role": "user", "content": "How many customers are there?"}]})
    assert chat.status_code == 200, chat.text
    assert client.post(claim["session_url"], json={"sql": GOLD}, headers=h).json()["is_error"] is False
    done = client.post(claim["complete_url"], json={"sql": GOLD}, headers=h).json()
    assert done["status"] == "completed" and done["reward"] == 1.0
    return claim


def test_the_spec_is_strict(shop_catalog, tmp_path):
    with pytest.raises(ValueError, match="unknown"):
        load_gateway_spec({**spec(shop_catalog, tmp_path), "nonsense": 1})
    with pytest.raises(ValueError, match="no API keys"):
        GatewayServer({**spec(shop_catalog, tmp_path), "auth": {"api_keys": [], "api_keys_env": ""}})


def test_in_process_host(shop_catalog, tmp_path):
    server = GatewayServer(spec(shop_catalog, tmp_path))

    async def main():
        url = await server.start()
        assert json.loads((tmp_path / "gateway.json").read_text()) == {"url": url}
        await server.offer("g", shop_task().to_dict(), 1)
        with httpx.Client(timeout=60) as client:  # blocking HTTP in a thread; the server runs on this loop
            claim = await asyncio.to_thread(rollout, client, url)
        (trace,) = await server.drain()
        assert trace.rollout_id == claim["rollout_id"] and len(trace.calls) == 1 and trace.reward == 1.0
        assert await server.update_weights({"scripted.weight": np.zeros(1)}) == 1
        with pytest.raises(ValueError):
            await server.update_weights({"nope": np.zeros(1)})
        await server.offer("g", shop_task(), 1)
        async with httpx.AsyncClient(timeout=60) as client:
            await client.post(f"{url}/v1/rollouts", json={}, headers={"Authorization": f"Bearer {KEY}"})
        stats = await server.stats()
        assert stats.completed == 1 and stats.active == 1 and stats.calls == 1
        assert await server.stop() == 1  # the live rollout failed, its session released
        assert not server.app.state.close.alive  # the app's SQL pool is shut down with it
        (failed,) = await server.drain()
        assert failed.status == "failed"

    asyncio.run(main())


@pytest.mark.slow
def test_the_job_loop_runs_on_the_gateway_actor(ray_session, shop_catalog, tmp_path):  # noqa: F811
    """``run_steps`` with the gateway as a Ray actor (``ActorGateway``): offers, the step wait,
    drain and finish all go through the actor; clients on another thread drive the rollouts."""
    import threading

    from actors.gateway import ActorGateway, start_gateway
    from sqlrl.gateway.job import AgentJobConfig, run_steps

    handle, url = start_gateway(spec(shop_catalog, tmp_path), num_cpus=0.5)
    gateway = ActorGateway(handle)
    h, ends = {"Authorization": f"Bearer {KEY}"}, []

    def clients() -> None:  # claim until the job says it is done (410); 204: ask again
        with httpx.Client(timeout=60) as client:
            while True:
                got = client.post(f"{url}/v1/rollouts", json={}, headers=h)
                if got.status_code == 410:
                    return
                if got.status_code == 200:
                    c = got.json()
                    ends.append(client.post(c["complete_url"], json={"sql": GOLD}, headers=h).json()["status"])
                else:
                    threading.Event().wait(float(got.headers["Retry-After"]))  # the protocol's own pause

    worker = threading.Thread(target=clients)
    worker.start()
    try:
        cfg = AgentJobConfig(steps=2, tasks_per_step=1, group_size=2)
        rows = run_steps(cfg, [shop_task()], gateway, None, pad_id=0)  # equal rewards: the learner is never asked
        worker.join(timeout=300)
        assert not worker.is_alive() and ends == ["completed"] * 4
        assert [r["completed"] for r in rows] == [2, 2] and not any(r["updated"] for r in rows)
        assert gateway.stats().completed == 4
    finally:
        assert gateway.close() == 0


@pytest.mark.slow
def test_the_ray_actor_hosts_the_gateway(ray_session, shop_catalog, tmp_path):  # noqa: F811
    from actors.gateway import start_gateway

    handle, url = start_gateway(spec(shop_catalog, tmp_path, tick_s=0.5), num_cpus=0.5)
    try:
        assert json.loads((tmp_path / "gateway.json").read_text())["url"] == url
        ray_session.get(handle.offer.remote("g", shop_task(), 2))
        waiting = handle.wait_step.remote(None)  # the job's step wait, through the actor
        with httpx.Client(timeout=60) as client:
            rollout(client, url)
            assert ray_session.wait([waiting], timeout=0)[1] == [waiting]  # one rollout still waits
            h = {"Authorization": f"Bearer {KEY}"}
            other = client.post(f"{url}/v1/rollouts", json={}, headers=h).json()
            client.post(other["complete_url"], json={"sql": "SELECT 1"}, headers=h)
        assert ray_session.get(waiting) is True
        trace, second = sorted(ray_session.get(handle.drain.remote()), key=lambda t: len(t.calls), reverse=True)
        assert second.rollout_id == other["rollout_id"] and second.reward == 0.0
        assert trace.status == "completed" and len(trace.calls) == 1 and trace.calls[0].response_ids
        assert ray_session.get(handle.update_weights.remote({"scripted.weight": np.zeros(1)})) == 1
        port = ray_session.nodes()[0]["MetricsExportPort"]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the metrics agent exports every second
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            if "ray_sqlrl_gateway_calls{" in text and "ray_sqlrl_gateway_generated_tokens{" in text:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the gateway's gauges never reached the Prometheus endpoint")
    finally:
        ray_session.get(handle.stop.remote())
        ray_session.kill(handle)


def test_a_host_restarted_on_its_run_dir_resumes_its_journal(shop_catalog, tmp_path, capsys):
    """The first host is abandoned mid-step (as if killed); a second one on the same run dir hands
    the job the completed rollout and expires the one that was live."""
    first = GatewayServer(spec(shop_catalog, tmp_path))

    async def main():
        url = await first.start()
        await first.offer("g", shop_task(), 2)
        with httpx.Client(timeout=60) as client:
            done = await asyncio.to_thread(rollout, client, url)
            live = (await asyncio.to_thread(client.post, f"{url}/v1/rollouts", json={},
                                            headers={"Authorization": f"Bearer {KEY}"})).json()
        first._server.should_exit = True  # the server goes; its rollouts are never closed

        second = GatewayServer(spec(shop_catalog, tmp_path))
        assert await second.start() == url  # the port the journal names, once the first let it go
        assert "resumed from its journal: 1 ended rollout(s) kept for the job, 0 waiting again, 1 live" \
            in capsys.readouterr().out
        kept, lost = await second.drain()
        assert kept.rollout_id == done["rollout_id"] and kept.reward == 1.0 and len(kept.calls) == 1
        assert lost.rollout_id == live["rollout_id"] and lost.status == "expired"
        await second.stop()

    asyncio.run(main())


@pytest.mark.slow
def test_a_gateway_actor_restarted_by_ray_serves_on_the_same_url(ray_session, shop_catalog, tmp_path):  # noqa: F811
    """Kill the actor's process: Ray restarts it (``max_restarts``), it resumes its journal and serves
    on the same host:port by itself, so the URLs clients hold keep answering -- the completed rollout
    kept for the job, the live one a 409, the waiting offer claimable at the same base URL."""
    import os
    import signal
    import threading

    from ray.exceptions import RayActorError

    from actors.gateway import start_gateway

    handle, url = start_gateway(spec(shop_catalog, tmp_path), num_cpus=0.5, max_restarts=1)
    h = {"Authorization": f"Bearer {KEY}"}
    try:
        ray_session.get(handle.offer.remote("g", shop_task(), 3))
        with httpx.Client(timeout=60) as client:
            done = rollout(client, url)
            live = client.post(f"{url}/v1/rollouts", json={}, headers=h).json()
        first = ray_session.get(handle.process_id.remote())
        os.kill(first, signal.SIGKILL)
        deadline, again = time.monotonic() + 240, None
        while time.monotonic() < deadline:  # a poll of the actor's own state: the new incarnation's address
            try:
                if ray_session.get(handle.process_id.remote(), timeout=60) != first:
                    again = ray_session.get(handle.address.remote(), timeout=60)
                    if again is not None:
                        break
            except RayActorError:  # the call reached the dead incarnation, or the restart is under way
                pass
            threading.Event().wait(0.2)  # between polls of the actor's state
        assert again == url, f"the restarted gateway serves on {again}, not {url}"
        assert json.loads((tmp_path / "gateway.json").read_text())["url"] == url
        with httpx.Client(timeout=60) as client:
            closed = client.post(f"{live['base_url']}/chat/completions", headers=h, json={
                "model": "m", "messages": [{"role": "user", "content": "How many customers are there?"}]})
            assert closed.status_code == 409, closed.text  # the live rollout was lost with the process
            third = rollout(client, url)  # the offer still waiting: claimed, run and completed at the same URL
        ids = {t.rollout_id: t for t in ray_session.get(handle.drain.remote())}
        assert set(ids) == {done["rollout_id"], live["rollout_id"], third["rollout_id"]}
        assert ids[done["rollout_id"]].reward == 1.0 and ids[live["rollout_id"]].status == "expired"
    finally:
        ray_session.get(handle.stop.remote())
        ray_session.kill(handle)


def test_a_port_that_stays_taken_is_a_clear_error(shop_catalog, tmp_path):
    """A restarted gateway whose port another process holds waits ``rebind_wait_s``, then says so."""
    import socket

    from actors.gateway import GatewayBindError

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    server = GatewayServer(spec(shop_catalog, tmp_path, port=port, rebind_wait_s=0.2))

    async def main():
        try:
            with pytest.raises(GatewayBindError, match=f"127.0.0.1:{port} again.*still in use"):
                await server.start()
        finally:
            holder.close()
        assert await server.start() == f"http://127.0.0.1:{port}"  # free again: it serves there
        await server.stop()

    asyncio.run(main())
