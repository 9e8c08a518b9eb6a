"""Benchmark serving: direct in-process generation vs sqlrl's Ray Serve app, closed-loop load.

    python bench/serve.py [--clients 1,8,16,32] [--rounds 3] [--max-tokens 64] [--out FILE]
    python bench/serve.py peer [...]   # against vLLM's own OpenAI server and Ray Serve LLM
                                      # (bench/serve_peer.py, --help)

Three variants of the same chat completion (the tiny model, greedy, ``max_tokens`` tokens, the
prompt rendered with the tool chat template) are interleaved in every round:

- ``direct``: ``serve.engine.ModelEngine.chat`` called in this process on the HF engine
  (HFEngine: continuous batching across the clients), no HTTP, no Ray;
- ``serve``: the Serve app (``serve.app:build_app``) over loopback HTTP (``max_batch_size`` 16:
  the engine's running batch);
- ``serve-colo``: the same app with ``colocate: true`` (the model inside the ingress replica: one
  Ray hop less per request);
- ``serve-1``: the same app with ``max_batch_size`` 1 -- one sequence at a time in the engine.

Each variant runs with C concurrent closed-loop clients (a client sends its next request when
the previous one is answered) for ``--requests`` requests per client. Reported per variant and C:
latency p50/p99, requests/s, generated tokens/s. The targets are read as **paired per-round
ratios** (both sides measured in the same round, back to back; the median over rounds):
Serve's overhead at 1 client = p50(serve) - p50(direct) (target <= 10 ms; also for serve-colo), and the batching
speed-up at 16 clients = tokens/s(serve) / tokens/s(serve-1) (target >= 3x; also vs direct).
Torch uses one thread in the replicas and here. The app runs on a private local Ray. Not a
test: the numbers depend on the machine and its load; docs/serving.md quotes one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = ("direct", "serve", "serve-colo", "serve-1")


def body(i: int, max_tokens: int) -> dict:
    return {"model": "tiny", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": f"How many customers placed order {i}?"}]}


def closed_loop(call, clients: int, per_client: int) -> dict:
    """``clients`` threads, each sending ``per_client`` requests back to back."""
    lat: list[float] = []
    tokens = [0]
    lock = threading.Lock()

    def client(c: int) -> None:
        for k in range(per_client):
            t0 = time.perf_counter()
            n = call(c * per_client + k)
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt * 1000.0)
                tokens[0] += n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        list(ex.map(client, range(clients)))
    wall = time.perf_counter() - t0
    lat.sort()
    return {"p50_ms": statistics.median(lat), "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "req_per_s": len(lat) / wall, "tokens_per_s": tokens[0] / wall, "requests": len(lat)}


def direct_caller(max_tokens: int):
    import asyncio

    import torch

    from serve.config import load_serve_config
    from serve.engine import ModelEngine
    from serve.openai_chat import ChatRequest
    from sqlrl.policy.backends import make_engine
    from sqlrl.policy.load import load_policy

    torch.set_num_threads(1)
    policy = load_policy("tiny")
    engine = make_engine("hf", policy)  # HFEngine: every client's request joins the running batch
    config = load_serve_config({"models": {"tiny": {"policy": {"model": "tiny", "backend": "hf"}}}})
    model = ModelEngine("tiny", policy, engine, config)

    def call(i: int) -> int:  # from each client thread: its own event loop, one engine for all
        plan = model.chat_plan(ChatRequest.model_validate(body(i, max_tokens)))
        return asyncio.run(model.chat(plan))["usage"]["completion_tokens"]
    return call


def start_serve(port: int) -> None:
    import ray
    from ray import serve

    from serve.app import build_app

    def app(batch: int, colocate: bool = False) -> dict:
        return {"models": {"tiny": {"policy": {"model": "tiny", "backend": "hf"}, "max_batch_size": batch,
                                    "max_ongoing_requests": 64,
                                    "max_queued_requests": 256, "num_cpus": 0.5, "torch_threads": 1}},
                "limits": {"rate_limit_per_minute": 0, "max_tokens": 512},
                "auth": {"required": False}, "colocate": colocate}

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             _temp_dir=f"/tmp/sqlrl-bench-serve-{os.getpid()}")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(app(16)), name="batched", route_prefix="/b")
    serve.run(build_app(app(1)), name="single", route_prefix="/s")
    serve.run(build_app(app(16, colocate=True)), name="colocated", route_prefix="/c")


def http_caller(port: int, prefix: str, max_tokens: int):
    import httpx

    local = threading.local()

    def call(i: int) -> int:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=300)
        r = local.client.post(f"http://127.0.0.1:{port}{prefix}/v1/chat/completions", json=body(i, max_tokens))
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]
    return call


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="1,8,16,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=0, help="per client (default: 24 at 1 client, else 4)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve.json"))
    a = ap.parse_args(argv)
    clients = [int(c) for c in a.clients.split(",") if c]
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    port = a.port
    if not port:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    start_serve(port)
    calls = {"direct": direct_caller(a.max_tokens), "serve": http_caller(port, "/b", a.max_tokens),
             "serve-colo": http_caller(port, "/c", a.max_tokens), "serve-1": http_caller(port, "/s", a.max_tokens)}
    for call in calls.values():  # warm-up: models loaded, first batches compiled
        for i in range(3):
            call(i)
    runs: list[dict] = []
    for r in range(a.rounds):
        for c in clients:
            per = a.requests or (24 if c == 1 else 4)
            order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))  # alternate who goes first
            for v in order:
                res = closed_loop(calls[v], c, per)
                runs.append({"round": r, "clients": c, "variant": v, **res})
                print(f"round {r} clients {c:>2} {v:<8} p50 {res['p50_ms']:8.1f} ms  "
                      f"{res['tokens_per_s']:8.1f} tok/s", flush=True)

    def get(r: int, c: int, v: str) -> dict:
        return next(x for x in runs if x["round"] == r and x["clients"] == c and x["variant"] == v)

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    table = []
    for c in clients:
        for v in VARIANTS:
            rs = [get(r, c, v) for r in range(a.rounds)]
            table.append({"clients": c, "variant": v, **{k: med([x[k] for x in rs]) for k in
                                                         ("p50_ms", "p99_ms", "req_per_s", "tokens_per_s")}})
    paired: dict[str, dict] = {}
    if 1 in clients:
        for v in ("serve", "serve-colo"):
            d = [get(r, 1, v)["p50_ms"] - get(r, 1, "direct")["p50_ms"] for r in range(a.rounds)]
            paired[f"{v}_overhead_ms_at_1_client"] = {"per_round": d, "median": med(d), "target": "<= 10"}
    for c in clients:
        if c == 1:
            continue
        b = [get(r, c, "serve")["tokens_per_s"] / get(r, c, "serve-1")["tokens_per_s"] for r in range(a.rounds)]
        d = [get(r, c, "serve")["tokens_per_s"] / get(r, c, "direct")["tokens_per_s"] for r in range(a.rounds)]
        paired[f"batching_speedup_vs_serve1_at_{c}"] = {"per_round": b, "median": med(b),
                                                         **({"target": ">= 3"} if c == 16 else {})}
        paired[f"batching_speedup_vs_direct_at_{c}"] = {"per_round": d, "median": med(d)}
        b = [get(r, c, "serve-colo")["tokens_per_s"] / get(r, c, "serve-1")["tokens_per_s"] for r in range(a.rounds)]
        paired[f"colocated_speedup_vs_serve1_at_{c}"] = {"per_round": b, "median": med(b)}

    print(f"\n{'clients':>7} {'variant':<8} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>8} {'tok/s':>9}   "
          f"(medians over {a.rounds} rounds)")
    for row in table:
        print(f"{row['clients']:>7} {row['variant']:<8} {row['p50_ms']:9.1f} {row['p99_ms']:9.1f} "
              f"{row['req_per_s']:8.1f} {row['tokens_per_s']:9.1f}")
    print("\npaired per-round ratios (median; per round):")
    for name, p in paired.items():
        print(f"  {name}: {p['median']:.2f}  {[round(x, 2) for x in p['per_round']]}"
              + (f"  target {p['target']}" if "target" in p else ""))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": runs, "table": table, "paired": paired, "cpus": os.cpu_count(),
                               "load_avg": os.getloadavg(), "max_tokens": a.max_tokens}, indent=2))
    print(f"wrote {out}")
    from ray import serve

    serve.shutdown()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["peer"]:
        from serve_peer import main as peer_main

        sys.exit(peer_main(sys.argv[2:]))
    sys.exit(main())
