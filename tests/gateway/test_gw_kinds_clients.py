"""The example clients declare the task kinds their agent handles when they claim
(``examples.run_clients``: the agent module's ``KINDS``, narrowed by ``--kinds``): against the real
gateway app (scripted engine, real HTTP on loopback) a text-to-SQL-only client never sees a critic
task, a client that declares nothing still refuses a kind its agent does not handle (and leaves the
rollout to expire), and a job that hands out none of the declared kinds stops the client with the
gateway's 409 message instead of a wait. Events, not time: the loops end on the gateway's 410."""

from __future__ import annotations

import pytest

from examples.run_clients import ClaimRefused, _process, claim_kinds, client_loop, main
from sqlrl.gateway.rollouts import GatewayConfig
from sqlrl.policy.scripted import ScriptedEngine

from .conftest import GOLD, KEY, gateway, shop_task
from .test_gw_critic import critic_task

OPTIONS = {"max_turns": 2, "max_retries": 0}


@pytest.fixture
def engine(tiny):
    return ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=[], default=f"```sql\n{GOLD}\n```")


def test_a_text2sql_only_client_never_claims_a_critic_task(tiny, shop_catalog, engine):
    with gateway(tiny, engine, shop_catalog, window=4096) as gw:
        gw.rollouts.offer("g1", critic_task(), 1)
        gw.rollouts.offer("g2", shop_task("t1"), 2)
        gw.rollouts.finish()
        report = client_loop(0, gw.url, KEY, "openai", OPTIONS, kinds=("text2sql",))
        assert (report.claimed, report.completed, report.refused, report.failed) == (2, 2, 0, 0), report.errors
        assert all(r > 0 for r in report.rewards)
        assert gw.rollouts.stats().waiting == 1  # the critic task is left for a client that takes it
        report = client_loop(1, gw.url, KEY, "openai", OPTIONS)  # the agent's own kinds: text2sql and critic
        assert (report.claimed, report.completed) == (1, 1)
        assert {t.task_id for t in gw.rollouts.drain()} == {"t1", "c1"}


def test_a_client_that_declares_nothing_still_refuses_a_kind_its_agent_does_not_handle(tiny, shop_catalog, engine):
    from sqlrl.tasks.kinds import registered
    from tests.unit.test_fake_task_kind import REWRITE, rewrite

    with registered(REWRITE), gateway(tiny, engine, shop_catalog, window=4096) as gw:
        gw.rollouts.offer("g1", rewrite(), 1)
        gw.rollouts.offer("g2", shop_task("t1"), 1)
        gw.rollouts.finish()
        declared = client_loop(0, gw.url, KEY, "openai", OPTIONS)  # declares text2sql, critic: never sees rewrite
        assert (declared.claimed, declared.completed, declared.refused) == (1, 1, 0)
        undeclared = client_loop(1, gw.url, KEY, "openai", OPTIONS, kinds="any")
        assert (undeclared.claimed, undeclared.completed, undeclared.refused) == (1, 0, 1)
        assert "refused" in undeclared.errors[0] and "'rewrite' task" in undeclared.errors[0]
        assert gw.rollouts.stats().active == 1  # left to expire at its deadline, never scored


def test_a_job_that_hands_out_none_of_the_kinds_stops_the_client_with_its_reason(tiny, shop_catalog, engine):
    config = GatewayConfig(deadline_s=60, task_kinds=("critic",))
    with gateway(tiny, engine, shop_catalog, window=4096, config=config) as gw:
        with pytest.raises(ClaimRefused, match="hands out critic tasks"):
            client_loop(0, gw.url, KEY, "openai", OPTIONS, kinds=("text2sql",))
        args = {"gateway": gw.url, "api_key": KEY, "agent": "openai", "options": OPTIONS,
                "connect_timeout_s": 5.0, "kinds": ("text2sql",)}
        with pytest.raises(SystemExit) as exc:  # a client process: says why and exits 2
            _process(0, args)
        assert exc.value.code == 2
        assert gw.rollouts.stats().claimed == 0


def test_kinds_a_client_declares_must_be_its_agents():
    assert claim_kinds("openai") == ("text2sql", "critic")
    assert claim_kinds("openai", ("text2sql",)) == ("text2sql",) and claim_kinds("openai", "any") is None
    for bad in (("rewrite",), ("text2sql", "nope"), ()):
        with pytest.raises(ValueError, match="the openai agent handles text2sql, critic"):
            claim_kinds("openai", bad)
    with pytest.raises(SystemExit):  # the command line refuses it before any process starts
        main(["--gateway", "http://127.0.0.1:9", "--api-key", "k", "--agent", "openai", "--kinds", "rewrite"])
    with pytest.raises(ValueError, match="unknown agent"):
        claim_kinds("crewai")
