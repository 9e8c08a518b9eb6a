"""The agent job's step loop (sqlrl.gateway.job.run_steps) on a fake gateway and learner: what is
offered per step, when the gateway is told to finish, an update and a weight push only when a group
has a signal, the metrics row, a step that times out, and the config's refusals."""

from __future__ import annotations

import pytest

from sqlrl.gateway.contract import GatewayStats
from sqlrl.gateway.job import AgentJobConfig, StepTimeout, run_steps, step_tasks
from sqlrl.learn.config import GRPOConfig

from .test_seq_train import traced


class FakeGateway:
    """Every offered rollout completes at once; the first of each group gets ``reward`` (others 0)."""

    def __init__(self, reward: float = 1.0, end: bool = True) -> None:
        self.reward, self.end = reward, end
        self.events: list[tuple] = []
        self.pending: list = []
        self.version = 0

    def offer(self, group_id, task, n):
        self.events.append(("offer", group_id, task, n))
        self.pending += [traced(f"{group_id}-{k}", group_id, self.reward if k == 0 else 0.0) for k in range(n)]

    def finish(self):
        self.events.append(("finish",))

    def wait_step(self, timeout):
        self.events.append(("wait", timeout))
        return self.end

    def drain(self):
        out, self.pending = self.pending, []
        return out

    def stats(self):
        return GatewayStats(completed=len(self.events), waiting=0 if self.end else 3, active=0 if self.end else 1)

    def update_weights(self, weights, policy):
        self.events.append(("push", weights["w"], policy))
        self.version += 1
        return self.version


class FakeLearner:
    def __init__(self) -> None:
        self.steps = 0

    def step(self, batch, loss, loss_cfg):
        assert loss == "grpo" and batch is not None
        self.steps += 1
        return {"loss": 0.5, "version": self.steps}

    def state_dict(self):
        return {"w": self.steps}


CFG = AgentJobConfig(steps=3, tasks_per_step=2, group_size=2, update_policy="abort", loss=GRPOConfig())


def test_each_step_offers_its_groups_waits_drains_updates_and_pushes():
    gw, learner, logged = FakeGateway(), FakeLearner(), []
    rows = run_steps(CFG, ["t0", "t1", "t2"], gw, learner, pad_id=0, log=lambda s, m: logged.append((s, m)))
    offers = [e for e in gw.events if e[0] == "offer"]
    assert [(g, t) for _, g, t, _ in offers] == [("s0/g0", "t0"), ("s0/g1", "t1"), ("s1/g0", "t2"),
                                                  ("s1/g1", "t0"), ("s2/g0", "t1"), ("s2/g1", "t2")]
    assert all(n == 2 for *_, n in offers)
    assert gw.events.index(("finish",)) > gw.events.index(offers[-1])  # only after the last step's offers
    assert [e for e in gw.events if e[0] == "push"] == [("push", 1, "abort"), ("push", 2, "abort"), ("push", 3, "abort")]
    assert learner.steps == 3 and [s for s, _ in logged] == [0, 1, 2]
    row = rows[0]
    assert row["updated"] and row["policy_version"] == 1 and row["learner_loss"] == 0.5
    assert row["groups_trained"] == 2 and "gateway_completed" in row and row["time_rollout_s"] >= 0


def test_no_signal_no_update_and_no_push():
    gw, learner = FakeGateway(reward=0.0), FakeLearner()
    rows = run_steps(CFG, ["t0"], gw, learner, pad_id=0)
    assert learner.steps == 0 and not [e for e in gw.events if e[0] == "push"]
    assert all(not r["updated"] and r["groups_signal"] == 0 and r["policy_version"] == 0 for r in rows)


def test_a_step_whose_rollouts_never_end_is_a_clear_error():
    cfg = AgentJobConfig(steps=1, step_timeout_s=5.0)
    gw = FakeGateway(end=False)
    with pytest.raises(StepTimeout, match="3 rollout.s. never claimed and 1 still live after step_timeout_s=5.0"):
        run_steps(cfg, ["t0"], gw, FakeLearner(), pad_id=0)
    assert ("wait", 5.0) in gw.events


class ScriptedGateway(FakeGateway):
    """Each offered rollout ends as ``outcome(group_id, task, k)`` says: ``(status, reward)``; ``k``
    counts that group's offered rollouts (redraws go on counting)."""

    def __init__(self, outcome) -> None:
        super().__init__()
        self.outcome, self.counts = outcome, {}

    def offer(self, group_id, task, n):
        self.events.append(("offer", group_id, task, n))
        for _ in range(n):
            k = self.counts[group_id] = self.counts.get(group_id, -1) + 1
            status, reward = self.outcome(group_id, task, k)
            self.pending.append(traced(f"{group_id}-{k}", group_id, reward, status=status))


