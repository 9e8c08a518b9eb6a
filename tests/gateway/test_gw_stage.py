"""Stage 4 as gateway-driven agent training, by configuration: ``trainer: gateway`` picks
``jobs.train.TRAINERS["gateway"]`` (the registry, no branch), refused for stages it cannot train;
the default curriculum keeps its own trainers. Then ``jobs.gateway_stage.train_stage`` on a stand-in
of the stage's runtime: the tiny model's gateway, one client process of the plain-openai example
agent, two steps, every rollout ended and its metrics logged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from curriculum.config import load_stage_config
from curriculum.stages import STAGES
from jobs.stage import check_trainer, describe_stage
from jobs.train import TRAINERS

from .conftest import shop_task


def stage_cfg(stage, *overrides, tmp_path=None):
    return load_stage_config(STAGES[stage].config_path(), [f"stage={stage}", "model.init=tiny",
                                                            *([f"run_dir={tmp_path}"] if tmp_path else []), *overrides])


def test_trainer_gateway_is_a_config_choice_for_the_agentic_stage():
    cfg = stage_cfg("stage4", "trainer=gateway", "gateway.agent=langgraph", "gateway.clients=3",
                    "gateway.train_tags=[write,rewrite]")
    assert cfg.trainer_name == "gateway" and cfg.gateway.train_tags == ("write", "rewrite")
    check_trainer(cfg)
    assert TRAINERS[cfg.trainer_name].train.__name__ == "train_gateway"
    assert "through the training gateway, 3 langgraph client process(es)" in describe_stage(cfg, "tiny", None)


def test_the_default_curriculum_keeps_its_trainers():
    for name, spec in STAGES.items():
        cfg = stage_cfg(name)
        assert cfg.trainer is None and cfg.trainer_name == spec.trainer
        check_trainer(cfg)


@pytest.mark.parametrize("stage,trainer,match", [
    ("stage3", "gateway", "trains on tasks in agentic mode; stage3 builds tasks in single mode"),
    ("stage1", "gateway", "stage1 builds SFT examples"),
    ("stage4", "sft", "trainer 'sft' trains on SFT examples"),
    ("stage4", "nope", "trainer 'nope' is not one of"),
])
def test_a_trainer_the_stage_cannot_use_is_refused(stage, trainer, match):
    with pytest.raises(ValueError, match=match):
        check_trainer(stage_cfg(stage, f"trainer={trainer}"))


def test_bad_gateway_settings_are_refused():
    from sqlrl.config import ConfigError

    with pytest.raises((ValueError, ConfigError), match="gateway.clients"):
        stage_cfg("stage4", "gateway.clients=0")


@pytest.mark.parametrize("rollout,expected", [
    (["rollout.backend=vllm", "rollout.dtype=bf16", "rollout.device=cpu", "rollout.engine_options={kv_cache_gb: 2}"],
     ("vllm", "bfloat16", "cpu", {"kv_cache_gb": 2})),
    (["rollout.backend=hf", "rollout.dtype=fp16", "rollout.engine_options={prefix_cache: false}"],
     ("hf", "float16", "auto", {"prefix_cache": False})),
    ([], ("auto", "float32", "auto", {})),  # the defaults: the built-in rollouts' auto, not a fixed hf
])
def test_the_stages_rollout_policy_is_the_gateways_engine(rollout, expected, tmp_path):
    """``stage_job_config``: the gateway's engine is ``rollout.policy(start checkpoint)`` -- the same
    PolicySpec the built-in rollout workers get -- bounded to ``rollout.batch`` sequences, and it is
    what the gateway's serving spec (``model_spec``) builds."""
    from jobs.gateway_stage import stage_job_config
    from jobs.train_agent import model_spec
    from sqlrl.policy.spec import PolicySpec

    cfg = stage_cfg("stage4", "trainer=gateway", "rollout.batch=5", *rollout, tmp_path=tmp_path)
    check_trainer(cfg)
    agent = stage_job_config(cfg, "runs/x/stage3/final", "key", kinds=("text2sql", "critic"))
    backend, dtype, device, options = expected
    assert agent.policy == PolicySpec("runs/x/stage3/final", backend=backend, dtype=dtype, device=device,
                                      engine_options=options) == cfg.rollout.policy("runs/x/stage3/final")
    assert agent.max_batch_size == 5 and agent.data.kinds == ("text2sql", "critic")
    served = model_spec(agent)
    assert served.policy == agent.policy and served.max_batch_size == 5


