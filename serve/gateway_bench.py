"""Gateway overhead per call against a direct engine call, paired (issue 44's first measurement).

    python -m serve.gateway_bench --pairs 40 --tokens 16 [--client-process] [--json out.json]

The tiny HF model on ONE ``HFEngine``; the gateway app served by uvicorn on a loopback socket in a
thread. Each pair is one direct call (``ModelEngine.chat_plan`` + ``chat``: the same rendering and
generation the gateway does, without HTTP) and one call through the gateway (the official ``openai``
client, keep-alive, a claimed rollout), in alternating order, greedy with a fixed ``max_tokens``, so
both generate the same tokens. With ``--client-process`` the ``openai`` client runs in a child
process (as an agent does), timing its own call, so its work does not share the server's GIL; without
it the client runs in the server's process. Prints p50/p90 of each and of the per-pair difference
(what the gateway adds: HTTP, JSON, validation, capture) and the load average, and writes them as
JSON with ``--json``.

Where the added time goes (CPU time, which load inflates far less than wall time): per pair the
bench also reads the CPU the client spent on its call (the child's process time; in-process, the
calling thread's), the CPU of the gateway's event-loop thread during the call (uvicorn, FastAPI,
the handler, rendering, capture, JSON) and the CPU the direct call spent on its own thread
(rendering, submitting, reading the result: the work both paths share). ``server added`` is the
paired difference of the last two (what the gateway's side adds), ``client`` the client's own
work, and ``rest`` what is left of the added wall time: waiting (loopback, thread wake-ups, the
GIL, a loaded machine's run queue).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time


def _client_loop(conn, base_url: str, body: dict) -> None:
    """Child process: one ``openai`` client; each message on ``conn`` is one timed call (ms back)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="k", max_retries=0)
    while conn.recv() is not None:
        c0, t0 = time.process_time(), time.perf_counter()
        r = client.chat.completions.create(**body)
        ms, cpu_ms = (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000
        conn.send((ms if r.usage.completion_tokens >= 1 else -1.0, cpu_ms))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=40)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--client-process", action="store_true", help="run the openai client in a child process")
    p.add_argument("--json", default="", help="also write the results here")
    args = p.parse_args()
    load_before = os.getloadavg()

    import torch

    from serve.model_server import ModelServer
    from serve.openai_chat import ChatRequest
    from sqlrl.db.source import LocalSessions
    from sqlrl.gateway.rollouts import GatewayConfig, JudgeScorer, Rollouts
    from sqlrl.rewards import Judge
    from sqlrl.tasks.demo_db import build_demo_database
    from sqlrl.tasks.types import Text2SQLTask

    torch.set_num_threads(1)
    # the model as a serving replica builds it (the policy spec's load + engine, batch bound 4)
    server = ModelServer("policy", {"models": {"policy": {"policy": {"model": "tiny", "backend": "hf"},
                                                          "max_batch_size": 4}}})
    model, engine = server.model, server.engine
    db = build_demo_database(tempfile.mkdtemp() + "/shop.sqlite")
    catalog = {"shop": {"sqlite": f"sqlite:///{db}"}}
    rollouts = Rollouts(GatewayConfig(deadline_s=3600), LocalSessions(catalog), JudgeScorer(Judge(catalog)))
    rollouts.offer("bench", Text2SQLTask("b", "shop", "How many customers?", "SELECT 1"), 1)
    from openai import OpenAI

    from serve.gateway import build_gateway_app, serving

    app = build_gateway_app(rollouts, model, keys=frozenset({"k"}))
    body = {"model": "policy", "messages": [{"role": "user", "content": "How many customers are there?"}],
            "max_tokens": args.tokens, "temperature": 0.0}
    loop = asyncio.new_event_loop()
    direct_ms, gateway_ms = [], []
    cpu: dict[str, list[float]] = {"direct": [], "client": [], "server": []}  # ms per call (module docstring)
    with serving(app) as url:
        import httpx

        (gateway_thread,) = [t for t in threading.enumerate() if t.name == "sqlrl-gateway"]
        server_clock = time.pthread_getcpuclockid(gateway_thread.ident)

        claim = httpx.post(f"{url}/v1/rollouts", json={}, headers={"Authorization": "Bearer k"}).json()
        client = OpenAI(base_url=claim["base_url"], api_key="k", max_retries=0)
        child = None
        if args.client_process:
            conn, child_conn = mp.get_context("spawn").Pipe()
            child = mp.get_context("spawn").Process(target=_client_loop, args=(child_conn, claim["base_url"], body))
            child.start()

        def direct() -> float:
            c0, t0 = time.thread_time(), time.perf_counter()
            out = loop.run_until_complete(model.chat(model.chat_plan(ChatRequest.model_validate(body))))
            ms = (time.perf_counter() - t0) * 1000
            cpu["direct"].append((time.thread_time() - c0) * 1000)
            assert out["usage"]["completion_tokens"] >= 1
            return ms

        def through() -> float:
            s0 = time.clock_gettime(server_clock)
            if child is not None:
                conn.send(1)
                ms, client_cpu = conn.recv()
                assert ms >= 0, "the client process got no tokens"
            else:
                c0, t0 = time.thread_time(), time.perf_counter()
                r = client.chat.completions.create(**body)
                ms, client_cpu = (time.perf_counter() - t0) * 1000, (time.thread_time() - c0) * 1000
                assert r.usage.completion_tokens >= 1
            cpu["server"].append((time.clock_gettime(server_clock) - s0) * 1000)
            cpu["client"].append(client_cpu)
            return ms

        direct(), through()  # warm-up
        for xs in cpu.values():
            xs.clear()
        for i in range(args.pairs):
            if i % 2:
                gateway_ms.append(through()), direct_ms.append(direct())
            else:
                direct_ms.append(direct()), gateway_ms.append(through())
        if child is not None:
            conn.send(None)
            child.join(timeout=30)
    loop.run_until_complete(engine.close())
    diff = [g - d for g, d in zip(gateway_ms, direct_ms)]

    def q(xs: list[float], f: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(f * len(xs)))]

    where = "client in a child process" if child is not None else "client in the server's process"
    load = (load_before, os.getloadavg())
    print(f"pairs={args.pairs} tokens<={args.tokens} (tiny HF, greedy, {where}); "
          f"load average before {load[0][0]:.2f}, after {load[1][0]:.2f}")
    rows = {}
    for name, xs in (("direct", direct_ms), ("gateway", gateway_ms), ("added", diff)):
        rows[name] = {"p50_ms": statistics.median(xs), "p90_ms": q(xs, 0.9)}
        print(f"{name:8s} p50 {rows[name]['p50_ms']:7.2f} ms   p90 {rows[name]['p90_ms']:7.2f} ms")
    # CPU per call (module docstring): medians, and the paired server-added CPU
    cpu_rows = {name: statistics.median(xs) for name, xs in cpu.items()}
    cpu_rows["server_added"] = statistics.median([s - d for s, d in zip(cpu["server"], cpu["direct"])])
    cpu_rows["rest"] = rows["added"]["p50_ms"] - cpu_rows["client"] - cpu_rows["server_added"]
    print(f"CPU p50 ms per call: direct call's thread {cpu_rows['direct']:.2f}, gateway loop thread "
          f"{cpu_rows['server']:.2f} -> server added {cpu_rows['server_added']:.2f}; client "
          f"{cpu_rows['client']:.2f}; rest of the added p50 (waiting) {cpu_rows['rest']:.2f}")
    print(f"calls traced by the gateway: {rollouts.stats().calls} (pairs + the warm-up)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pairs": args.pairs, "tokens": args.tokens, "client_process": child is not None,
                       "load_1min": [load[0][0], load[1][0]], "calls_traced": rollouts.stats().calls,
                       "ms": rows, "cpu_p50_ms": cpu_rows, "direct_ms": direct_ms, "gateway_ms": gateway_ms,
                       "cpu_ms": cpu}, f, indent=1)


if __name__ == "__main__":
    main()
