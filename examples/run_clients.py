"""Start K agent client processes against a training gateway: claim a task, run the agent, complete.

    python -m examples.run_clients --gateway http://127.0.0.1:8100 --api-key KEY --agent langgraph -k 4

Each process loops until the gateway says the job is done:

1. ``POST {gateway}/v1/rollouts {"kinds": [...]}`` claims a rollout of the task kinds the agent
   handles (its module's ``KINDS``; ``--kinds`` narrows them, ``--kinds any`` declares none):
   ``200`` with ``rollout_id``, ``base_url`` (the rollout's own OpenAI base URL), ``task``,
   ``session_url``, ``complete_url``; ``204`` when no task of those kinds waits now (the process
   waits ``Retry-After`` seconds and asks again); ``410`` when the job is done (the process exits
   0); ``409`` when the job hands out none of those kinds (``ClaimRefused``: the process says so
   and exits 2).
2. Runs the agent, unchanged, with that ``base_url`` and the task; its SQL goes to ``session_url``
   (``examples/sql_exec.py``).
3. ``POST complete_url {"sql": <the agent's final query>}``; the gateway's Judge computes the reward
   on a fresh session (a client cannot send one). ``409`` means the rollout expired first: counted.
   ``404`` means the gateway does not know the rollout: the job was restarted (``resume=true``) and
   its new gateway redoes the step; counted as ``lost``, and the client claims again.

An agent that raises (a bug, a gateway error mid-rollout) does not complete its rollout: the failure
is printed and counted, and the gateway expires the rollout at its deadline (an infrastructure
failure is not scored as the policy's). Task kinds: both agents handle text-to-SQL and debugging
(``critic``) tasks; a task of a kind the agent does not handle anyway (none declared, or a gateway
that does not read the declaration; ``examples/task_kinds.py``: ``UnsupportedTask``, raised before
any model call) is refused the same way -- printed, counted ``refused``, left to expire. The gateway not answering yet is retried for
``--connect-timeout-s`` seconds, so clients may start before the job -- and, with the job's
``port`` fixed, go on across a restart of the job that takes less than that. Each process prints one JSON
line with its counts when it ends; the runner exits non-zero if any process failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `examples` importable from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

AGENTS = {  # name -> "module:function" with run_agent's signature (base_url, api_key, task, execute, **options)
    "langgraph": "examples.langgraph_sql_agent.agent:run_agent",
    "openai": "examples.openai_client_agent.agent:run_agent",
}


class ClaimRefused(RuntimeError):
    """The gateway refused the claim itself (409: it hands out none of the kinds declared): no
    claim of this client can succeed."""


@dataclass
class ClientReport:
    worker: int
    claimed: int = 0
    completed: int = 0
    expired: int = 0  # completed too late: the gateway answered 409
    lost: int = 0  # completed after the job restarted: its new gateway does not know the rollout (404)
    failed: int = 0  # the agent raised; the rollout left to expire
    refused: int = 0  # a task of a kind the agent does not handle; the rollout left to expire
    waits: int = 0  # 204 answers (no task right now)
    rewards: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def load_agent(name: str) -> Any:
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; known: {', '.join(AGENTS)}")
    module, _, fn = AGENTS[name].partition(":")
    return getattr(importlib.import_module(module), fn)


def agent_kinds(name: str) -> tuple[str, ...]:
    """The task kinds agent ``name`` handles (its module's ``KINDS``)."""
    load_agent(name)  # an unknown agent: ValueError naming the known ones
    return tuple(importlib.import_module(AGENTS[name].partition(":")[0]).KINDS)


def claim_kinds(agent: str, kinds: Any = None) -> tuple[str, ...] | None:
    """What a client of ``agent`` declares: ``kinds`` None -> the agent's ``KINDS``; ``"any"`` -> None
    (no declaration: any kind, the refused path); else those kinds, which the agent must handle."""
    handles = agent_kinds(agent)
    if kinds is None:
        return handles
    if kinds == "any":
        return None
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in handles]
    if not kinds or bad:
        raise ValueError(f"--kinds {','.join(kinds)}: the {agent} agent handles {', '.join(handles)}")
    return kinds


def _post(client: httpx.Client, url: str, body: dict, connect_timeout_s: float) -> httpx.Response:
    """POST, retrying connection failures (the gateway not up yet) for ``connect_timeout_s``."""
    deadline = time.monotonic() + connect_timeout_s
    delay = 0.2
    while True:
        try:
            return client.post(url, json=body)
        except httpx.TransportError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 5.0)


