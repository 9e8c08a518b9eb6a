"""One set of rollout engines per job: views with their own agent loop share the workers, another
checkpoint of the same family is loaded into the running engines (no restart), anything else
replaces them; release of a view keeps them running."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers", reason="the policy stack (transformers) is not installed")

from actors.rollout import PolicySpec, RolloutConfig, RolloutGroup  # noqa: E402
from sqlrl.agent.agent import Agent, AgentConfig, family_mismatch  # noqa: E402
from sqlrl.agent.loop import LoopConfig  # noqa: E402
from sqlrl.agent.request import GenerateRequest  # noqa: E402
from sqlrl.policy.load import load_policy, tiny_path  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402
from sqlrl.tasks.schema import DatabaseSchema  # noqa: E402

GREEDY = LoopConfig(mode="single", max_turns=1, max_total_tokens=2048,
                    sampling=SamplingParams(max_new_tokens=12, temperature=0.0, seed=0))


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory):
    """The tiny model with perturbed weights, saved as a checkpoint folder (same family)."""
    import torch

    policy = load_policy("tiny")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen))
    out = tmp_path_factory.mktemp("ckpt") / "other"
    policy.model.save_pretrained(out)
    policy.tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def requests(demo_db_path):
    schema = DatabaseSchema.from_sqlite(demo_db_path)
    return [GenerateRequest(f"r{i}", "shop", q, schema=schema)
            for i, q in enumerate(["How many customers?", "List every order placed in 2024."])]


def greedy(agent_or_group, items):
    return [t.token_ids for t in agent_or_group.rollout(items)] if isinstance(agent_or_group, RolloutGroup) \
        else [t.token_ids for t in agent_or_group.run(items)]


def test_a_loaded_checkpoint_generates_as_a_fresh_engine_on_it(other_checkpoint, requests):
    group = RolloutGroup(RolloutConfig(PolicySpec("tiny", backend="hf"), loop=GREEDY, in_process=True))
    try:
        before = greedy(group, requests)
        engine = group.workers.members[0].agent.backend
        group.load_checkpoint(PolicySpec(other_checkpoint, backend="hf"))
        assert group.workers.members[0].agent.backend is engine  # the same running engine
        assert group.workers.members[0].version == 0 and group.config.policy.model == other_checkpoint
        after = greedy(group, requests)
        fresh = Agent.build(AgentConfig(PolicySpec(other_checkpoint, backend="hf"), loop=GREEDY))
        try:
            assert after == greedy(fresh, requests)
        finally:
            fresh.close()
        assert after != before  # the perturbed weights write something else
    finally:
        group.shutdown()


def test_a_view_runs_its_own_loop_on_the_same_workers(requests):
    group = RolloutGroup(RolloutConfig(PolicySpec("tiny", backend="hf"), loop=GREEDY, in_process=True))
    try:
        longer = group.with_loop(dataclasses.replace(GREEDY, sampling=dataclasses.replace(GREEDY.sampling,
                                                                                          max_new_tokens=20)))
        assert longer.workers is group.workers and group.config.loop == GREEDY
        short, long_ = group.rollout(requests[:1])[0], longer.rollout(requests[:1])[0]
        assert long_.n_generated > short.n_generated == 12  # each call ran its own loop's budget
        assert long_.token_ids[:len(short.token_ids)] == short.token_ids  # greedy: the same start
    finally:
        group.shutdown()


def test_another_family_is_refused_before_anything_loads(tmp_path):
    a = load_policy("tiny")
    b = load_policy("tiny")
    assert family_mismatch(a, b) is None
    b.model.config.rms_norm_eps = 1e-3
    assert "configuration" in family_mismatch(a, b)
    assert "end/pad tokens" in family_mismatch(a, dataclasses.replace(b, eos_token_ids=(99,)))
    group = RolloutGroup(RolloutConfig(PolicySpec("tiny", backend="hf"), loop=GREEDY, in_process=True))
    try:
        (tmp_path / "x").mkdir()
        b.model.save_pretrained(tmp_path / "x")
        b.tokenizer.save_pretrained(tmp_path / "x")
        worker = group.workers.members[0]
        before = {k: v.clone() for k, v in worker.policy.model.state_dict().items()}
        with pytest.raises(ValueError, match="cannot be served by this agent's engine: another model configuration"):
            group.load_checkpoint(PolicySpec(str(tmp_path / "x"), backend="hf"))
        after = worker.policy.model.state_dict()
        assert all((before[k] == after[k]).all() for k in before) and group.config.policy.model == "tiny"
    finally:
        group.shutdown()


class FakeGroup:
    """Stands in for RolloutGroup in the Runtime's bookkeeping (no engines)."""

    made: list = []

    def __init__(self, spec, loop, refuse=False):
        self.config = SimpleNamespace(policy=spec, loop=loop)
        self.workers = object()
        self.loaded, self.down, self.refuse = [], False, refuse
        FakeGroup.made.append(self)

    def with_loop(self, loop):
        view = copy.copy(self)
        view.config = SimpleNamespace(policy=self.config.policy, loop=loop)
        return view

    def load_checkpoint(self, spec):
        if self.refuse:
            raise ValueError("another tokenizer")
        self.loaded.append(spec.model)
        self.config.policy = spec

    def shutdown(self):
        self.down = True


@pytest.fixture
def runtime(monkeypatch):
    import jobs.runtime as runtime
    from curriculum.config import StageConfig

    FakeGroup.made = []
    refuse = {"flag": False}
    monkeypatch.setattr(runtime, "rollout_group",
                        lambda pool, schemas, spec, loop, **kw: FakeGroup(spec, loop, refuse["flag"]))
    monkeypatch.setattr("actors.rollout.RolloutGroup", FakeGroup)  # release() recognises views of it
    rt = runtime.Runtime.__new__(runtime.Runtime)
    rt.cfg, rt.data, rt.ray, rt.pool, rt.asks = StageConfig(), SimpleNamespace(schemas={}), False, None, None
    rt._groups, rt._workers, rt.engine_starts = [], None, 0
    rt.rewards = SimpleNamespace(shutdown=lambda: None)
    rt.pool = SimpleNamespace(shutdown=lambda: None)
    return rt, refuse


def test_the_job_starts_engines_once_per_family(runtime):
    rt, refuse = runtime
    single = rt.rollout_group("tiny", "single", temperature=0.0)
    agentic = rt.rollout_group("tiny", "agentic", temperature=0.0)
    assert rt.engine_starts == 1 and single.workers is agentic.workers
    assert (single.config.loop.mode, agentic.config.loop.mode) == ("single", "agentic")
    rt.release(single)
    assert not FakeGroup.made[0].down  # a view's release keeps the engines
    rt.rollout_group("/ckpt/final", "single", temperature=0.0)  # same family: loaded, not restarted
    assert rt.engine_starts == 1 and FakeGroup.made[0].loaded == ["/ckpt/final"]
    refuse["flag"] = True
    FakeGroup.made[0].refuse = True
    rt.rollout_group("/other/family", "single", temperature=0.0)  # refused: new engines, old ones down
    assert rt.engine_starts == 2 and FakeGroup.made[0].down
    rt.cfg = dataclasses.replace(rt.cfg, rollout=dataclasses.replace(rt.cfg.rollout, dtype="bfloat16"))
    rt.rollout_group("/other/family", "single", temperature=0.0)  # another dtype: new engines
    assert rt.engine_starts == 3 and FakeGroup.made[1].down
    rt.close()
    assert FakeGroup.made[2].down
