"""The gateway host: one per training job, the HTTP app (``serve/gateway.py``) served by uvicorn
inside it, on the job's policy engine (thin; the logic is ``sqlrl.gateway``).

    handle, url = start_gateway(spec)              # a Ray actor; url also in <run_dir>/gateway.json
    ray.get(handle.offer.remote("step0/task7", task, 8))
    traces = ray.get(handle.drain.remote())        # finished RolloutTrace values
    ray.get(handle.update_weights.remote(state_dict))

``GatewayServer`` is a plain class (``n=0``: run it in-process with ``await server.start()``); the
actor is ``ray.remote(GatewayServer)`` with its resources attached by ``start_gateway``. Its
methods and uvicorn share the actor's event loop (an async actor).

- **Engine**: built from ``GatewaySpec.model`` (a serving ``ModelSpec`` whose ``policy`` is the one
  ``PolicySpec``; ``serve.model_server.ModelServer`` loads and builds it as training does: hf,
  vllm, auto, scripted), or given in-process
  (``GatewayServer(spec, policy=, engine=)``: a job that already holds its engine).
- **Work in, traces out**: ``offer(group_id, task, n)`` (a task of any registered kind, or its dict), ``finish()``,
  ``drain()`` (each ``RolloutTrace`` once), ``stats()``.
- **Weights**: ``update_weights(weights, policy)`` goes through the engine's own
  ``update_weights`` (``UpdatePolicy``: drain / abort / continue); calls arriving meanwhile wait for
  the engine (``gateway.during_update: wait``) or get 429 + ``Retry-After`` (``reject``).
- **Deadlines and metrics**: every ``tick_s`` the host expires overdue rollouts (wall clock here;
  the core takes any clock) and sets the Prometheus gauges ``sqlrl_gateway_*`` (Prometheus:
  ``ray_sqlrl_gateway_*``; ``GatewayStats``' fields plus ``calls_per_s`` and
  ``generated_tokens_per_s`` over the last tick), tagged with the Ray job id.
- **Restarts**: with ``run_dir`` (and ``journal``, default on) the rollouts are journalled to
  ``<run_dir>/gateway_journal.jsonl`` (``sqlrl.gateway.journal``); a host started on a run dir whose
  journal holds records resumes from it (ended traces kept for the job's next ``drain``, offers
  waiting again, rollouts live at the restart expired with the cause named) and prints what it
  resumed. A new job removes the journal first (``jobs.train_agent``). The DB-pool sessions of
  rollouts live at the restart (``PoolSessions`` leases, named in the journal) are released by the
  new incarnation; local sessions went with the dead process.
- **Same address after a restart**: ``start()`` binds ``spec.port``, else the port of the journal's
  last ``serve`` record (the previous incarnation's), else any free port, and journals it. A port
  still in use is retried, backing off, for ``rebind_wait_s`` (the dead process's socket), then
  ``GatewayBindError``. As a Ray actor with ``max_restarts`` (which needs the journal), a restarted
  incarnation starts serving by itself (``serve_again``, called on itself from its constructor) on
  that port, so the URLs clients hold keep answering (``host: 0.0.0.0`` restarted on another node:
  the node's IP, hence the URL, changes). ``address()`` raises the error of a restart that could
  not serve; ``ready()`` waits for a restarted incarnation to serve (or raises that error);
  ``incarnation()`` names the process (a new token in each) and what it resumed. A restart under a
  policy version > 0 holds its calls until ``update_weights(weights, policy, version)`` restores
  them (``sqlrl.gateway.weights``).
- **The job's wait**: ``wait_step(timeout)`` returns once every offered rollout has ended (an
  async method waiting on the rollouts' condition in a worker thread: the driver's ``ray.get``
  long-polls the actor's state, nothing is polled on a clock); ``ActorGateway``
  (``actors/gateway_driver.py``, re-exported here) wraps a handle as the job's ``StepGateway``
  across restarts: weights restored, calls repeated with idempotency tokens, bounded.
- ``start()`` binds ``host:port`` (port 0: any free port), prints ``sqlrl gateway: <url>`` and writes
  ``{"url": ...}`` to ``<run_dir>/gateway.json``; ``stop()`` ends the server, fails the rollouts still
  live (their sessions are released) and closes an engine it built.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import secrets
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from serve.config import AuthSpec, LimitsSpec, ModelSpec
from actors.gateway_gauges import Gauges
from sqlrl.config import from_mapping, to_dict
from sqlrl.gateway.journal import JOURNAL_FILE, Journal
from sqlrl.gateway.rollouts import GatewayConfig, GatewayStats, JudgeScorer, Rollouts
from sqlrl.gateway.trace import RolloutTrace
from sqlrl.tasks.kinds import kind_of_record


@dataclass(frozen=True)
class GatewaySpec:
    model: ModelSpec  # policy (a PolicySpec: model, backend, dtype, ...) and the batch bound, as serving's
    catalog: dict[str, dict[str, str]] = field(default_factory=dict)  # db id -> {dialect: url}
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    limits: LimitsSpec = field(default_factory=LimitsSpec)
    auth: AuthSpec = field(default_factory=lambda: AuthSpec(api_keys_env="SQLRL_GATEWAY_API_KEYS"))
    name: str = "policy"  # the model id clients see in /v1/models
    host: str = "127.0.0.1"  # 0.0.0.0 to serve other machines (the URL then names this node's IP)
    port: int = 0  # 0: any free port
    run_dir: str = ""  # where gateway.json goes ("" : nowhere)
    tick_s: float = 1.0  # expiry and metrics period
    journal: bool = True  # with run_dir: journal to <run_dir>/gateway_journal.jsonl and resume from it
    rebind_wait_s: float = 30.0  # a restart: how long to wait for its port to be free again

    def __post_init__(self) -> None:
        if not self.tick_s > 0:
            raise ValueError(f"gateway tick_s must be > 0, got {self.tick_s}")
        if not self.rebind_wait_s >= 0:
            raise ValueError(f"gateway rebind_wait_s must be >= 0, got {self.rebind_wait_s}")


@dataclass(frozen=True)
class Incarnation:
    """One gateway process (``GatewayServer.incarnation``): ``token`` is new in every process."""

    token: str
    pid: int
    lost: int  # rollouts live at the restart that this incarnation ended (0: a first start)
    released: int  # their DB sessions it released
    awaiting_weights: bool  # restarted under a policy version > 0: the job must restore its weights


class GatewayBindError(RuntimeError):
    """The gateway could not serve on its port again (a restart: the port stayed taken)."""


async def _bind(host: str, port: int, wait_s: float) -> socket.socket:
    """A listening socket on ``host:port``. A port in use (the dead incarnation's socket not yet
    closed by the OS, or taken meanwhile) is tried again, backing off, for ``wait_s``; then
    ``GatewayBindError``. The OS gives no event for a port's release, so this polls the bind."""
    deadline, delay = time.monotonic() + wait_s, 0.05
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(256)
            return sock
        except OSError as exc:
            sock.close()
            if port == 0 or exc.errno != errno.EADDRINUSE:
                raise
            if time.monotonic() + delay > deadline:
                raise GatewayBindError(
                    f"the gateway cannot serve on {host}:{port} again: the port is still in use after "
                    f"{wait_s:g} s (another process holds it); clients holding this address cannot reach "
                    "the gateway. Free the port, or give the gateway a fixed free `port`, or a longer "
                    "`rebind_wait_s`") from None
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


