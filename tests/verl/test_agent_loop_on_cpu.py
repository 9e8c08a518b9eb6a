"""sqlrl's verl agent loop, tools and reward function, driven through verl's own ``AgentLoopWorker``
with a scripted LLM client (conftest.py) and real sqlrl sessions (SQLite; PostgreSQL when
SQLRL_PG_ADMIN_URL is set)."""

from __future__ import annotations

import asyncio
import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import sealed_base
from tests.verl.conftest import CONFIGS, ScriptedLLM, call, run_worker, verl_config

TABLE = ["CREATE TABLE t (id INTEGER, name VARCHAR(20))", "INSERT INTO t VALUES (1, 'ada'), (2, 'bo')"]
GOLD = "SELECT name FROM t WHERE id = 1"


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def sqlite_catalog(tmp_path_factory) -> dict[str, dict[str, str]]:
    path = tmp_path_factory.mktemp("db") / "shop.sqlite"
    conn = sqlite3.connect(path)
    for sql in TABLE:
        conn.execute(sql)
    conn.commit()
    conn.close()
    return {"shop": {"sqlite": f"sqlite:///{path}"}}


@pytest.fixture(scope="module")
def pg_catalog(pg_admin_url) -> Any:
    for _, session_url in sealed_base(pg_admin_url, "sqlrl_verl_test", TABLE):
        yield {"shop": {"postgresql": session_url}}


def agent_loop_yaml(tmp_path: Path, **keys: Any) -> Path:
    """The shipped agent-loop YAML with some keys changed (what a user's copy would hold)."""
    entries = yaml.safe_load((CONFIGS / "agent_loop.yaml").read_text())
    entries[0].update(keys)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "agent_loop.yaml"
    path.write_text(yaml.safe_dump(entries))
    return path


def row(script: str, dialect: str = "sqlite", index: int = 0) -> dict[str, Any]:
    """A verl dataset row as sqlrl's stage-4 parquet has it (tools_kwargs from export_verl)."""
    from sqlrl.tasks.loaders.verl import verl_row
    from sqlrl.tasks.types import Text2SQLTask

    task = Text2SQLTask(f"t{index}", "shop", "name of id 1", GOLD, dialect=dialect)
    r = verl_row(task, index, prompt=[{"role": "user", "content": f"[script:{script}] go"}])
    return {"raw_prompt": r["prompt"], "agent_name": "sqlrl_agent", "index": index,
            "tools_kwargs": r["extra_info"]["tools_kwargs"], "extra_info": r["extra_info"],
            "reward_model": r["reward_model"], "data_source": r["data_source"]}


@pytest.fixture
def in_process_pool():
    """Publishes an in-process pool over a catalog by name (what ``pool: <name>`` in the agent-loop
    YAML claims); the test's pools are shut down and unpublished afterwards, so their reaper threads
    and sessions do not outlive the test."""
    from actors.db_pool import DBPoolConfig, DBPoolGroup
    from actors.verl.sessions import publish_pool, unpublish_pool
    from sqlrl.db.leases.protocol import Catalog
    from sqlrl.db.leases.shard import ShardConfig

    made: list[tuple[str, Any]] = []

    def publish(name: str, catalog: dict[str, dict[str, str]]):
        dialects = {d for urls in catalog.values() for d in urls}
        group = DBPoolGroup(DBPoolConfig(rollout_workers=1, per_worker={d: 1 for d in dialects},
                                         shard=ShardConfig(catalog=Catalog(catalog)), in_process=True))
        made.append((name, group))
        publish_pool(group, name)
        return group

    yield publish
    for name, group in made:
        unpublish_pool(name)
        group.shutdown()


def leases(group) -> tuple[int, int, int]:
    """(active, granted, released) over the pool's rollout shards."""
    stats = [s for sid, s in group.stats().items() if sid.startswith("rollout/")]
    return (sum(s.active_leases for s in stats), sum(s.granted for s in stats),
            sum(s.released for s in stats))


PERSIST = [call("execute_sql", "CREATE TEMP TABLE scratch AS SELECT 7 AS v"),
           call("execute_sql", "SELECT name FROM t ORDER BY id"),
           call("execute_sql", "SELECT v FROM scratch"),
           call("submit_solution", GOLD)]


