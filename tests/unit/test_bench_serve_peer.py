"""bench/serve_peer.py's argument and config helpers (no server, no engine started): ``--variants``
accepts ``ray-serve-llm`` beside the others and refuses unknown, repeated or no variants (``main``
exits 2 before starting anything); every vLLM variant's engine environment follows sqlrl's
small-machine rule; the Ray Serve LLM config carries the same engine settings as the other vLLM
variants and validates as Ray's own ``LLMServingArgs`` on CPU."""

from __future__ import annotations

import pytest

from bench.serve_peer import (KV_GB, MAX_MODEL_LEN, MAX_SEQS, VARIANTS, check_baseline, engine_env, main,
                              parse_variants, ray_serve_llm_config)


def test_ray_serve_llm_is_a_variant_and_the_order_is_kept():
    assert "ray-serve-llm" in VARIANTS
    assert parse_variants("vllm-server,ray-serve-llm") == ["vllm-server", "ray-serve-llm"]
    assert parse_variants(" ray-serve-llm , sqlrl-vllm,") == ["ray-serve-llm", "sqlrl-vllm"]


@pytest.mark.parametrize("text, message", [
    ("vllm-server,ray-serve", "unknown variant(s) ['ray-serve']"),
    ("sqlrl-vllm,ray-serve-llm,sqlrl-vllm", "repeated"),
    ("", "no variant"),
    (" , ", "no variant"),
])
def test_bad_variants_are_refused(text, message):
    with pytest.raises(ValueError) as e:
        parse_variants(text)
    assert message in str(e.value)


def test_main_exits_2_on_an_unknown_variant_before_starting_anything(capsys, tmp_path):
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as e:
        main(["--variants", "vllm-server,ray-serve-llx", "--out", str(out)])
    assert e.value.code == 2
    assert "unknown variant(s) ['ray-serve-llx']" in capsys.readouterr().err
    assert not out.exists()


def test_engine_env_reserves_no_core_only_on_small_machines(monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert engine_env(2) == {"VLLM_CPU_KVCACHE_SPACE": str(KV_GB), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert engine_env(64) == {"VLLM_CPU_KVCACHE_SPACE": str(KV_GB)}
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")  # the user's setting wins
    assert engine_env(2)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"


def test_ray_serve_llm_config_has_the_shared_engine_settings_and_validates_on_cpu(tmp_path):
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    args = ray_serve_llm_config(str(tmp_path), env)
    (llm,) = args["llm_configs"]
    assert llm["engine_kwargs"] == {"dtype": "float32", "enforce_eager": True, "enable_prefix_caching": True,
                                    "enable_chunked_prefill": False, "max_num_seqs": MAX_SEQS,
                                    "max_model_len": MAX_MODEL_LEN}
    assert llm["runtime_env"] == {"env_vars": env}
    pytest.importorskip("vllm")
    llm_api = pytest.importorskip("ray.serve.llm")
    parsed = llm_api.LLMServingArgs.model_validate(args)
    (config,) = parsed.llm_configs
    assert config.model_id == "m" and config.accelerator_config.kind == "cpu"
    assert config.engine_kwargs["max_num_seqs"] == MAX_SEQS


def test_the_baseline_defaults_to_vllm_server_and_must_be_a_variant():
    assert check_baseline(None, ["vllm-server", "ray-serve-llm"]) == "vllm-server"
    assert check_baseline(None, ["sqlrl-vllm", "ray-serve-llm"]) is None  # no ratios without one
    assert check_baseline("sqlrl-vllm", ["sqlrl-vllm", "ray-serve-llm"]) == "sqlrl-vllm"
    with pytest.raises(ValueError, match="--baseline vllm-server is not one of the variants"):
        check_baseline("vllm-server", ["sqlrl-vllm", "ray-serve-llm"])


def test_main_exits_2_on_a_baseline_that_does_not_run(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--variants", "sqlrl-vllm,ray-serve-llm", "--baseline", "sqlrl-hf", "--out", str(tmp_path / "r.json")])
    assert e.value.code == 2 and "--baseline sqlrl-hf is not one of the variants" in capsys.readouterr().err