def load_gateway_spec(data: Mapping[str, Any]) -> GatewaySpec:
    return from_mapping(GatewaySpec, data)


def _schemas(catalog: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """What claims show as ``task.schema``: read from each database's SQLite copy, where there is one."""
    from sqlrl.db.dialects.descriptor import FileCopy, find
    from sqlrl.db.url import parse_url
    from sqlrl.tasks.schema import DatabaseSchema

    out = {}
    for db, urls in catalog.items():
        for name, url in urls.items():
            dialect = find(name)
            if dialect is not None and isinstance(dialect.storage, FileCopy) and dialect.storage.sqlite_file:
                out[db] = DatabaseSchema.from_sqlite(parse_url(url).database, db_id=db)
                break
    return out


class GatewayServer:
    def __init__(self, spec: Mapping[str, Any] | GatewaySpec, *, policy: Any = None, engine: Any = None,
                 sessions: Any = None, owns_engine: bool = False) -> None:
        """``policy`` + ``engine``: use these (in-process) instead of building them (``owns_engine``:
        ``stop()`` closes the given engine too); ``sessions``: a
        ``SessionSource`` for the rollouts' sessions (default ``LocalSessions`` on the catalog;
        ``PoolSessions`` over the DB pool in a cluster job)."""
        from serve.config import load_serve_config
        from serve.engine import ModelEngine
        from serve.gateway import build_gateway_app
        from serve.model_server import ModelServer
        from sqlrl.db.source import LocalSessions
        from sqlrl.rewards import Judge

        self.spec = spec if isinstance(spec, GatewaySpec) else load_gateway_spec(spec)
        s = self.spec
        keys = s.auth.keys()
        if not keys:
            raise ValueError(f"the gateway has no API keys: set auth.api_keys or ${s.auth.api_keys_env}")
        serve_args = {"models": {s.name: to_dict(s.model)}, "limits": to_dict(s.limits)}
        if engine is None:
            server = ModelServer(s.name, serve_args)
            self.model, self.engine, self._owns_engine = server.model, server.engine, True
        else:
            self.model = ModelEngine(s.name, policy, engine, load_serve_config(serve_args))
            self.engine, self._owns_engine = engine, owns_engine
        if sessions is None:
            sessions = LocalSessions(s.catalog)
        journal = Journal(Path(s.run_dir, JOURNAL_FILE)) if s.journal and s.run_dir else None
        self.rollouts = Rollouts(s.gateway, sessions, JudgeScorer(Judge(s.catalog), s.gateway.reward),
                                 schemas=_schemas(s.catalog), journal=journal)
        self.app = build_gateway_app(self.rollouts, self.model, keys=keys, limits=s.limits)
        self.url: str | None = None
        self._server: Any = None
        self._tasks: list[asyncio.Task] = []
        self._gauges = Gauges()
        self._start_error: BaseException | None = None
        self._token = secrets.token_hex(8)  # this process's incarnation

    async def start(self) -> str:
        """Serve (module docstring); returns the base URL clients use."""
        import uvicorn

        if self.url is not None:
            return self.url
        before = self.rollouts.restored.port  # a restart: the port its clients hold
        port = self.spec.port or before or 0
        sock = await _bind(self.spec.host, port, self.spec.rebind_wait_s if port else 0.0)
        if self.rollouts.journal is not None and sock.getsockname()[1] != before:
            self.rollouts.journal.append("serve", port=sock.getsockname()[1])
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        self._tasks = [asyncio.ensure_future(self._server.serve(sockets=[sock])),
                       asyncio.ensure_future(self._tick())]
        host = self.spec.host
        if host in ("0.0.0.0", ""):
            import ray

            host = ray.util.get_node_ip_address() if ray.is_initialized() else socket.gethostname()
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        self.app.state.public_url = self.url
        if self.spec.run_dir:
            Path(self.spec.run_dir).mkdir(parents=True, exist_ok=True)
            Path(self.spec.run_dir, "gateway.json").write_text(json.dumps({"url": self.url}) + "\n")
        print(f"sqlrl gateway: {self.url}", flush=True)
        r = self.rollouts.restored
        if r.ended or r.lost or r.waiting:
            print(f"sqlrl gateway: resumed from its journal: {len(r.ended)} ended rollout(s) kept for the job, "
                  f"{len(r.waiting)} waiting again, {len(r.lost)} live at the restart expired "
                  f"({self.rollouts.restored_released} of their DB sessions released)", flush=True)
        return self.url

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.spec.tick_s)  # a period, not a wait for an event
            if self.rollouts.due():
                await asyncio.to_thread(self.rollouts.expire_due)
            self._gauges.set(self.rollouts.stats(), time.monotonic())

    async def address(self) -> str | None:
        """The base URL once serving (None before); raises the error a restarted incarnation
        got when it could not serve again (``GatewayBindError``)."""
        if self._start_error is not None:
            raise self._start_error
        return self.url

    async def process_id(self) -> int:
        """This incarnation's process id (tests kill it to make Ray restart the actor)."""
        return os.getpid()

    async def incarnation(self) -> Incarnation:
        """Who answers: a new ``token`` in every process, and what it resumed (``ActorGateway``
        compares tokens to notice a restart)."""
        r = self.rollouts
        return Incarnation(self._token, os.getpid(), len(r.restored.lost), r.restored_released,
                           r.awaiting_weights)

    async def offer(self, group_id: str, task: Any, n: int = 1,
                    token: str | None = None) -> None:
        """``token``: an idempotency key (``Rollouts.offer``: the same token again is a no-op)."""
        if isinstance(task, Mapping):  # a task record (from another process): its kind's class reads it
            task = kind_of_record(task).task_type.from_dict(dict(task))
        self.rollouts.offer(group_id, task, n, token)

    async def finish(self) -> None:
        self.rollouts.finish()

    async def wait_step(self, timeout: float | None = None) -> bool:
        """Until every offered rollout has ended (``Rollouts.wait_idle``: woken by the gateway's
        state changes, not polled) or ``timeout``; returns whether they all ended. ``stop()``
        releases it. The job's step wait through the actor (``ActorGateway``)."""
        return await asyncio.to_thread(self.rollouts.wait_idle, timeout)

    async def drain(self, token: str | None = None) -> list[RolloutTrace]:
        """``token``: the last drain's token again returns its traces again (``Rollouts.drain``)."""
        return self.rollouts.drain(token)

    async def stats(self) -> GatewayStats:
        return self.rollouts.stats()

    async def update_weights(self, weights: Mapping[str, Any], policy: str = "drain",
                             version: int | None = None) -> int:
        """New weights through the engine's ``update_weights``; returns the new policy version
        (``version``: the job's number for these weights, recorded calls then carry it)."""
        return await self.rollouts.update_weights(self.engine, weights, policy, version)

    async def stop(self) -> int:
        """Stop serving; returns how many live rollouts were failed (their sessions released)."""
        if self._server is not None:
            self._server.should_exit = True
        for t in self._tasks[1:]:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        self._tasks = []
        failed = await asyncio.to_thread(self.rollouts.close)
        from serve.gateway import close_gateway_app

        close_gateway_app(self.app)  # the app's SQL threads end with it
        if self._owns_engine:
            with contextlib.suppress(Exception):
                await self.engine.close()
        return failed


