"""The gateway on one process: ``Rollouts`` + ``ModelEngine`` + the FastAPI app served by uvicorn on a
loopback socket in a thread (real HTTP for the official ``openai`` client), a fake clock the tests
advance, and an engine wrapper that records what the engine sampled (to compare with the traces)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from serve.gateway import serving
from sqlrl.policy.engine import check_engine_class

KEY, OTHER = "gw-key-1", "gw-key-2"
QUESTION = "How many customers are there?"
GOLD = "SELECT count(*) FROM customers"


def tool_call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


SCRIPT = [{"match": "How many customers", "turns": [
    "Let me look.\n" + tool_call("execute_sql", {"sql": GOLD}), "There are 60 customers."]}]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Recorder:
    """An ``AsyncEngine`` that forwards to ``inner`` and records ``(prompt_ids, Generation)`` of
    every request that finished (what the engine sampled)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.finished: list[tuple[tuple[int, ...], Any]] = []

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    async def generate(self, prompt_ids, sampling, *, request_id=None):
        g = await self.inner.generate(prompt_ids, sampling, request_id=request_id)
        self.finished.append((tuple(prompt_ids), g))
        return g

    async def stream(self, prompt_ids, sampling, *, request_id=None):
        async for delta in self.inner.stream(prompt_ids, sampling, request_id=request_id):
            if delta.final is not None:
                self.finished.append((tuple(prompt_ids), delta.final))
            yield delta

    async def abort(self, request_id):
        await self.inner.abort(request_id)

    async def update_weights(self, weights, *, policy=None):
        return await self.inner.update_weights(weights, **({} if policy is None else {"policy": policy}))

    async def close(self):
        await self.inner.close()


check_engine_class(Recorder)


@dataclass
class Gateway:
    url: str
    rollouts: Any
    engine: Any  # the inner engine (ScriptedEngine / HFEngine)
    recorder: Recorder
    pool: Any
    clock: FakeClock
    model: Any
    app: Any = None
    extra: dict = field(default_factory=dict)

    def client(self, base_url: str, key: str = KEY, **kw: Any) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60, **kw)

    def post(self, path: str, body: Any = None, key: str | None = KEY, **kw: Any) -> Any:
        import httpx

        headers = {"Authorization": f"Bearer {key}"} if key else {}
        headers.update(kw.pop("headers", {}))
        if isinstance(body, (bytes, str)):
            return httpx.post(self.url + path, content=body, headers=headers, timeout=60, **kw)
        return httpx.post(self.url + path, json={} if body is None else body, headers=headers, timeout=60, **kw)

    def claim(self, key: str = KEY) -> dict:
        r = self.post("/v1/rollouts", key=key)
        assert r.status_code == 200, r.text
        return r.json()


@contextlib.contextmanager
def gateway(policy: Any, engine: Any, catalog: dict, *, config: Any = None, window: int | None = None,
            limits: dict | None = None, schemas: dict | None = None, journal: Any = None):
    from serve.config import load_serve_config
    from serve.engine import ModelEngine
    from serve.gateway import build_gateway_app
    from sqlrl.db import SessionPool
    from sqlrl.db.source import LocalSessions
    from sqlrl.gateway.rollouts import GatewayConfig, JudgeScorer, Rollouts
    from sqlrl.rewards import Judge

    clock = FakeClock()
    pool = SessionPool()
    recorder = Recorder(engine)
    serve_config = load_serve_config({"models": {"policy": {"policy": {"model": "tiny"}}}, "limits": limits or {}})
    model = ModelEngine("policy", policy, recorder, serve_config, window=window)
    rollouts = Rollouts(config or GatewayConfig(deadline_s=60), LocalSessions(catalog, pool=pool),
                        JudgeScorer(Judge(catalog)), schemas=schemas, clock=clock, journal=journal)
    app = build_gateway_app(rollouts, model, keys=frozenset({KEY, OTHER}))
    with serving(app) as url:
        yield Gateway(url, rollouts, engine, recorder, pool, clock, model, app=app)
    rollouts.close()
    pool.close()


@pytest.fixture(scope="module")
def tiny():
    from sqlrl.policy.load import load_policy

    return load_policy("tiny")


@pytest.fixture(scope="module")
def shop_catalog(tmp_path_factory) -> dict:
    from sqlrl.tasks.demo_db import build_demo_database

    path = build_demo_database(str(tmp_path_factory.mktemp("gw") / "shop.sqlite"), seed=0)
    return {"shop": {"sqlite": f"sqlite:///{path}"}}


def shop_task(task_id: str = "t1", dialect: str = "sqlite") -> Any:
    from sqlrl.tasks.types import Text2SQLTask

    return Text2SQLTask(task_id, "shop", QUESTION, GOLD, dialect=dialect, evidence="count rows")
