"""``sqlrl.policy.spec.PolicySpec``: one spec of how a policy generates, one spelling of precision
(``fp32``/``bf16``/``fp16`` accepted as input, normalised), clear errors for bad values, and the
stage configs' ``rollout`` and ``model.mixed_precision`` keys going through it."""

from __future__ import annotations

import pickle
import re

import pytest

from curriculum.config import RolloutSettings, load_stage_config
from sqlrl.config import ConfigError
from sqlrl.policy.spec import DTYPES, PolicySpec, dtype_name


@pytest.mark.parametrize("given,canonical", [("fp32", "float32"), ("float32", "float32"), ("bf16", "bfloat16"),
                                             ("BF16", "bfloat16"), ("torch.bfloat16", "bfloat16"),
                                             ("fp16", "float16"), ("float16", "float16")])
def test_precision_aliases_are_normalised_to_one_spelling(given, canonical):
    assert dtype_name(given) == canonical
    assert PolicySpec("tiny", dtype=given).dtype == canonical
    assert RolloutSettings(dtype=given).dtype == canonical


@pytest.mark.parametrize("bad", ["fp8", "float64", "", "half-ish", 32, None])
def test_a_bad_precision_is_a_clear_error_naming_the_accepted_ones(bad):
    with pytest.raises(ValueError, match="unknown precision") as err:
        PolicySpec("tiny", dtype=bad)
    assert all(name in str(err.value) for name in (*DTYPES, "bf16"))


def test_bad_backend_device_model_or_options_are_refused_when_the_spec_is_made():
    with pytest.raises(ValueError, match="unknown backend 'tpu'.*hf"):
        PolicySpec("tiny", backend="tpu")
    with pytest.raises(ValueError, match="unknown device"):
        PolicySpec("tiny", device="gpu0")
    with pytest.raises(ValueError, match="PolicySpec.model"):
        PolicySpec("")
    with pytest.raises(ValueError, match="engine_options"):
        PolicySpec("tiny", engine_options=[("max_batch", 4)])  # type: ignore[arg-type]


def test_one_set_of_defaults_everywhere_a_policy_is_configured():
    from actors.rollout import RolloutConfig
    from sqlrl.agent.agent import AgentConfig

    spec = PolicySpec()
    assert (spec.backend, spec.dtype, spec.device) == ("auto", "float32", "auto")
    assert RolloutConfig().policy == spec and AgentConfig().policy == spec
    r = RolloutSettings()
    assert r.policy("tiny") == PolicySpec("tiny")  # the stage config's rollout section defaults to the spec's
    assert pickle.loads(pickle.dumps(PolicySpec("tiny", engine_options={"max_batch": 4}))).engine_options == {"max_batch": 4}


def test_stage_and_infer_configs_keep_loading_and_accept_the_aliases():
    from jobs.infer import InferConfig
    from sqlrl.config import load_config

    for n in (1, 2, 3, 4):
        cfg = load_stage_config(f"jobs/configs/stage{n}.yaml")
        assert cfg.rollout.dtype == "float32" and cfg.model.mixed_precision == "float32"
    cfg = load_stage_config("jobs/configs/stage4.yaml", ["rollout.dtype=bf16", "model.mixed_precision=bf16",
                                                         "rollout.backend=hf-batched",
                                                         "rollout.engine_options={max_batch: 8}"])
    assert (cfg.rollout.dtype, cfg.model.mixed_precision) == ("bfloat16", "bfloat16")
    spec = cfg.rollout.policy("tiny")
    assert (spec.backend, spec.dtype, spec.engine_options) == ("hf-batched", "bfloat16", {"max_batch": 8})
    infer = load_config(InferConfig, "jobs/configs/infer.yaml", ["rollout.dtype=fp16"])
    assert infer.rollout.dtype == "float16"


@pytest.mark.parametrize("override,message", [("rollout.dtype=fp8", "rollout.dtype|unknown precision"),
                                              ("model.mixed_precision=float16", "mixed_precision"),
                                              ("model.mixed_precision=fp8", "unknown precision"),
                                              ("rollout.backend=tpu", "unknown backend")])
def test_bad_values_in_a_stage_config_are_clear_errors(override, message):
    with pytest.raises((ValueError, ConfigError), match=message):
        load_stage_config("jobs/configs/stage3.yaml", [override])


# -- building: load (with or without weights), engine (options from the spec and the caller), auto ---


def test_a_policy_loaded_without_weights_has_the_tokenizer_and_end_tokens_of_the_full_load():
    """``load(weights=False)`` (a vLLM serving replica's: vLLM holds the only copy of the weights)."""
    spec = PolicySpec("tiny", dtype="bf16", device="cpu")
    light, full = spec.load(weights=False), spec.load()
    assert light.model is None and full.model is not None
    assert light.dtype == full.dtype == "bfloat16" and str(next(full.model.parameters()).dtype) == "torch.bfloat16"
    assert (light.path, light.eos_token_ids, light.pad_token_id) == (full.path, full.eos_token_ids, full.pad_token_id)
    assert light.tokenizer.padding_side == full.tokenizer.padding_side == "left"


def test_the_engine_gets_the_spec_options_and_the_callers_and_a_key_given_both_ways_is_refused():
    import asyncio

    spec = PolicySpec("tiny", backend="hf", engine_options={"prefix_cache": False})
    policy = spec.load()
    engine = spec.engine(policy, max_batch=3)  # serving's batch bound, as serve/engines.py gives it
    try:
        assert engine._scheduler.max_batch == 3 and engine.backend.prefix_cache is None
    finally:
        asyncio.run(engine.close())
    with pytest.raises(ValueError, match="max_batch.*remove them from engine_options"):
        PolicySpec("tiny", backend="hf", engine_options={"max_batch": 2}).engine(policy, max_batch=3)