def check_persisted(out, llm) -> None:
    calls = out.non_tensor_batch["sqlrl_tool_calls"][0]
    assert [c["name"] for c in calls] == ["execute_sql"] * 3 + ["submit_solution"]
    assert out.non_tensor_batch["sqlrl_submitted_sql"][0] == GOLD
    assert out.non_tensor_batch["sqlrl_stop_reason"][0] == "submitted"
    # stage4.yaml allows 4 assistant turns: verl stops after the 4th before reading its calls;
    # the sqlrl loop still records that turn's submit_solution
    assert len(llm.prompts) == 4
    # the prompt lists sqlrl's own tool schemas (verl's pydantic schema would drop this key)
    assert llm.prompts[0].count('"additionalProperties": false') == 2
    # call 3's observation, in sqlrl's format, shows the TEMP table made in call 1
    assert "<tool_response>\nv\n7\n(1 row)\n</tool_response>" in llm.prompts[3]
    assert "name\nada\nbo\n(2 rows)" in llm.prompts[3]


def test_temp_table_persists_across_calls_sqlite(tiny_model, tokenizer, sqlite_catalog, tmp_path):
    path = agent_loop_yaml(tmp_path, catalog=sqlite_catalog)
    llm = ScriptedLLM(tokenizer, {"A": PERSIST})
    out = run_worker(verl_config(tiny_model, **{
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(path)}), llm, [row("A")])
    check_persisted(out, llm)
    mask = out.batch["response_mask"][0]
    assert 0 < int(mask.sum()) < int(out.batch["attention_mask"][0].sum())  # observations masked


@pytest.mark.postgres
def test_temp_table_persists_across_calls_postgresql(tiny_model, tokenizer, pg_catalog, tmp_path,
                                                     in_process_pool):
    in_process_pool("verl-test-pg", pg_catalog)
    path = agent_loop_yaml(tmp_path, pool="verl-test-pg", catalog=None)
    llm = ScriptedLLM(tokenizer, {"A": PERSIST})
    out = run_worker(verl_config(tiny_model, **{
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(path)}), llm,
        [row("A", dialect="postgresql")])
    check_persisted(out, llm)


def test_session_released_after_end_exception_and_deadline(tiny_model, tokenizer, sqlite_catalog,
                                                           tmp_path, in_process_pool):
    group = in_process_pool("verl-test-release", sqlite_catalog)

    def config(name: str, **keys: Any):
        path = agent_loop_yaml(tmp_path / name, pool="verl-test-release", catalog=None, **keys)
        return verl_config(tiny_model, **{"actor_rollout_ref.rollout.agent.agent_loop_config_path": str(path)})

    class Failing(ScriptedLLM):
        async def generate(self, **kw):
            if len(self.prompts) == 1:
                raise RuntimeError("the LLM server died")
            return await super().generate(**kw)

    run_worker(config("normal"), ScriptedLLM(tokenizer, {"A": PERSIST}), [row("A")])
    assert leases(group) == (0, 1, 1)

    with pytest.raises(RuntimeError, match="server died"):
        run_worker(config("normal"), Failing(tokenizer, {"A": PERSIST}), [row("A")])
    assert leases(group) == (0, 2, 2)

    # the LLM hangs (its event is never set): the deadline ends the trajectory, whether it comes
    # during the second generation or (on a slow machine) earlier
    short = config("short", deadline_s=1)
    out = run_worker(short, ScriptedLLM(tokenizer, {"H": [call("execute_sql", "SELECT 1"), None]}), [row("H")])
    assert out.non_tensor_batch["sqlrl_stop_reason"][0] == "deadline"
    assert leases(group) == (0, 3, 3)

    # a deadline before the first token: a well-formed, fully masked one-token response
    out = run_worker(short, ScriptedLLM(tokenizer, {"S": [None]}), [row("S")])
    assert out.non_tensor_batch["sqlrl_stop_reason"][0] == "deadline"
    assert int(out.batch["response_mask"][0].sum()) == 0
    assert leases(group) == (0, 4, 4)


