"""``sqlrl.policy.spec.PolicySpec``: one spec of how a policy generates, one spelling of precision
(``fp32``/``bf16``/``fp16`` accepted as input, normalised), clear errors for bad values, and the
stage configs' ``rollout`` and ``model.mixed_precision`` keys going through it."""

from __future__ import annotations

import pickle

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
