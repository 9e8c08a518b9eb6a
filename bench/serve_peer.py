"""Benchmark sqlrl's serving against vLLM's own OpenAI server on the same checkpoint, same machine.

    python bench/serve.py peer [--model smollm2-135m | --model runs/main/stage4/final]
                               [--variants vllm-server,sqlrl-vllm,sqlrl-hf] [--rounds 4] [--quick]
    python bench/serve.py peer --variants vllm-server,ray-serve-llm   # Ray Serve LLM (issue 43)

Variants (all started before any timing; every one serves the same HF-format checkpoint folder --
``sqlrl.policy.load.resolve_path``: SmolLM2 is converted into one on first use -- greedy, the same
chat template from the folder's tokenizer):
- ``vllm-server``: ``python -m vllm.entrypoints.openai.api_server`` (vLLM's CPU build here), with
  the engine settings sqlrl's vLLM engine uses (float32, eager, prefix caching, chunked prefill
  off, ``--max-num-seqs 16``, ``--max-model-len 2048``, 1 GiB KV cache);
- ``sqlrl-vllm``: the sqlrl Serve app (``serve.app.build_app``, one model, ``backend: vllm``,
  ``max_batch_size`` 16) on a private local Ray;
- ``sqlrl-hf``: the same app with ``backend: hf`` (torch 1 thread);
- ``ray-serve-llm``: Ray's own LLM serving (``ray.serve.llm.build_openai_app`` with one
  ``LLMConfig``: vLLM's ``AsyncLLM`` inside an ``LLMServer`` replica behind Ray Serve LLM's OpenAI
  ingress) on the same local Ray, with the same engine settings, CPU placement (one ``{"CPU": 1}``
  bundle); its health floor is ``GET /v1/models`` (answered by its ingress from memory: it has no
  ``/health`` route).
Every vLLM engine gets the same environment (``engine_env``): ``VLLM_CPU_KVCACHE_SPACE`` = 1 GiB
and, on a machine of at most 4 cores, ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` -- what sqlrl's own engine
sets (``reserve_no_core_on_small_machines``; before, ``vllm-server`` reserved a core for its
scheduler and decoded on the other one while ``sqlrl-vllm`` decoded on both).
The private Ray starts its workers at this process's niceness (``RAY_worker_niceness``; Ray's
default is 15), so the engines inside Ray workers run at the vLLM server's priority.
Each vLLM variant is one more vLLM engine alive at once: on a small machine pass ``--variants``
with fewer of them (``parse_variants`` refuses unknown, repeated or no variants).

Measured per round, the variants interleaved (order reversed on odd rounds), each over loopback
HTTP with ``httpx``, ``max_tokens`` 64, a prompt that makes the model write past 64 tokens:
- **latency at 1 client** (closed loop, ``--requests`` requests): p50 / p95 ms;
- **generated tokens/s at 16 concurrent closed-loop clients** (``usage.completion_tokens`` / wall);
- **time to first streamed token** at 1 client (``stream: true``: the first chunk with content),
  and whether it came before the completion ended (every request);
- ``GET`` health latency p50 (``/healthz`` for sqlrl, ``/health`` for vLLM): the serving floor.
**Paired per-round ratios** against the baseline (``--baseline``, default ``vllm-server``; the same
round): tokens/s at 16 clients (target from issue 43: sqlrl >= 0.9x), p50 at 1 client (target
<= 1.2x). ``--baseline sqlrl-vllm --variants sqlrl-vllm,ray-serve-llm`` pairs the two Ray-hosted
vLLM variants directly (their engines both run in Ray workers, at Ray's worker niceness). Table + JSON
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
VARIANTS = ("vllm-server", "sqlrl-vllm", "sqlrl-hf", "ray-serve-llm")
RAY_VARIANTS = ("sqlrl-vllm", "sqlrl-hf", "ray-serve-llm")  # served by the private local Ray + Serve


def parse_variants(text: str) -> list[str]:
    """``--variants``: comma-separated names from ``VARIANTS``, in the given order (the rounds'
    order); ValueError for an unknown name, a repeated one, or none."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise ValueError("no variant given")
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a variant is repeated in {names}")
    return names