def test_a_dead_clients_rollout_is_redrawn_within_the_bound():
    # group g0: rollouts 0 and 1 expire (their clients died), the replacements complete; g1: every
    # one of its rollouts fails, so it gets exactly `redraws` replacements and is then left as is
    def outcome(group, task, k):
        if group.endswith("g1"):
            return "failed", 0.0
        return ("expired", 0.0) if k < 2 else ("completed", float(k % 2))

    gw = ScriptedGateway(outcome)
    cfg = AgentJobConfig(steps=1, tasks_per_step=2, group_size=2, redraws=3)
    (row,) = run_steps(cfg, ["t0", "t1"], gw, FakeLearner(), pad_id=0)
    offers = [e[1:] for e in gw.events if e[0] == "offer"]
    assert offers[:2] == [("s0/g0", "t0", 2), ("s0/g1", "t1", 2)]
    redraws = offers[2:]
    assert sum(n for g, _, n in redraws if g == "s0/g0") == 2  # both dead rollouts replaced once, same task
    assert sum(n for g, _, n in redraws if g == "s0/g1") == 3  # the bound: 3, then the group stays short
    assert all(t == {"s0/g0": "t0", "s0/g1": "t1"}[g] for g, t, _ in redraws)
    kinds = [e[0] for e in gw.events]  # with redraws: finish only once the last draw has settled
    assert kinds.index("finish") > max(i for i, k in enumerate(kinds) if k in ("offer", "wait"))
    assert row["redrawn"] == 5 and row["completed"] == 2 and row["failed"] == 2 and row["expired"] == 0
    assert row["groups_trained"] == 1 and row["updated"]  # g0: full again, rewards 0 and 1


def test_without_redraws_a_group_completes_without_its_dead_client():
    gw = ScriptedGateway(lambda g, t, k: ("expired", 0.0) if k == 0 else ("completed", 1.0))
    (row,) = run_steps(AgentJobConfig(steps=1, tasks_per_step=1, group_size=3), ["t0"], gw, FakeLearner(), pad_id=0)
    assert len([e for e in gw.events if e[0] == "offer"]) == 1
    assert row["redrawn"] == 0 and row["expired"] == 1 and row["completed"] == 2


def test_dynamic_sampling_draws_more_groups_until_enough_train():
    # tasks t0, t1 always give equal rewards; t2, t3 give a signal: two draws reach 2 trained groups
    signal = {"t2", "t3"}
    gw = ScriptedGateway(lambda g, t, k: ("completed", float(k % 2) if t in signal else 1.0))
    cfg = AgentJobConfig(steps=2, tasks_per_step=2, group_size=2, sampling_rounds=3)
    learner = FakeLearner()
    rows = run_steps(cfg, ["t0", "t1", "t2", "t3"], gw, learner, pad_id=0)
    offers = [e[1:3] for e in gw.events if e[0] == "offer"]
    assert offers[:4] == [("s0/g0", "t0"), ("s0/g1", "t1"), ("s0/g2", "t2"), ("s0/g3", "t3")]
    assert rows[0]["sampling_draws"] == 2 and rows[0]["groups_drawn"] == 4 and rows[0]["groups_trained"] == 2
    # step 1 goes on from the cursor: t0, t1 (flat), t2, t3 (signal) again
    assert offers[4:] == [("s1/g0", "t0"), ("s1/g1", "t1"), ("s1/g2", "t2"), ("s1/g3", "t3")]
    assert learner.steps == 2


def test_dynamic_sampling_stops_at_its_bound():
    gw = ScriptedGateway(lambda g, t, k: ("completed", 1.0))  # never a signal
    cfg = AgentJobConfig(steps=1, tasks_per_step=1, group_size=2, sampling_rounds=3)
    learner = FakeLearner()
    (row,) = run_steps(cfg, ["t0", "t1"], gw, learner, pad_id=0)
    assert row["sampling_draws"] == 3 and row["groups_drawn"] == 3 and not row["updated"] and learner.steps == 0
    # the last possible draw's offers, then at once finish (no redraws: nothing can follow)
    assert [e[0] for e in gw.events[-3:]] == ["offer", "finish", "wait"]


def test_step_tasks_cycle_and_refuse_an_empty_list():
    assert step_tasks(["a", "b", "c"], 1, 2) == ["c", "a"]
    with pytest.raises(ValueError, match="no tasks"):
        step_tasks([], 0, 2)


