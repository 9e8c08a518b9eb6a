"""``rollout.device`` (``sqlrl.policy.backends.generation_device``): where the policy's own weights
generate. ``auto`` is the GPU only when the process sees one and the backend is not vLLM; an unknown
device is refused where it is configured (agent, rollout worker, stage config)."""

from __future__ import annotations

import pytest

from sqlrl.policy import backends


@pytest.fixture
def gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_auto_is_the_cpu_without_a_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert [backends.generation_device("auto", b, None) for b in ("hf", "scripted", "auto")] == ["cpu"] * 3


def test_auto_is_the_gpu_for_hf_and_the_cpu_beside_vllm(gpu, monkeypatch):
    assert backends.generation_device("auto", "hf", None) == "cuda"
    assert backends.generation_device("auto", "scripted", None) == "cpu"  # canned turns: no weights used
    assert backends.generation_device("auto", "vllm", None) == "cpu"  # vLLM holds its own copy
    monkeypatch.setattr(backends, "vllm_unavailable", lambda policy: None)
    assert backends.generation_device("auto", "auto", None) == "cpu"  # auto resolves to vLLM
    monkeypatch.setattr(backends, "vllm_unavailable", lambda policy: "vllm is not installed")
    assert backends.generation_device("auto", "auto", None) == "cuda"  # auto falls back to hf


def test_an_explicit_device_is_kept(gpu):
    assert backends.generation_device("cpu", "hf", None) == "cpu"
    assert backends.generation_device("cuda:1", "vllm", None) == "cuda:1"


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "", "CPU", "mps"])
def test_an_unknown_device_is_refused_where_it_is_configured(bad):
    from curriculum.config import RolloutSettings
    from sqlrl.policy.spec import PolicySpec

    for make in (lambda: PolicySpec(device=bad), lambda: RolloutSettings(device=bad)):
        with pytest.raises(ValueError, match="unknown device"):
            make()


def test_the_stage_config_key_reaches_the_rollout_worker(monkeypatch):
    """rollout.device and rollout.dtype from a stage config reach the in-process worker's policy."""
    from curriculum.config import load_stage_config
    from jobs.runtime import rollout_group, loop_config
    from curriculum.placement import load_profile
    import actors.rollout as rollout

    seen = {}
    monkeypatch.setattr(rollout.Agent, "build", classmethod(lambda cls, config, **kw: seen.setdefault("c", config)))
    cfg = load_stage_config("jobs/configs/stage3.yaml", ["rollout.device=cpu", "rollout.dtype=bf16"])
    assert (cfg.rollout.device, cfg.rollout.dtype) == ("cpu", "bfloat16")
    rollout_group(None, {}, cfg.rollout.policy("tiny"), loop_config("single", max_turns=1, max_total_tokens=64,
                                                                    max_new_tokens=8, temperature=1.0),
                  workers=0, asks=load_profile("cpu"))
    assert (seen["c"].policy.device, seen["c"].policy.dtype, seen["c"].policy.model) == ("cpu", "bfloat16", "tiny")


def test_a_worker_generates_on_its_device():
    from actors.rollout import PolicySpec, RolloutConfig, RolloutWorker

    worker = RolloutWorker(0, RolloutConfig(PolicySpec("tiny", device="cpu"), in_process=True))
    assert worker.policy.device.type == "cpu"


def test_a_served_model_refuses_an_unknown_device():
    from serve.config import load_serve_config
    from sqlrl.config import ConfigError

    assert load_serve_config({"models": {"m": {"policy": {"model": "tiny"}}}}).models["m"].policy.device == "auto"
    with pytest.raises(ConfigError, match="unknown device"):
        load_serve_config({"models": {"m": {"policy": {"model": "tiny", "device": "gpu0"}}}})