def check_baseline(baseline: str | None, variants: list[str]) -> str | None:
    """The variant the ratios are taken against: ``baseline`` if given (ValueError unless it is one
    of ``variants``), else ``vllm-server`` when it runs, else None (no ratios)."""
    if baseline is None:
        return "vllm-server" if "vllm-server" in variants else None
    if baseline not in variants:
        raise ValueError(f"--baseline {baseline} is not one of the variants {variants}")
    return baseline


def engine_env(cores: int | None = None) -> dict[str, str]:
    """The vLLM environment every vLLM variant's engine gets: the KV cache size, and no core reserved
    for the scheduler on a machine of at most ``SMALL_MACHINE_CORES`` cores (sqlrl's engine rule).
    A value already set in this process's environment wins."""
    from sqlrl.policy.vllm_engine import SMALL_MACHINE_CORES

    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    env = {"VLLM_CPU_KVCACHE_SPACE": str(KV_GB)}
    if cores <= SMALL_MACHINE_CORES:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    return {k: os.environ.get(k, v) for k, v in env.items()}


def ray_serve_llm_config(path: str, env: dict[str, str]) -> dict:
    """The ``LLMServingArgs`` for ``ray.serve.llm.build_openai_app``: one model ``m`` from the
    checkpoint folder, on CPU, with the engine settings of the other vLLM variants."""
    return {"llm_configs": [{
        "model_loading_config": {"model_id": "m", "model_source": path},
        "accelerator_config": {"kind": "cpu"},
        "engine_kwargs": {"dtype": "float32", "enforce_eager": True, "enable_prefix_caching": True,
                          "enable_chunked_prefill": False, "max_num_seqs": MAX_SEQS,
                          "max_model_len": MAX_MODEL_LEN},
        "runtime_env": {"env_vars": env},
        "deployment_config": {"num_replicas": 1, "max_ongoing_requests": 64},
    }]}


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
    env = {**os.environ, **engine_env()}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path, "--port", str(port),
           "--host", "127.0.0.1", "--served-model-name", "m", "--dtype", "float32", "--enforce-eager",
           "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_SEQS), "--enable-prefix-caching",
           "--no-enable-chunked-prefill"]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    wait_http(f"http://127.0.0.1:{port}/health", proc)
    return proc


def start_ray(port: int) -> None:
    """A private local Ray with Serve's HTTP proxy on ``port`` (loopback)."""
    import ray
    from ray import serve

    # Ray starts its workers at niceness 15; the vLLM server runs at this process's. Same priority
    # for every variant's engine on a machine shared with other work (RAY_worker_niceness overrides).
    os.environ.setdefault("RAY_worker_niceness", str(os.nice(0)))
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             _temp_dir=f"/tmp/sqlrl-bench-peer-{os.getpid()}")
    serve.start(http_options={"host": "127.0.0.1", "port": port})


def start_sqlrl(path: str, port: int, backends: list[str]) -> dict[str, str]:
    """The sqlrl app, one per backend, on the local Ray + Serve: {variant: base URL}."""
    from ray import serve

    from serve.app import build_app

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