@pytest.mark.parametrize("bad,match", [
    ({"steps": 0}, "steps must be an int >= 1"),
    ({"group_size": True}, "group_size must be an int >= 1"),
    ({"update_policy": "later"}, "update_policy 'later' is not one of drain, abort, continue"),
    ({"during_update": "queue"}, "during_update"),
    ({"unfinished": "retry"}, "unfinished"),
    ({"train_tags": ()}, "train_tags"),
    ({"step_timeout_s": 0.0}, "step_timeout_s"),
    ({"redraws": -1}, "redraws must be an int >= 0"),
    ({"sampling_rounds": 0}, "sampling_rounds must be an int >= 1"),
    ({"sampling_rounds": 2, "drop_equal_groups": False}, "needs drop_equal_groups"),
    ({"gateway_host": "thread"}, "gateway_host 'thread' is not one of process, actor"),
    ({"gateway_host": "actor"}, "gateway_host: actor needs ray: true"),
    ({"rollout_deadline_s": -1.0}, "deadline_s"),
    ({"reward": "no-such-reward"}, "gateway.reward"),
    ({"gateway_max_restarts": -1, "ray": True}, "gateway_max_restarts must be an int >= 0 or null"),
    ({"gateway_max_restarts": True, "ray": True}, "gateway_max_restarts must be an int >= 0 or null"),
    ({"gateway_max_restarts": 2}, "gateway_max_restarts needs gateway_host: actor"),
    ({"gateway_max_restarts": 1, "ray": True, "gateway_host": "process"}, "needs gateway_host: actor"),
    ({"gateway_restart_timeout_s": 0.0}, "gateway_restart_timeout_s must be > 0"),
    ({"max_batch_size": 0}, "max_batch_size must be an int >= 1"),
    ({"policy": "tiny"}, "policy must be a PolicySpec"),
    ({"mixed_precision": "float16"}, "unknown mixed_precision 'float16'"),
])
def test_bad_config_is_refused_before_anything_starts(bad, match):
    with pytest.raises(ValueError, match=match):
        AgentJobConfig(**bad)


def test_the_shipped_config_loads():
    from sqlrl.config import load_config

    cfg = load_config(AgentJobConfig, "jobs/configs/agent.yaml", ["train_tags=[write,rewrite]"])
    assert cfg.train_tags == ("write", "rewrite") and cfg.update_policy == "drain" and not cfg.client_rewards
    assert cfg.redraws == 0 and cfg.sampling_rounds == 1 and cfg.host_kind == "process"
    assert load_config(AgentJobConfig, "jobs/configs/agent.yaml", ["ray=true"]).host_kind == "actor"
    # Ray restarts the gateway actor 3 times by default (the job always journals); in-process: never
    assert cfg.gateway_restarts == 0 and cfg.gateway_restart_timeout_s == 300
    assert load_config(AgentJobConfig, "jobs/configs/agent.yaml", ["ray=true"]).gateway_restarts == 3
    assert load_config(AgentJobConfig, "jobs/configs/agent.yaml",
                       ["ray=true", "gateway_max_restarts=0"]).gateway_restarts == 0
    assert AgentJobConfig(gateway_max_restarts=0).gateway_restarts == 0


def test_the_config_takes_one_policy_spec():
    """``policy`` is serving's PolicySpec (a partial section keeps the other defaults; precision
    normalised), ``max_batch_size`` serving's batch bound; the learner's precision is its own key."""
    from jobs.train_agent import model_spec
    from sqlrl.config import load_config
    from sqlrl.policy.spec import PolicySpec

    cfg = load_config(AgentJobConfig, "jobs/configs/agent.yaml",
                      ["policy.dtype=bf16", "policy.model=smollm2-135m", "max_batch_size=3", "mixed_precision=bf16"])
    assert cfg.policy == PolicySpec("smollm2-135m", backend="hf", dtype="bfloat16")
    assert cfg.mixed_precision == "bfloat16" and cfg.max_batch_size == 3
    spec = model_spec(cfg)  # what the gateway builds its engine from (serve.engines.build_served)
    assert spec.policy == cfg.policy and spec.max_batch_size == 3
    assert load_config(AgentJobConfig, None, ["policy={model: tiny}"]).policy == PolicySpec("tiny", backend="hf")
    assert model_spec(AgentJobConfig(max_batch_size=64)).max_batch_size == 64  # above serving's default queue
    shipped = load_config(AgentJobConfig, "jobs/configs/agent.yaml")
    assert shipped.policy == AgentJobConfig().policy and shipped.mixed_precision == "float32"


@pytest.mark.parametrize("old,new", [("model=tiny", "policy.model"), ("backend=hf", "policy.backend"),
                                     ("max_batch=4", "max_batch_size")])
def test_the_old_policy_keys_name_the_new_one(old, new):
    from sqlrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=f"{old.split('=')[0]} was renamed: write {new} instead"):
        load_config(AgentJobConfig, "jobs/configs/agent.yaml", [old])


@pytest.mark.parametrize("over,match", [
    (["policy.backend=hf-batched"], "cannot serve"),
    (["policy.engine_options={max_batch: 2}"], "set max_batch_size instead"),
    (["policy.dtype=fp8"], "unknown precision"),
])
def test_a_policy_the_gateway_cannot_build_is_refused_by_the_job(over, match, monkeypatch):
    import jobs.train_agent
    from jobs.train_agent import main

    def started(cfg):
        raise AssertionError("the job started")

    monkeypatch.setattr(jobs.train_agent, "run", started)
    with pytest.raises(SystemExit, match=match):
        main(["--config", "jobs/configs/agent.yaml", *over])