class _GatewayActor(GatewayServer):
    """The Ray actor's class: a ``GatewayServer`` that, when Ray restarts it (``max_restarts``),
    starts serving by itself -- on the port of its journal -- since nobody calls ``start`` again.
    It calls ``serve_again`` on itself from a thread: Ray refuses a call to an actor whose
    constructor is still running (``ActorUnavailableError``: it is restarting), so the call is made
    again, backing off, until it is taken (bounded: ``SERVE_AGAIN_WAIT_S``)."""

    SERVE_AGAIN_WAIT_S = 300.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import threading

        import ray

        super().__init__(*args, **kwargs)
        ctx = ray.get_runtime_context()
        self._served = threading.Event()  # a restart: set once serve_again has served or failed
        self._serve_lock = asyncio.Lock()
        self._restarted = ctx.was_current_actor_reconstructed
        if self._restarted:
            threading.Thread(target=self._serve_when_taken, args=(ctx.current_actor,), daemon=True).start()

    def _serve_when_taken(self, me: Any) -> None:
        import ray
        from ray.exceptions import ActorUnavailableError

        deadline, delay = time.monotonic() + self.SERVE_AGAIN_WAIT_S, 0.05
        try:
            while True:
                try:
                    ray.get(me.serve_again.remote())
                    return
                except ActorUnavailableError as exc:  # the constructor has not returned yet
                    if time.monotonic() + delay > deadline:
                        self._start_error = self._start_error or exc
                        return
                except Exception as exc:  # serve_again failed (it recorded why) or the call did
                    self._start_error = self._start_error or exc
                    return
                time.sleep(delay)  # this thread's own back-off between calls Ray refused
                delay = min(delay * 2, 1.0)
        finally:
            self._served.set()

    async def ready(self) -> str | None:
        """The URL once serving; a restarted incarnation: once its ``serve_again`` has served (its
        error raised: ``address``)."""
        if self._restarted:
            await asyncio.to_thread(self._served.wait)
        return await self.address()

    async def serve_again(self) -> str:
        async with self._serve_lock:  # at most one start at a time (a repeated call: the URL)
            try:
                return await self.start()
            except BaseException as exc:
                self._start_error = exc
                print(f"sqlrl gateway: restarted but not serving: {exc}", file=sys.stderr, flush=True)
                raise