def start_ray_serve_llm(path: str, port: int) -> str:
    """Ray Serve LLM's OpenAI app on the local Ray + Serve; its base URL once it answers."""
    from ray import serve
    from ray.serve.llm import build_openai_app

    serve.run(build_openai_app(ray_serve_llm_config(path, engine_env())), name="ray-serve-llm",
              route_prefix="/rsllm")
    base = f"http://127.0.0.1:{port}/rsllm"
    wait_http(f"{base}/v1/models", None)
    return base


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
    ap.add_argument("--variants", default="vllm-server,sqlrl-vllm,sqlrl-hf",
                    help=f"comma-separated, from {', '.join(VARIANTS)}")
    ap.add_argument("--baseline", default=None,
                    help="the variant the paired ratios are taken against (default: vllm-server when it runs)")
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
    try:
        variants = parse_variants(a.variants)
        baseline = check_baseline(a.baseline, variants)
    except ValueError as e:
        ap.error(str(e))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)  # Ray's log setup would print every request
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
        if any(v in RAY_VARIANTS for v in variants):
            start_ray(ray_port := free_port())
            sqlrl = [v.removeprefix("sqlrl-") for v in variants if v.startswith("sqlrl-")]
            if sqlrl:
                bases.update(start_sqlrl(path, ray_port, sqlrl))
            if "ray-serve-llm" in variants:
                bases["ray-serve-llm"] = start_ray_serve_llm(path, ray_port)
        health_path = {"vllm-server": "/health", "ray-serve-llm": "/v1/models"}
        health_urls = {v: b + health_path.get(v, "/healthz") for v, b in bases.items()}
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
        if any(v in RAY_VARIANTS for v in variants):
            from ray import serve

            serve.shutdown()
    keys = ("p50_ms_1", "p95_ms_1", "tokens_per_s_16", "ttft_p50_ms", "stream_total_p50_ms", "health_p50_ms")
    table = {v: {k: statistics.median(x[k] for x in runs if x["variant"] == v) for k in keys} for v in variants}
    paired: dict[str, Any] = {}
    if baseline is not None:
        peer = {x["round"]: x for x in runs if x["variant"] == baseline}
        for v in variants:
            if v == baseline:
                continue
            mine = [x for x in runs if x["variant"] == v]
            tps = [x["tokens_per_s_16"] / peer[x["round"]]["tokens_per_s_16"] for x in mine]
            p50 = [x["p50_ms_1"] / peer[x["round"]]["p50_ms_1"] for x in mine]
            ttft = [x["ttft_p50_ms"] / peer[x["round"]]["ttft_p50_ms"] for x in mine]
            paired[v] = {"tokens_per_s_16_ratio": {"median": statistics.median(tps), "rounds": tps, "target": ">= 0.9"},
                         "p50_1_client_ratio": {"median": statistics.median(p50), "rounds": p50, "target": "<= 1.2"},
                         "ttft_ratio": {"median": statistics.median(ttft), "rounds": ttft}}
    print("\n| variant | p50 ms (1 client) | p95 ms (1 client) | tok/s (16 clients) | first token ms | "
          "stream end ms | health p50 ms |\n|---|---:|---:|---:|---:|---:|---:|")
    for v, t in table.items():
        print(f"| {v} | {t['p50_ms_1']:.0f} | {t['p95_ms_1']:.0f} | {t['tokens_per_s_16']:.1f} | "
              f"{t['ttft_p50_ms']:.0f} | {t['stream_total_p50_ms']:.0f} | {t['health_p50_ms']:.1f} |")
    for v, p in paired.items():
        print(f"\n{v} / {baseline}, paired per round: tokens/s at 16 clients "
              f"{p['tokens_per_s_16_ratio']['median']:.2f}x {[round(x, 2) for x in p['tokens_per_s_16_ratio']['rounds']]}"
              f" (target >= 0.9); p50 at 1 client {p['p50_1_client_ratio']['median']:.2f}x "
              f"{[round(x, 2) for x in p['p50_1_client_ratio']['rounds']]} (target <= 1.2); first token "
              f"{p['ttft_ratio']['median']:.2f}x {[round(x, 2) for x in p['ttft_ratio']['rounds']]}")
    elapsed = time.perf_counter() - started
    timed = elapsed - startup
    scale = (full["rounds"] * (full["requests"] + full["per_client"] * 2 + full["streams"])) / (
        a.rounds * (a.requests + a.per_client * 2 + a.streams))
    estimate = startup + timed * scale
    print(f"\nmachine load (1/5/15 min): start {load_start}, end {os.getloadavg()}; start-up {startup:.0f} s, "
          f"timed part {timed:.0f} s; estimated full run (defaults {full}): ~{estimate / 60:.0f} min")
    out.write_text(json.dumps({"args": vars(a), "model": path, "baseline": baseline, "runs": runs, "table": table,
                               "paired": paired,
                               "load_start": load_start, "load_end": os.getloadavg(), "startup_s": startup,
                               "estimated_full_run_s": estimate, "quick": a.quick, "cpus": os.cpu_count()}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # kill <pid> unwinds: the vLLM engine core and sessions are closed
    raise SystemExit(main())
