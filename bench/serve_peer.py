"""Benchmark sqlrl's serving against vLLM's own OpenAI server on the same checkpoint, same machine.

    python bench/serve.py peer [--model smollm2-135m | --model runs/main/stage4/final]
                               [--variants vllm-server,sqlrl-vllm,sqlrl-hf] [--rounds 4] [--quick]

Variants (all started before any timing; every one serves the same HF-format checkpoint folder --
``sqlrl.policy.load.resolve_path``: SmolLM2 is converted into one on first use -- greedy, the same
chat template from the folder's tokenizer):
- ``vllm-server``: ``python -m vllm.entrypoints.openai.api_server`` (vLLM's CPU build here), with
  the engine settings sqlrl's vLLM engine uses (float32, eager, prefix caching, chunked prefill
  off, ``--max-num-seqs 16``, ``--max-model-len 2048``, 1 GiB KV cache);
- ``sqlrl-vllm``: the sqlrl Serve app (``serve.app.build_app``, one model, ``backend: vllm``,
  ``max_batch_size`` 16) on a private local Ray;
- ``sqlrl-hf``: the same app with ``backend: hf`` (torch 1 thread).
Two vLLM engines are alive at once with both vLLM variants: on a small machine pass ``--variants``
with one of them (this session ran one at a time).

Measured per round, the variants interleaved (order reversed on odd rounds), each over loopback
HTTP with ``httpx``, ``max_tokens`` 64, a prompt that makes the model write past 64 tokens:
- **latency at 1 client** (closed loop, ``--requests`` requests): p50 / p95 ms;
- **generated tokens/s at 16 concurrent closed-loop clients** (``usage.completion_tokens`` / wall);
- **time to first streamed token** at 1 client (``stream: true``: the first chunk with content),
  and whether it came before the completion ended (every request);
- ``GET`` health latency p50 (``/healthz`` for sqlrl, ``/health`` for vLLM): the serving floor.
**Paired per-round ratios** against ``vllm-server`` (the same round): tokens/s at 16 clients
(target from issue 43: sqlrl >= 0.9x), p50 at 1 client (target <= 1.2x). Table + JSON
(``bench/results/serve-peer-<timestamp>.json`` or ``--out``), machine load (``os.getloadavg``)
at start and end, and the estimated duration of the default full run from this run's timings.

``--quick``: 1 round, 6 requests at 1 client, 2 per client at 16 clients, 3 streamed -- a check that
everything runs, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm. Do not stop early."
MAX_MODEL_LEN, MAX_SEQS, KV_GB = 2048, 16, 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen | None, timeout: float = 900) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it answered {url}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)  # start-up polling (minutes), not a measurement
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def start_vllm_server(path: str, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_GB)}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path, "--port", str(port),
           "--host", "127.0.0.1", "--served-model-name", "m", "--dtype", "float32", "--enforce-eager",
           "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_SEQS), "--enable-prefix-caching",
           "--no-enable-chunked-prefill"]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    wait_http(f"http://127.0.0.1:{port}/health", proc)
    return proc


def start_sqlrl(path: str, port: int, backends: list[str]) -> dict[str, str]:
    """The sqlrl app, one per backend, on one local Ray + Serve: {variant: base URL}."""
    import ray
    from ray import serve

    from serve.app import build_app

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             _temp_dir=f"/tmp/sqlrl-bench-peer-{os.getpid()}")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    urls = {}
    for backend in backends:
        options = {"kv_cache_gb": KV_GB, "max_model_len": MAX_MODEL_LEN} if backend == "vllm" else {}
        config = {"models": {"m": {"policy": {"model": path, "backend": backend, "engine_options": options},
                                   "max_batch_size": MAX_SEQS, "max_ongoing_requests": 64,
                                   "max_queued_requests": 256, "num_cpus": 0.5, "torch_threads": 1}},
                  "limits": {"rate_limit_per_minute": 0, "max_tokens": 512, "request_timeout_s": 600},
                  "auth": {"required": False}}
        serve.run(build_app(config), name=f"sqlrl-{backend}", route_prefix=f"/{backend}")
        urls[f"sqlrl-{backend}"] = f"http://127.0.0.1:{port}/{backend}"
    return urls


def body(stream: bool = False) -> dict:
    return {"model": "m", "max_tokens": 64, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": PROMPT}]}


def closed_loop(base: str, clients: int, per_client: int) -> dict:
    """``clients`` threads, each sending ``per_client`` chat requests back to back."""
    import httpx

    def client(_: int) -> list[tuple[float, int]]:
        done = []
        with httpx.Client(timeout=600) as http:
            for _ in range(per_client):
                t0 = time.perf_counter()
                r = http.post(f"{base}/v1/chat/completions", json=body())
                r.raise_for_status()
                done.append(((time.perf_counter() - t0) * 1000, r.json()["usage"]["completion_tokens"]))
        return done

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        results = [x for per in ex.map(client, range(clients)) for x in per]
    wall = time.perf_counter() - t0
    ms = sorted(x[0] for x in results)
    tokens = sum(x[1] for x in results)
    p95 = statistics.quantiles(ms, n=20, method="inclusive")[-1] if len(ms) > 1 else ms[0]
    return {"p50_ms": statistics.median(ms), "p95_ms": p95, "tokens_per_s": tokens / wall,
            "tokens_per_request": tokens / len(ms)}


def first_token(base: str, n: int) -> dict:
    """Streamed requests one after another: time to the first content chunk, and to the end."""
    import httpx

    ttft, total, before_end = [], [], 0
    with httpx.Client(timeout=600) as http:
        for _ in range(n):
            t0, first = time.perf_counter(), None
            with http.stream("POST", f"{base}/v1/chat/completions", json=body(stream=True)) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if first is None and line.startswith("data: {"):
                        delta = json.loads(line[6:])["choices"]
                        if delta and delta[0].get("delta", {}).get("content"):
                            first = time.perf_counter()
            end = time.perf_counter()
            ttft.append(((first or end) - t0) * 1000)
            total.append((end - t0) * 1000)
            before_end += first is not None and first < end
    return {"ttft_p50_ms": statistics.median(ttft), "stream_total_p50_ms": statistics.median(total),
            "first_token_before_end": f"{before_end}/{n}"}


def health(url: str, n: int = 50) -> float:
    import httpx

    lat = []
    with httpx.Client(timeout=30) as http:
        for _ in range(n):
            t0 = time.perf_counter()
            http.get(url).raise_for_status()
            lat.append((time.perf_counter() - t0) * 1000)
    return statistics.median(lat)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a named model or an HF-format checkpoint folder")
    ap.add_argument("--variants", default="vllm-server,sqlrl-vllm,sqlrl-hf")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=24, help="requests at 1 client")
    ap.add_argument("--per-client", type=int, default=4, help="requests per client at 16 clients")
    ap.add_argument("--streams", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.requests, a.per_client, a.streams = 1, 6, 2, 3
    full = {"rounds": 4, "requests": 24, "per_client": 4, "streams": 10}
    variants = [v for v in a.variants.split(",") if v]
    if not set(variants) <= {"vllm-server", "sqlrl-vllm", "sqlrl-hf"}:
        ap.error(f"unknown variant in {variants}")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from sqlrl.policy.load import resolve_path

    path = str(resolve_path(a.model))
    load_start, started = os.getloadavg(), time.perf_counter()
    bases: dict[str, str] = {}
    proc = None
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / f"serve-peer-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if "vllm-server" in variants:
            port = free_port()
            proc = start_vllm_server(path, port, out.with_suffix(".vllm-server.log"))
            bases["vllm-server"] = f"http://127.0.0.1:{port}"
        sqlrl = [v.removeprefix("sqlrl-") for v in variants if v.startswith("sqlrl-")]
        if sqlrl:
            bases.update(start_sqlrl(path, free_port(), sqlrl))
        health_urls = {v: (f"{b}/health" if v == "vllm-server" else f"{b}/healthz")
                       for v, b in bases.items()}
        for base in bases.values():  # warm-up: first requests compile and fill caches
            closed_loop(base, 2, 1)
        startup = time.perf_counter() - started
        runs: list[dict] = []
        for r in range(a.rounds):
            for v in (variants if r % 2 == 0 else variants[::-1]):
                load0 = os.getloadavg()[0]
                one = closed_loop(bases[v], 1, a.requests)
                many = closed_loop(bases[v], 16, a.per_client)
                res = {"round": r, "variant": v, "p50_ms_1": one["p50_ms"], "p95_ms_1": one["p95_ms"],
                       "tokens_per_request": one["tokens_per_request"], "tokens_per_s_16": many["tokens_per_s"],
                       "p50_ms_16": many["p50_ms"], **first_token(bases[v], a.streams),
                       "health_p50_ms": health(health_urls[v]), "load_before": load0,
                       "load_after": os.getloadavg()[0]}
                runs.append(res)
                print(json.dumps({k: round(x, 1) if isinstance(x, float) else x for k, x in res.items()}), flush=True)
    finally:
        if proc is not None:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=120)
        if any(v.startswith("sqlrl-") for v in variants):
            from ray import serve

            serve.shutdown()
    keys = ("p50_ms_1", "p95_ms_1", "tokens_per_s_16", "ttft_p50_ms", "stream_total_p50_ms", "health_p50_ms")
    table = {v: {k: statistics.median(x[k] for x in runs if x["variant"] == v) for k in keys} for v in variants}
    paired: dict[str, Any] = {}
    if "vllm-server" in variants:
        peer = {x["round"]: x for x in runs if x["variant"] == "vllm-server"}
        for v in variants:
            if v == "vllm-server":
                continue
            mine = [x for x in runs if x["variant"] == v]
            tps = [x["tokens_per_s_16"] / peer[x["round"]]["tokens_per_s_16"] for x in mine]
            p50 = [x["p50_ms_1"] / peer[x["round"]]["p50_ms_1"] for x in mine]
            paired[v] = {"tokens_per_s_16_ratio": {"median": statistics.median(tps), "rounds": tps, "target": ">= 0.9"},
                         "p50_1_client_ratio": {"median": statistics.median(p50), "rounds": p50, "target": "<= 1.2"}}
    print("\n| variant | p50 ms (1 client) | p95 ms (1 client) | tok/s (16 clients) | first token ms | "
          "stream end ms | health p50 ms |\n|---|---:|---:|---:|---:|---:|---:|")
    for v, t in table.items():
        print(f"| {v} | {t['p50_ms_1']:.0f} | {t['p95_ms_1']:.0f} | {t['tokens_per_s_16']:.1f} | "
              f"{t['ttft_p50_ms']:.0f} | {t['stream_total_p50_ms']:.0f} | {t['health_p50_ms']:.1f} |")
    for v, p in paired.items():
        print(f"\n{v} / vllm-server, paired per round: tokens/s at 16 clients "
              f"{p['tokens_per_s_16_ratio']['median']:.2f}x {[round(x, 2) for x in p['tokens_per_s_16_ratio']['rounds']]}"
              f" (target >= 0.9); p50 at 1 client {p['p50_1_client_ratio']['median']:.2f}x "
              f"{[round(x, 2) for x in p['p50_1_client_ratio']['rounds']]} (target <= 1.2)")
    elapsed = time.perf_counter() - started
    timed = elapsed - startup
    scale = (full["rounds"] * (full["requests"] + full["per_client"] * 2 + full["streams"])) / (
        a.rounds * (a.requests + a.per_client * 2 + a.streams))
    estimate = startup + timed * scale
    print(f"\nmachine load (1/5/15 min): start {load_start}, end {os.getloadavg()}; start-up {startup:.0f} s, "
          f"timed part {timed:.0f} s; estimated full run (defaults {full}): ~{estimate / 60:.0f} min")
    out.write_text(json.dumps({"args": vars(a), "model": path, "runs": runs, "table": table, "paired": paired,
                               "load_start": load_start, "load_end": os.getloadavg(), "startup_s": startup,
                               "estimated_full_run_s": estimate, "quick": a.quick, "cpus": os.cpu_count()}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