def test_concurrent_trajectories_never_share_a_session(tiny_model, tokenizer, sqlite_catalog, tmp_path,
                                                       in_process_pool):
    group = in_process_pool("verl-test-concurrent", sqlite_catalog)
    path = agent_loop_yaml(tmp_path, pool="verl-test-concurrent", catalog=None)

    class Synced(ScriptedLLM):
        """Both trajectories create their TEMP table before either reads it."""

        def __init__(self, *a: Any) -> None:
            super().__init__(*a)
            self.both_created = None

        async def generate(self, **kw):
            text = self.tokenizer.decode(kw["prompt_ids"])
            if text.count("<|im_start|>assistant") == 2:  # second turn: the CREATE has run
                self.both_created = self.both_created or asyncio.Barrier(2)
                await asyncio.wait_for(self.both_created.wait(), 60)  # a safety net, not a check
            return await super().generate(**kw)

    scripts = {name: [call("execute_sql", f"CREATE TEMP TABLE mine AS SELECT '{name}' AS who"),
                      call("execute_sql", "SELECT who FROM mine"), call("submit_solution", GOLD)]
               for name in ("A", "B")}
    llm = Synced(tokenizer, scripts)
    config = verl_config(tiny_model, **{"actor_rollout_ref.rollout.agent.agent_loop_config_path": str(path)})
    out = run_worker(config, llm, [row("A", index=0), row("B", index=1)])
    assert list(out.non_tensor_batch["sqlrl_stop_reason"]) == ["submitted", "submitted"]
    assert len(llm.prompts) == 6  # submit_solution on turn 3 of 4 ended each trajectory
    finals = [p for p in llm.prompts if p.count("<|im_start|>assistant") == 3]
    for name in ("A", "B"):
        (final,) = [p for p in finals if f"[script:{name}]" in p]
        assert "<tool_response>\nOK\n</tool_response>" in final  # its CREATE did not collide
        assert f"who\n{name}\n(1 row)" in final  # and it reads its own table
    assert leases(group) == (0, 2, 2)


def test_reward_function_scores_correct_and_wrong_submissions(tiny_model, tokenizer, sqlite_catalog,
                                                              tmp_path):
    from actors.verl.reward_fn import compute_score

    path = agent_loop_yaml(tmp_path, catalog=sqlite_catalog)
    config = verl_config(tiny_model, **{"actor_rollout_ref.rollout.agent.agent_loop_config_path": str(path)})
    scripts = {"R": [call("execute_sql", "SELECT * FROM t"), call("submit_solution", "SELECT name FROM t WHERE id = 1")],
               "W": [call("submit_solution", "SELECT name FROM t WHERE id = 2")],
               "E": [call("submit_solution", "SELECT nope FROM t")],
               "N": ["I give up."]}
    rows = [row(name, index=i) for i, name in enumerate(scripts)]
    out = run_worker(config, ScriptedLLM(tokenizer, scripts), rows)
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps(sqlite_catalog))

    def score(i: int, **change: Any) -> dict[str, float]:
        extra = {**rows[i]["extra_info"], "sqlrl_tool_calls": out.non_tensor_batch["sqlrl_tool_calls"][i]}
        extra.update(change)
        return compute_score(rows[i]["data_source"], "decoded text is not read", rows[i]["reward_model"]["ground_truth"],
                             extra, reward="hybrid_agentic", catalog=str(catalog))

    right, wrong, error, none = (score(i) for i in range(4))
    assert right["score"] == 1.0 and right["result"] == 1.0 and right["excluded"] == 0.0
    assert wrong["score"] == 0.0 and wrong["executed"] == 1.0 and wrong["excluded"] == 0.0
    assert error["score"] == 0.0 and error["executed"] == 0.0
    assert none["score"] == 0.0 and none["format"] == 0.0
    assert set(right) == set(wrong) == set(error) == set(none)
    # fail closed: a row whose ground truth is not its task's, or without a task, is never rewarded
    tampered = compute_score("x", "", "SELECT 1", {**rows[0]["extra_info"],
                             "sqlrl_tool_calls": out.non_tensor_batch["sqlrl_tool_calls"][0]},
                             catalog=str(catalog))
    assert tampered["score"] == 0.0 and tampered["excluded"] == 1.0 and set(tampered) == set(right)
    assert score(0, task="not json")["excluded"] == 1.0
    with pytest.raises(KeyError, match="unknown reward"):
        compute_score("x", "", GOLD, rows[0]["extra_info"], reward="nope", catalog=str(catalog))


