"""The example agents on debugging (critic) tasks against the real gateway app (scripted engine, real
HTTP on loopback): ``examples.run_clients.client_loop`` claims a critic rollout, the agent prompts
the model with the problem and the issue SQL (its debugging prompt), runs SQL on the rollout's
session (where the task's ``preprocess_sql`` ran) and completes with its fix; the server's Judge
scores it for the critic kind. Events, not time: the loop ends on the gateway's 410."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph", reason="the agents extra (langgraph, langchain-openai) is not installed")

from examples.run_clients import client_loop  # noqa: E402
from sqlrl.policy.scripted import ScriptedEngine  # noqa: E402

from .conftest import KEY, gateway, tool_call  # noqa: E402
from .test_gw_critic import FIX, ISSUE, PROBLEM, critic_task  # noqa: E402

SCRIPT = [
    # the openai agent's debugging system prompt: try the fix on the session, then answer it
    {"match": "You fix SQL for a", "turns": [tool_call("execute_sql", {"sql": FIX}), f"Fixed.\n```sql\n{FIX}\n```"]},
    # the LangGraph agent: its debugging first query, then the checker
    {"match": "You are an agent that debugs", "turns": [f"```sql\n{FIX}\n```"]},
    {"match": "double-checks", "turns": ["It counts the VIP table. THE QUERY IS CORRECT."]},
]


@pytest.fixture
def gw(tiny, shop_catalog):
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT,
                            default=f"```sql\n{ISSUE}\n```")
    with gateway(tiny, engine, shop_catalog, window=4096) as g:
        yield g


@pytest.mark.parametrize("agent,tags", [("openai", ["agent", "agent"]), ("langgraph", ["write", "check"])])
def test_an_example_agent_fixes_a_critic_task_and_the_judge_rewards_it(gw, agent, tags):
    gw.rollouts.offer("g1", critic_task(), 2)
    gw.rollouts.finish()
    report = client_loop(0, gw.url, KEY, agent, {"max_turns": 2, "max_retries": 0})
    assert (report.claimed, report.completed, report.failed, report.refused) == (2, 2, 0, 0), report.errors
    assert len(report.rewards) == 2 and all(r > 0 for r in report.rewards)
    traces = gw.rollouts.drain()
    assert {t.final_sql for t in traces} == {FIX} and all(t.reward_parts["is_critic"] == 1.0 for t in traces)
    for t in traces:
        assert [c.tag for c in t.calls] == tags
        first = gw.model.policy.tokenizer.decode(list(t.calls[0].prompt_ids))
        assert PROBLEM in first and ISSUE in first  # the debugging prompt: the problem and the SQL to fix
    assert gw.pool.stats().in_use == 0
