"""Debugging tasks in the gateway-driven jobs: ``jobs.train_agent``'s ``data.kinds`` picks the
embedded task kinds (the gateway hands out only those: a kind the job does not train on never
appears), a reward that cannot score a chosen kind is refused with the config, and the stage
trainer (``trainer: gateway``) runs a mixture of text-to-SQL and critic tasks through the gateway
with the plain-openai example agent (slow: the tiny model)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from sqlrl.gateway.job import AgentJobConfig, DataSpec

from .conftest import shop_task
from .test_gw_critic import critic_task


def test_the_job_trains_on_the_kinds_its_config_names():
    from sqlrl.config import load_config

    shipped = load_config(AgentJobConfig, "jobs/configs/agent.yaml")
    assert shipped.data.kinds == ("text2sql",) and shipped.gateway_config().task_kinds == ("text2sql",)
    both = load_config(AgentJobConfig, "jobs/configs/agent.yaml", ["data.kinds=[text2sql,critic]"])
    assert both.gateway_config().task_kinds == ("text2sql", "critic") and both.reward == "hybrid_agentic"


@pytest.mark.parametrize("data,reward,match", [
    ({"kinds": ()}, "hybrid_agentic", "data.kinds must be a non-empty list"),
    ({"kinds": ("nope",)}, "hybrid_agentic", "unknown task kind 'nope'"),
    ({"kinds": ("critic",)}, "bird_ex_agentic", "scores text2sql tasks, not critic"),
    ({"kinds": ("text2sql",)}, "critic_agentic", "scores critic tasks, not text2sql"),
])
def test_kinds_the_job_cannot_train_on_are_refused_before_anything_starts(data, reward, match):
    with pytest.raises(ValueError, match=match):
        AgentJobConfig(data=DataSpec(**data), reward=reward)


def test_the_embedded_tasks_hold_exactly_the_kinds_named(tmp_path):
    from jobs.train_agent import load_tasks

    spec = dict(synth_dir=str(tmp_path / "synth"), n_per_domain=4)
    only = load_tasks(DataSpec(**spec))[0]  # generated without debugging tasks
    both, catalog, schemas = load_tasks(DataSpec(**spec, kinds=("text2sql", "critic")))  # generated again, with them
    critic = load_tasks(DataSpec(**spec, kinds=("critic",)))[0]
    again = load_tasks(DataSpec(**spec))[0]
    assert Counter(t.kind for t in only) == Counter(t.kind for t in again) == {"text2sql": 4}
    assert [t.task_id for t in only] == [t.task_id for t in again]  # the same tasks, the same order
    assert set(Counter(t.kind for t in both)) == {"text2sql", "critic"} and set(catalog) == {"shop"}
    assert {t.kind for t in critic} == {"critic"} and all(t.issue_sql and t.sol_sql for t in critic)
    assert {t.task_id for t in both} == {t.task_id for t in only} | {t.task_id for t in critic}


class _Learner:
    def step(self, batch, loss, cfg):
        return {"loss": 0.0}

    def state_dict(self):
        return {}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a tiny model's generation on a loaded 2-core machine
def test_the_stage_trainer_hands_out_a_mixture_with_critic_tasks(shop_catalog, tmp_path):
    from curriculum.config import load_stage_config
    from curriculum.stages import STAGES
    from jobs.gateway_stage import train_stage
    from sqlrl.db import SessionPool
    from sqlrl.db.source import LocalSessions

    cfg = load_stage_config(STAGES["stage4"].config_path(), [
        "stage=stage4", "model.init=tiny", f"run_dir={tmp_path}", "trainer=gateway", "gateway.agent=openai",
        "gateway.clients=1", "rl.steps=1", "rl.tasks_per_step=2", "rl.group_size=2", "rl.sampling_rounds=1",
        "gateway.rollout_deadline_s=900", "gateway.max_tokens=16"])
    pool, logged = SessionPool(), []
    rt = SimpleNamespace(cfg=cfg, data=SimpleNamespace(catalog=shop_catalog), ray=False, asks=None,
                         learner=lambda model, optim, reference=False: _Learner(),
                         session_source=lambda: LocalSessions(shop_catalog, pool=pool))
    try:
        _, history = train_stage(rt, "tiny", [shop_task(), critic_task()], SimpleNamespace(
            log=lambda step, row: logged.append(row)))
    finally:
        pool.close()
    # both groups -- the text-to-SQL one and the debugging one -- were claimed by the client and completed
    assert [(h["rollouts"], h["completed"], h["expired"]) for h in history] == [(4, 4, 0)]
    assert history[-1]["gateway_active"] == 0 and history[-1]["gateway_waiting"] == 0
    assert pool.stats().in_use == 0