def start_gateway(spec: Mapping[str, Any] | GatewaySpec, *, num_cpus: float = 1.0, num_gpus: float = 0.0,
                  resources: Mapping[str, float] | None = None, name: str | None = None,
                  sessions: Any = None, max_restarts: int = 0) -> tuple[Any, str]:
    """The gateway as a Ray actor (started, serving): ``(handle, url)``. ``sessions``: a picklable
    ``SessionSource`` for the rollouts (``PoolSessions(db_pool_client)``: leases from the job's DB
    pool); default: local sessions on the spec's catalog. ``max_restarts``: how often Ray restarts
    a dead actor (needs the journal; ``ActorGateway(handle, max_restarts=)`` drives it across them)."""
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    import ray

    spec = spec if isinstance(spec, GatewaySpec) else load_gateway_spec(spec)
    if max_restarts and not (spec.run_dir and spec.journal):
        raise ValueError("max_restarts needs the gateway's journal (a run_dir, journal: true): "
                         "a restarted gateway resumes its rollouts and its port from it")
    env = {k: os.environ[k] for k in (spec.auth.api_keys_env,) if k and k in os.environ}
    actor = ray.remote(_GatewayActor).options(
        num_cpus=num_cpus, num_gpus=num_gpus, resources=dict(resources or {}), name=name, max_concurrency=1000,
        max_restarts=max_restarts,
        runtime_env={"env_vars": env} if env else None)
    handle = actor.remote(spec, sessions=sessions)
    return handle, ray.get(handle.start.remote())


from actors.gateway_driver import ActorGateway, GatewayLost  # noqa: E402  (the driver's side, re-exported)