def test_configs_load_with_verls_own_machinery(tiny_model, monkeypatch):
    from hydra.utils import get_class
    from omegaconf import OmegaConf
    from verl.tools.tool_registry import initialize_tools_from_config
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import load_extern_object

    from actors.verl.agent_loop import SqlrlAgentLoop
    from actors.verl.reward_fn import compute_score
    from sqlrl.tools import tool_schemas

    tools = initialize_tools_from_config(str(CONFIGS / "tools.yaml"))
    assert [t.name for t in tools] == ["execute_sql", "submit_solution"]
    # verl's schema model cannot hold additionalProperties; the agent loop puts sqlrl's schemas in
    # the prompt, and sqlrl.tools.validate_call rejects extra arguments either way
    expected = copy.deepcopy(tool_schemas())  # the specs' dicts are shared: never mutate them
    for schema in expected:
        del schema["function"]["parameters"]["additionalProperties"]
    assert [t.tool_schema.model_dump(exclude_none=True, exclude_unset=True) for t in tools] == expected

    (entry,) = OmegaConf.load(CONFIGS / "agent_loop.yaml")
    assert entry.name == "sqlrl_agent" and get_class(entry._target_) is SqlrlAgentLoop

    # the shipped stage-4 config, as verl's trainer reads it (no test overrides of its paths)
    from hydra import compose, initialize_config_dir

    monkeypatch.setenv("SQLRL_ROOT", str(CONFIGS.parents[2]))
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose("stage4", overrides=["data.train_files=t.parquet", "data.val_files=v.parquet",
                                           f"actor_rollout_ref.model.path={tiny_model}"])
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert Path(rollout.multi_turn.tool_config_path).is_file()
    assert Path(rollout.agent.agent_loop_config_path).is_file()
    assert rollout.agent.default_agent_loop == "sqlrl_agent" and rollout.n == 4
    assert omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).clip_ratio_high == 0.28
    assert omega_conf_to_dataclass(cfg.algorithm).adv_estimator == "grpo"
    fn = cfg.reward.custom_reward_function
    assert load_extern_object(fn.path, fn.name) is compute_score
    assert fn.reward_kwargs.reward == "hybrid_agentic"


def test_tools_outside_the_sqlrl_loop_run_nothing():
    from actors.verl.tools import ExecuteSqlTool

    tool = ExecuteSqlTool(config={"type": "native"})
    response, reward, metrics = asyncio.run(tool.execute("id", {"sql": "DROP TABLE t"}))
    assert response.text.startswith("Error (tool call): execute_sql needs sqlrl's agent loop")
    assert metrics == {"error": True} and reward == 0.0


def test_worker_slots_give_each_owner_its_own_index():
    from actors.verl.sessions import WorkerSlots

    slots = WorkerSlots(2)
    assert [slots.claim("a"), slots.claim("b"), slots.claim("a")] == [0, 1, 0]
    with pytest.raises(RuntimeError, match="all 2 DB-pool partitions are claimed"):
        slots.claim("c")


def test_an_unpublished_pool_leaves_no_source_behind(sqlite_catalog, in_process_pool):
    from actors.verl.sessions import unpublish_pool, worker_sessions
    from sqlrl.db.source import SessionRequest, open_one

    first = in_process_pool("verl-test-republish", sqlite_catalog)
    source = worker_sessions(pool="verl-test-republish")
    assert worker_sessions(pool="verl-test-republish") is source  # cached per process
    unpublish_pool("verl-test-republish")
    first.shutdown()
    in_process_pool("verl-test-republish", sqlite_catalog)  # the name again, on a new pool
    again = worker_sessions(pool="verl-test-republish")
    assert again is not source
    with open_one(again, SessionRequest("shop", "sqlite")) as session:  # the live pool's lease
        assert session.execute(GOLD).rows == (("ada",),)