def test_train_stage_hands_the_gateway_the_stages_rollout_policy(monkeypatch, tmp_path):
    import jobs.gateway_stage

    cfg = stage_cfg("stage4", "trainer=gateway", "rollout.backend=scripted", "rollout.dtype=bf16", tmp_path=tmp_path)
    got = {}

    def gateway_steps(agent_cfg, tasks, catalog, learner, sessions, asks, **kw):
        got["agent_cfg"] = agent_cfg
        return [], "http://x", 0

    monkeypatch.setattr(jobs.gateway_stage, "gateway_steps", gateway_steps)
    rt = SimpleNamespace(cfg=cfg, data=SimpleNamespace(catalog={}), ray=False, asks=None, session_source=lambda: None,
                         learner=lambda model, optim, reference=False: _Learner())
    jobs.gateway_stage.train_stage(rt, "tiny", [shop_task()], SimpleNamespace(log=lambda step, row: None))
    assert got["agent_cfg"].policy == cfg.rollout.policy("tiny")
    assert (got["agent_cfg"].policy.backend, got["agent_cfg"].policy.dtype) == ("scripted", "bfloat16")


@pytest.mark.parametrize("setting,match", [
    ("rollout.backend=hf-batched", r"rollout.backend 'hf-batched': trainer: gateway serves the stage's policy on a "
                                   r"serving engine, and serving cannot run this one; use one of auto, hf, vllm, scripted"),
    ("rollout.backend=vllm-batched", r"rollout.backend 'vllm-batched': .* use one of auto, hf, vllm, scripted"),
    ("rollout.engine_options={max_batch: 4}", r"rollout.engine_options.max_batch: with trainer: gateway the engine "
                                              r"runs rollout.batch sequences at once; set rollout.batch instead"),
    ("rollout.engine_options={max_num_seqs: 4}", r"rollout.engine_options.max_num_seqs: .* set rollout.batch instead"),
])
def test_a_rollout_setting_the_gateway_cannot_honour_is_refused_before_any_work(setting, match, tmp_path):
    """Refused by the stage job's config check (``check_stage`` -> ``check_trainer``), naming the key;
    the built-in trainer runs the same setting."""
    from jobs.stage import check_stage

    check_trainer(stage_cfg("stage4", setting, tmp_path=tmp_path))  # grpo: its rollout workers run it
    cfg = stage_cfg("stage4", "trainer=gateway", setting, tmp_path=tmp_path)
    with pytest.raises(ValueError, match=match):
        check_trainer(cfg)
    with pytest.raises(SystemExit, match="^stage4: " + match):
        check_stage(cfg)


class _Learner:
    def step(self, batch, loss, cfg):
        return {"loss": 0.0}

    def state_dict(self):
        return {}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a tiny model's generation on a loaded 2-core machine
def test_train_stage_runs_the_stage_steps_through_the_gateway(shop_catalog, tmp_path):
    from sqlrl.db import SessionPool
    from sqlrl.db.source import LocalSessions
    from jobs.gateway_stage import train_stage

    cfg = stage_cfg("stage4", "trainer=gateway", "gateway.agent=openai", "gateway.clients=1", "rl.steps=2",
                    "rl.tasks_per_step=1", "rl.group_size=2", "rl.sampling_rounds=2", "gateway.rollout_deadline_s=900", "gateway.max_tokens=16", tmp_path=tmp_path)
    pool, logged = SessionPool(), []
    rt = SimpleNamespace(cfg=cfg, data=SimpleNamespace(catalog=shop_catalog), ray=False, asks=None,
                         learner=lambda model, optim, reference=False: _Learner(),
                         session_source=lambda: LocalSessions(shop_catalog, pool=pool))
    logger = SimpleNamespace(log=lambda step, row: logged.append((step, row)))
    try:
        learner, history = train_stage(rt, "tiny", [shop_task()], logger)
    finally:
        pool.close()
    assert isinstance(learner, _Learner) and [s for s, _ in logged] == [0, 1]
    # the random tiny model earns 0 everywhere: no group has a signal, so dynamic sampling draws twice
    assert [(h["rollouts"], h["completed"], h["sampling_draws"]) for h in history] == [(4, 4, 2), (4, 4, 2)]
    assert history[-1]["gateway_active"] == 0 and history[-1]["gateway_waiting"] == 0
    assert (tmp_path / "stage4" / "gateway" / "gateway.json").is_file()
