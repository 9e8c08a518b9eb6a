"""What the gateway's own app costs per chat call, without sockets, client or model (issue 44).

    python -m serve.gateway_app_cost [--calls 300] [--rounds 12] [--live 1] [--json out.json]

``serve.gateway_bench`` times whole calls through HTTP, which on a shared machine mostly measures
the machine. This drives the gateway's ASGI app (``build_gateway_app``: routing, middleware, key,
rate limit, expiry check, JSON, validation, tag, rendering, capture, the response) in-process on one
event loop, with an engine that answers at once (a canned 16-token ``Generation`` after one loop
hop), and compares it with the direct path's share of the same work (``ModelEngine.chat_plan`` +
``chat``: rendering and the result). Per call it reports the calling thread's CPU time (min and
median over ``--rounds`` rounds of ``--calls`` calls: the min is the least disturbed by other
processes) and the number of Python function calls (``cProfile``'s count: exact, the same on any
machine, whatever its load). ``--live N`` claims N rollouts first (the per-request expiry check
looks at them). What it leaves out: uvicorn's HTTP parsing and socket writes, the client, and the
waits between processes -- ``serve.gateway_bench`` measures those with the whole call.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import json
import os
import pstats
import statistics
import tempfile
import time
from typing import Any, Awaitable, Callable

BODY = {"model": "policy", "messages": [{"role": "user", "content": "How many customers are there?"}],
        "max_tokens": 16, "temperature": 0.0}


class InstantEngine:
    """An ``AsyncEngine``'s ``generate`` that answers ``generation`` after one loop hop."""

    policy_version = 0

    def __init__(self, generation: Any) -> None:
        self.generation = generation

    async def generate(self, prompt_ids: Any, sampling: Any, *, request_id: str | None = None) -> Any:
        await asyncio.sleep(0)
        return self.generation


def asgi_call(app: Any, path: str, raw: bytes) -> Callable[[], Awaitable[None]]:
    """One POST of ``raw`` to ``path`` through the ASGI app, with the headers the ``openai`` client
    sends; asserts a 200."""
    headers = [(b"host", b"127.0.0.1"), (b"accept", b"application/json"), (b"content-type", b"application/json"),
               (b"user-agent", b"OpenAI/Python"), (b"authorization", b"Bearer k"),
               (b"content-length", str(len(raw)).encode())]

    async def call() -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": headers, "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5555), "state": {}}
        requests = [{"type": "http.request", "body": raw, "more_body": False}]
        answered, sent = asyncio.Event(), []

        async def receive() -> dict:
            if requests:
                return requests.pop()
            await answered.wait()  # the connection stays open until the answer went out
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                answered.set()

        await app(scope, receive, send)
        assert sent[0]["status"] == 200, sent
    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--live", type=int, default=1, help="rollouts claimed (and live) during the calls")
    p.add_argument("--json", default="")
    args = p.parse_args()

    from serve.gateway import build_gateway_app
    from serve.model_server import ModelServer
    from serve.openai_chat import ChatRequest
    from sqlrl.db.source import LocalSessions
    from sqlrl.gateway.rollouts import GatewayConfig, JudgeScorer, Rollouts
    from sqlrl.policy.types import Generation
    from sqlrl.rewards import Judge
    from sqlrl.tasks.demo_db import build_demo_database
    from sqlrl.tasks.types import Text2SQLTask

    server = ModelServer("policy", {"models": {"policy": {"policy": {"model": "tiny", "backend": "hf"},
                                                          "max_batch_size": 4}}})
    model = server.model
    ids = tuple(model.policy.tokenizer.encode("There are 60 customers in the shop table.",
                                              add_special_tokens=False))[:16]
    model.engine = InstantEngine(Generation(ids, (-0.5,) * len(ids), model.policy.tokenizer.decode(list(ids)),
                                            "length", versions=(0,) * len(ids)))
    db = build_demo_database(tempfile.mkdtemp() + "/shop.sqlite")
    catalog = {"shop": {"sqlite": f"sqlite:///{db}"}}
    rollouts = Rollouts(GatewayConfig(deadline_s=3600), LocalSessions(catalog), JudgeScorer(Judge(catalog)))
    rollouts.offer("cost", Text2SQLTask("c", "shop", "How many customers?", "SELECT 1"), args.live)
    rid = [rollouts.claim("k").rollout_id for _ in range(args.live)][0]
    limits = dataclasses.replace(model.limits, rate_limit_per_minute=1e9, rate_limit_burst=10**9)  # measured, not limited
    app = build_gateway_app(rollouts, model, keys=frozenset({"k"}), limits=limits)
    through = asgi_call(app, f"/rollouts/{rid}/v1/chat/completions", json.dumps(BODY).encode())

    async def direct() -> None:
        out = await model.chat(model.chat_plan(ChatRequest.model_validate(BODY)))
        assert out["usage"]["completion_tokens"] >= 1

    async def cpu_ms(fn: Callable[[], Awaitable[None]], n: int) -> float:
        for _ in range(20):
            await fn()
        c0 = time.thread_time()
        for _ in range(n):
            await fn()
        return (time.thread_time() - c0) / n * 1000

    def python_calls(fn: Callable[[], Awaitable[None]], n: int = 100) -> float:
        prof = cProfile.Profile()
        prof.enable()
        loop.run_until_complete(cpu_ms(fn, n))
        prof.disable()
        return pstats.Stats(prof).total_calls / (n + 20)  # type: ignore[attr-defined]

    loop = asyncio.new_event_loop()
    cpu: dict[str, list[float]] = {"app": [], "direct": []}
    for _ in range(args.rounds):  # alternating, so both see the same machine
        cpu["app"].append(loop.run_until_complete(cpu_ms(through, args.calls)))
        cpu["direct"].append(loop.run_until_complete(cpu_ms(direct, args.calls)))
    calls = {"app": python_calls(through), "direct": python_calls(direct)}
    rollouts.close()
    out = {"live": args.live, "load_1min": os.getloadavg()[0],
           "cpu_ms_min": {k: min(v) for k, v in cpu.items()},
           "cpu_ms_median": {k: statistics.median(v) for k, v in cpu.items()},
           "python_calls": calls, "cpu_ms": cpu}
    print(f"live rollouts {args.live}, load average {out['load_1min']:.2f}")
    for what in ("cpu_ms_min", "cpu_ms_median", "python_calls"):
        a, d = out[what]["app"], out[what]["direct"]
        print(f"{what:14s} app {a:9.3f}   direct {d:9.3f}   the app adds {a - d:9.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