def test_auto_resolves_to_the_engine_it_builds_with_the_options_that_engine_takes():
    from sqlrl.policy.backends import vllm_unavailable

    light = PolicySpec("tiny").load(weights=False)
    spec = PolicySpec("tiny", engine_options={"kv_cache_gb": 1, "max_batch": 4, "seed": 3})
    resolved = spec.resolved(light)
    if vllm_unavailable(light):  # CPU: no vLLM kernel for the tiny model's head size
        assert resolved == PolicySpec("tiny", backend="hf", engine_options={"max_batch": 4, "seed": 3})
    else:
        assert resolved == PolicySpec("tiny", backend="vllm", engine_options=spec.engine_options)
    hf = PolicySpec("tiny", backend="hf")
    assert hf.resolved(light) == hf


@pytest.fixture
def resolution(monkeypatch):
    """``register_resolution`` for one test; the registries are as they were after it."""
    from sqlrl.policy import backends

    saved = dict(backends.BACKENDS)

    def register(name, resolution):
        for registry in (backends.RESOLUTIONS, backends.ENGINES):
            monkeypatch.setitem(registry, name, None)  # the key is removed again after the test
        backends.register_resolution(name, resolution)

    yield register
    backends.BACKENDS.clear()
    backends.BACKENDS.update(saved)


def test_a_registered_resolution_is_handled_like_auto_without_naming_it(resolution, monkeypatch):
    """Nothing compares a backend name with "auto": a new resolution (here: the scripted engine, or
    hf, as a switch says; the options its pick's class does not take are dropped) resolves, places
    the policy, builds an engine and a backend, and is a served name, exactly as ``auto`` is."""
    import asyncio

    import torch

    from serve.engines import served_names
    from sqlrl.policy import backends
    from sqlrl.policy.scripted import ScriptedBackend, ScriptedEngine

    switch = {"to": "scripted"}
    resolution("canned", backends.Resolution(("scripted", "hf"), lambda policy: switch["to"], "scripted or hf",
                                             keeps={"scripted": ("sqlrl.policy.scripted:ScriptedBackend",
                                                                 "sqlrl.policy.scripted:ScriptedEngine")}))
    light = PolicySpec("tiny").load(weights=False)
    spec = PolicySpec("tiny", backend="canned", engine_options={"kv_cache_gb": 1, "seed": 2})
    assert spec.resolved(light) == PolicySpec("tiny", backend="scripted", engine_options={"seed": 2})
    assert "canned" in served_names() and list(backends.BACKENDS)[0] == "canned"
    engine = backends.make_engine("canned", light, kv_cache_gb=1)
    try:
        assert isinstance(engine, ScriptedEngine)
    finally:
        asyncio.run(engine.close())
    assert isinstance(backends.make_backend("canned", light, kv_cache_gb=1), ScriptedBackend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert backends.generation_device("auto", "canned", light) == "cpu"  # the scripted engine uses no weights
    switch["to"] = "hf"
    assert backends.generation_device("auto", "canned", light) == "cuda"  # hf generates with them
    assert spec.resolved(light) == PolicySpec("tiny", backend="hf", engine_options=spec.engine_options)


def test_a_resolution_to_an_unregistered_engine_or_another_resolution_is_refused(resolution):
    from sqlrl.policy import backends

    for targets, named in ((("hf", "tpu"), "tpu"), (("auto",), "auto"), ((), "(none given)")):
        with pytest.raises(ValueError, match=re.escape(f"targets must be registered engines, not resolutions; not: {named}")):
            backends.register_resolution("bad", backends.Resolution(targets, lambda policy: "hf", "?"))
    assert "bad" not in backends.ENGINES and "bad" not in backends.RESOLUTIONS


def test_a_resolution_that_picks_outside_its_targets_is_an_error(resolution):
    from sqlrl.policy import backends

    resolution("stray", backends.Resolution(("hf",), lambda policy: "vllm", "hf, it says"))
    light = PolicySpec("tiny").load(weights=False)
    with pytest.raises(ValueError, match="resolution picked 'vllm', which is not one of its targets hf"):
        PolicySpec("tiny", backend="stray").resolved(light)


def test_a_scripted_engine_option_gate_file_holds_requests_until_the_file_exists(tmp_path):
    """The cross-process gate (``sqlrl.policy.file_gate.FileGate``) that e2e serving tests use."""
    import asyncio

    from sqlrl.policy.types import SamplingParams

    gate_file = tmp_path / "open"
    spec = PolicySpec("tiny", backend="scripted",
                      engine_options={"gate_file": str(gate_file), "gate_after_tokens": 1, "gate_match": "Q-held"})
    policy = spec.load(weights=False)
    engine = spec.engine(policy)
    gate, = engine.gates
    ids = policy.tokenizer.encode("<|im_start|>user\nQ-held<|im_end|>\n<|im_start|>assistant\n",
                                  add_special_tokens=False)

    async def run():
        task = asyncio.ensure_future(engine.generate(ids, SamplingParams(max_new_tokens=8)))
        await gate.reached.wait()  # held before its second token
        assert not task.done() and engine.in_flight == 1
        gate_file.touch()  # the gate's watcher opens it
        return await asyncio.wait_for(task, 60)

    out = asyncio.run(run())
    assert len(out.token_ids) > 1 and gate.opened.is_set() and engine.in_flight == 0
