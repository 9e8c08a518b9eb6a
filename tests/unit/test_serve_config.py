"""serve/config.yaml against Ray's own Serve schema, and the app's config against ServeConfig."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_serve_config_file_passes_rays_schema_and_ours():
    from ray.serve.schema import ServeDeploySchema

    from serve.config import load_serve_config

    data = yaml.safe_load((ROOT / "serve/config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(data)
    app = schema.applications[0]
    assert app.import_path == "serve.app:build_app"
    cfg = load_serve_config(app.args)
    assert set(cfg.models) == {"talon", "zeno"} and cfg.sql_models == {"debug": "talon", "generate": "zeno"}


def test_bad_serve_configs_are_named():
    from serve.config import load_serve_config
    from sqlrl.config import ConfigError

    with pytest.raises(ConfigError, match="models.m.mxa_batch"):
        load_serve_config({"models": {"m": {"policy": {"model": "tiny"}, "mxa_batch": 1}}})
    with pytest.raises(ConfigError, match="max_ongoing_requests"):
        load_serve_config({"models": {"m": {"policy": {"model": "tiny"}, "max_batch_size": 8,
                                            "max_ongoing_requests": 4}}})
    with pytest.raises(ConfigError, match="no models"):
        load_serve_config({})
    with pytest.raises(ConfigError, match="max_queued_requests"):
        load_serve_config({"models": {"m": {"policy": {"model": "tiny"}, "max_queued_requests": -2}}})


@pytest.mark.parametrize("old, new", [("path", "policy.model"), ("backend", "policy.backend"),
                                      ("backend_options", "policy.engine_options"), ("dtype", "policy.dtype"),
                                      ("device", "policy.device")])
def test_a_key_of_the_old_model_spec_names_the_key_to_write(old, new):
    from serve.config import load_serve_config
    from sqlrl.config import ConfigError

    with pytest.raises(ConfigError) as e:
        load_serve_config({"models": {"m": {"policy": {"model": "tiny"}, old: "x"}}})
    assert f"models.m.{old} was renamed: write models.m.{new} instead" in str(e.value)


def test_the_served_policy_is_the_one_policy_spec():
    """``models.NAME.policy`` is a ``PolicySpec`` with training's keys, defaults and spellings; serving
    refuses what it cannot run and an engine option that ``max_batch_size`` sets."""
    from serve.config import load_serve_config
    from sqlrl.config import ConfigError
    from sqlrl.policy.spec import PolicySpec

    spec = load_serve_config({"models": {"m": {"policy": {"model": "tiny", "dtype": "bf16",
                                                          "engine_options": {"prefix_cache": False}}}}}).models["m"]
    assert spec.policy == PolicySpec("tiny", dtype="bfloat16", engine_options={"prefix_cache": False})
    with pytest.raises(ConfigError, match="'hf-batched' cannot serve; serving runs: auto, hf"):
        load_serve_config({"models": {"m": {"policy": {"model": "tiny", "backend": "hf-batched"}}}})
    for option in ("max_batch", "max_num_seqs"):
        with pytest.raises(ConfigError, match=f"engine_options.{option}: .*set max_batch_size instead"):
            load_serve_config({"models": {"m": {"policy": {"model": "tiny", "engine_options": {option: 4}}}}})
    with pytest.raises(ConfigError, match="models.m.policy.engine_options: expected a mapping"):
        load_serve_config({"models": {"m": {"policy": {"model": "tiny", "engine_options": 4}}}})
    with pytest.raises(ConfigError, match="unknown precision"):
        load_serve_config({"models": {"m": {"policy": {"model": "tiny", "dtype": "fp8"}}}})


def test_in_flight_limit_is_every_replica_slot_plus_the_queue():
    from serve.config import load_serve_config

    cfg = load_serve_config({"models": {
        "a": {"policy": {"model": "tiny"}, "max_batch_size": 4, "max_ongoing_requests": 8,
              "num_replicas": 3, "max_queued_requests": 2},
        "b": {"policy": {"model": "tiny"}, "max_queued_requests": -1}}})
    assert cfg.models["a"].in_flight_limit(colocate=False) == 26
    assert cfg.models["a"].in_flight_limit(colocate=True) == 10  # the ingress replica's own model
    assert cfg.models["b"].in_flight_limit(colocate=False) is None


def test_jobs_serve_flags_build_the_app_args(tmp_path, monkeypatch):
    from jobs.serve import build_args, main
    from serve.config import load_serve_config

    def args(*argv):
        import argparse

        ap = argparse.ArgumentParser()
        for flag in ("--model", "--database"):
            ap.add_argument(flag, action="append", default=[])
        ap.add_argument("--config")
        ap.add_argument("--backend", default="hf")
        ap.add_argument("--no-auth", action="store_true")
        return load_serve_config(build_args(ap.parse_args(argv)))

    one = args("--model", "zeno=runs/main/stage4/final", "--database", "shop=sqlite:///x.sqlite")
    assert one.sql_models == {"debug": "zeno", "generate": "zeno"}  # one model answers both endpoints
    assert one.models["zeno"].policy.model == "runs/main/stage4/final"
    assert one.databases["shop"].url == "sqlite:///x.sqlite"
    two = args("--model", "talon=a", "--model", "zeno=b", "--no-auth")
    assert two.sql_models == {"debug": "talon", "generate": "zeno"} and not two.auth.required
    conf = tmp_path / "c.yaml"
    conf.write_text("sql_models: {debug: zeno, generate: zeno}\nmodels: {talon: {policy: {model: tiny}}}\n")
    assert args("--config", str(conf), "--model", "zeno=tiny").sql_models == {"debug": "zeno", "generate": "zeno"}
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        args("--model", "zeno")
    # no API keys and auth required: a clear refusal before Ray starts
    monkeypatch.delenv("SQLRL_SERVE_API_KEYS", raising=False)
    assert main(["--model", "zeno=tiny"]) == 2
