"""The example agents, unchanged, against sqlrl's own serving app (serve/: ``/v1/chat/completions``
on Ray Serve, loopback HTTP) with a local SQLite database -- the serving half of "the same API from
training to serving". Models: ``script`` (the scripted engine over the tiny tokenizer: deterministic
answers, so the LangGraph agent's write -> execute -> check -> rewrite path and the openai agent's
tool calls are checked step by step) and ``tiny`` (the tiny model's checkpoint on the HF engine: real
generation; its random-init answers still have to leave the agents finishing cleanly)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("langgraph", reason="the agents extra (langgraph, langchain-openai) is not installed")

from examples.langgraph_sql_agent.agent import run_agent as run_langgraph  # noqa: E402
from examples.openai_client_agent.agent import run_agent as run_openai  # noqa: E402
from examples.sql_exec import SQLiteExecutor, load_task  # noqa: E402

from .fake_gateway import free_port  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray Serve app
KEY = "k-examples"
GOLD = "SELECT count(*) FROM customers"


def tc(sql: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'execute_sql', 'arguments': {'sql': sql}})}\n</tool_call>"


SCRIPT = [  # first match wins; turns[k] answers a prompt holding k assistant turns
    {"match": "that fixes", "turns": [f"```sql\n{GOLD}\n```"]},
    {"match": "SELECT count(nme)", "turns": ["Column nme does not exist. THE QUERY IS INCORRECT."]},
    {"match": "SELECT count(*)", "turns": ["It counts every customer. THE QUERY IS CORRECT."]},
    {"match": "by writing one SQL query", "turns": ["```sql\nSELECT count(nme) FROM customers\n```"]},
    {"match": "execute_sql to try", "turns": [tc("SELECT nme FROM customers"), tc(GOLD),
                                              f"The answer:\n```sql\n{GOLD}\n```"]},
]


@pytest.fixture(scope="module")
def served():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    from serve.app import build_app
    from sqlrl.policy.load import tiny_path
    from sqlrl.tasks.demo_db import build_demo_database

    tmp = Path(tempfile.mkdtemp(prefix="sqlrl-examples-"))
    db = tmp / "shop.sqlite"
    build_demo_database(str(db))
    args = {"models": {"script": {"policy": {"model": "tiny", "backend": "scripted",
                                             "engine_options": {"script": SCRIPT}}},
                       "tiny": {"policy": {"model": str(tiny_path()), "backend": "hf"}, "max_batch_size": 4}},
            "databases": {"shop": {"url": f"sqlite:///{db}"}}, "colocate": True,
            "sql_models": {"debug": "script", "generate": "script"},
            "limits": {"max_tokens": 48, "default_max_tokens": 32}, "auth": {"api_keys": [KEY]}}
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             namespace="sqlrl-examples-tests", _temp_dir=f"/tmp/sqlrl-ex-{os.getpid()}")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(args, (2.0, 0.0)), name="examples", route_prefix="/")
    yield {"base_url": f"http://127.0.0.1:{port}/v1", "db": db}
    serve.shutdown()
    ray.shutdown()


def local(served) -> tuple[dict, SQLiteExecutor]:
    execute = SQLiteExecutor(served["db"])
    return load_task({"question": "How many customers are there?"}, execute), execute


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
def test_the_langgraph_agent_runs_unchanged_on_the_serving_api(served, streaming):
    task, execute = local(served)
    before = hashlib.sha256(served["db"].read_bytes()).hexdigest()
    out = run_langgraph(served["base_url"], KEY, task, execute, model="script", streaming=streaming)
    assert out["query"] == GOLD and out["num_turns"] == 2 and out["calls"] == 4  # write, check, rewrite, check
    assert out["execution"].splitlines()[1] == "60"  # the demo database's customers, from the local file
    assert "THE QUERY IS CORRECT." in out["feedback"]
    assert hashlib.sha256(served["db"].read_bytes()).hexdigest() == before


def test_the_openai_client_agent_runs_unchanged_on_the_serving_api(served):
    task, execute = local(served)
    out = run_openai(served["base_url"], KEY, task, execute, model="script")
    assert (out["query"], out["calls"], out["tool_calls"]) == (GOLD, 3, 2)
    tool_results = [m["content"] for m in out["messages"] if m["role"] == "tool"]
    assert "no such column: nme" in tool_results[0] and tool_results[1].splitlines()[1] == "60"


@pytest.mark.parametrize("run", [run_langgraph, run_openai], ids=["langgraph", "openai"])
def test_both_agents_finish_on_the_tiny_model(served, run):
    """Real generation (random-init weights): whatever it writes, the agent ends cleanly."""
    task, execute = local(served)
    out = run(served["base_url"], KEY, task, execute, model="tiny", max_tokens=16, temperature=0.0)
    assert isinstance(out["query"], str) and 1 <= out["calls"] <= 6