def client_loop(worker: int, gateway: str, api_key: str, agent: str, options: dict[str, Any],
                connect_timeout_s: float = 60.0, kinds: Any = None) -> ClientReport:
    """One client: claim -> run -> complete until the gateway answers 410. ``kinds``: what it
    declares (``claim_kinds``: None, the agent's kinds; ``"any"``, none)."""
    from examples.sql_exec import SessionExecutor
    from examples.task_kinds import UnsupportedTask

    run_agent = load_agent(agent)
    declared = claim_kinds(agent, kinds)
    body = {} if declared is None else {"kinds": list(declared)}
    report = ClientReport(worker)
    with httpx.Client(base_url=gateway.rstrip("/"), headers={"Authorization": f"Bearer {api_key}"},
                      timeout=120.0) as client:
        while True:
            r = _post(client, "/v1/rollouts", body, connect_timeout_s)
            if r.status_code == 410:
                return report
            if r.status_code == 409:
                raise ClaimRefused(r.json()["error"]["message"])
            if r.status_code == 204:
                report.waits += 1
                time.sleep(float(r.headers.get("retry-after", "1")))
                continue
            r.raise_for_status()
            claim = r.json()
            report.claimed += 1
            task = {**claim["task"], "session_url": claim["session_url"]}
            execute = SessionExecutor(claim["session_url"], api_key)
            try:
                out = run_agent(claim["base_url"], api_key, task, execute, **options)
            except UnsupportedTask as exc:  # a kind this agent does not handle: said, left to expire
                report.refused += 1
                report.errors.append(f"{claim['rollout_id']}: refused: {exc}")
                print(f"client {worker}: {report.errors[-1]}", file=sys.stderr, flush=True)
                continue
            except Exception as exc:  # the agent failed: the rollout expires on the gateway
                report.failed += 1
                report.errors.append(f"{claim['rollout_id']}: {type(exc).__name__}: {exc}")
                print(f"client {worker}: {report.errors[-1]}", file=sys.stderr, flush=True)
                continue
            finally:
                execute.close()
            c = _post(client, claim["complete_url"], {"sql": out.get("query") or ""}, connect_timeout_s)
            if c.status_code == 409:
                report.expired += 1
                continue
            if c.status_code == 404:
                report.lost += 1
                continue
            c.raise_for_status()
            report.completed += 1
            report.rewards.append(float(c.json()["reward"]))


def _process(worker: int, args: dict[str, Any]) -> None:
    try:
        report = client_loop(worker, args["gateway"], args["api_key"], args["agent"], args["options"],
                             args["connect_timeout_s"], args["kinds"])
    except ClaimRefused as exc:
        print(f"client {worker}: the gateway refused the claim: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    print(json.dumps(asdict(report)), flush=True)


def run_clients(gateway: str, api_key: str, agent: str, k: int, options: dict[str, Any] | None = None,
                connect_timeout_s: float = 60.0, kinds: Any = None) -> list[int]:
    """Start ``k`` client processes and wait for all; returns their exit codes. ``kinds``:
    ``claim_kinds``'."""
    load_agent(agent)  # an unknown agent or a missing extra fails here, before any process starts
    claim_kinds(agent, kinds)  # kinds the agent does not handle: here, before any process starts
    ctx = mp.get_context("spawn")
    args = {"gateway": gateway, "api_key": api_key, "agent": agent, "options": dict(options or {}),
            "connect_timeout_s": connect_timeout_s, "kinds": kinds}
    procs = [ctx.Process(target=_process, args=(i, args), name=f"sqlrl-client-{i}") for i in range(k)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return [int(p.exitcode or 0) for p in procs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gateway", required=True, help="the gateway's address, e.g. http://127.0.0.1:8100")
    p.add_argument("--api-key", required=True)
    p.add_argument("--agent", choices=sorted(AGENTS), default="langgraph")
    p.add_argument("-k", "--clients", type=int, default=2)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--temperature", type=float)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="the agent's per-call client timeout (its OpenAI client retries a call that runs past it)")
    p.add_argument("--connect-timeout-s", type=float, default=60.0)
    p.add_argument("--stream", action="store_true", help="streamed calls (the langgraph agent only)")
    p.add_argument("--kinds", help="task kinds to claim, comma-separated (default: every kind the agent "
                   "handles; 'any': declare none)")
    args = p.parse_args(argv)
    if args.clients < 1:
        p.error("-k must be >= 1")
    if not args.timeout_s > 0:
        p.error("--timeout-s must be > 0")
    kinds = None if args.kinds is None else "any" if args.kinds == "any" else tuple(
        k.strip() for k in args.kinds.split(",") if k.strip())
    try:
        claim_kinds(args.agent, kinds)
    except ValueError as exc:
        p.error(str(exc))
    if args.stream and args.agent != "langgraph":
        p.error("--stream is an option of the langgraph agent only")
    options = {"max_turns": args.max_turns, "max_tokens": args.max_tokens, "temperature": args.temperature,
               "timeout_s": args.timeout_s}
    if args.stream:
        options["streaming"] = True
    codes = run_clients(args.gateway, args.api_key, args.agent, args.clients, options, args.connect_timeout_s, kinds)
    bad = [i for i, c in enumerate(codes) if c]
    if bad:
        print(f"run_clients: client(s) {bad} exited with {[codes[i] for i in bad]}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
