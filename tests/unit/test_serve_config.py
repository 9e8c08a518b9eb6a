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
        load_serve_config({"models": {"m": {"path": "tiny", "mxa_batch": 1, "max_ongoing_requests": 1}}})
    with pytest.raises(ConfigError, match="max_ongoing_requests"):
        load_serve_config({"models": {"m": {"path": "tiny", "max_batch_size": 8, "max_ongoing_requests": 4}}})
    with pytest.raises(ConfigError, match="no models"):
        load_serve_config({})
