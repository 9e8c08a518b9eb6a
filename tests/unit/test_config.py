"""sqlrl.config: YAML + dotted overrides into frozen dataclasses, strictly."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from sqlrl.config import ConfigError, config_changes, dump_config, load_config, rename_keys, to_dict


@dataclass(frozen=True)
class Optim:
    lr: float = 1e-5
    steps: int = 10

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError("steps must be >= 1")


@dataclass(frozen=True)
class Cfg:
    model: str = "tiny"
    optim: Optim = field(default_factory=Optim)
    weights: dict[str, float] = field(default_factory=lambda: {"critic": 1.0})
    tags: tuple[str, ...] = ()
    mode: Literal["single", "agentic"] = "agentic"
    limit: int | None = None


def test_defaults_when_nothing_given():
    assert load_config(Cfg) == Cfg()


def test_file_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model: smol\noptim:\n  lr: 1e-4\nweights: {critic: 0.5, text2sql: 0.5}\n")
    cfg = load_config(Cfg, f, ["optim.steps=3", "tags=[a, b]", "mode=single", "limit=7"])
    assert cfg == Cfg(model="smol", optim=Optim(lr=1e-4, steps=3), weights={"critic": 0.5, "text2sql": 0.5},
                      tags=("a", "b"), mode="single", limit=7)


def test_round_trip_through_dump(tmp_path):
    cfg = load_config(Cfg, None, ["optim.lr=0.5", "tags=[x]"])
    dump_config(cfg, tmp_path / "out.yaml")
    assert load_config(Cfg, tmp_path / "out.yaml") == cfg
    assert to_dict(cfg)["optim"] == {"lr": 0.5, "steps": 10}


@pytest.mark.parametrize("overrides, message", [
    (["optim.lrr=1"], "unknown config key(s) optim.lrr"),
    (["nope=1"], "unknown config key(s) nope"),
    (["optim.steps=abc"], "optim.steps: expected an integer"),
    (["optim.steps=2.5"], "optim.steps: expected an integer"),
    (["mode=both"], "mode: 'both' is not one of"),
    (["weights.critic=high"], "weights.critic: expected a number"),
    (["optim.steps=0"], "steps must be >= 1"),
    (["model"], "not of the form dotted.key=value"),
    (["optim=3"], "expected a mapping"),
])
def test_bad_overrides_are_clear_errors(overrides, message):
    with pytest.raises(ConfigError, match=None) as info:
        load_config(Cfg, None, overrides)
    assert message in str(info.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Cfg, tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(Cfg, tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("a: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(Cfg, tmp_path / "broken.yaml")


def test_config_changes_names_every_differing_key_of_a_saved_config():
    import json

    cfg = Cfg(tags=("a",), weights={"critic": 0.5, "text2sql": 0.5})
    saved = json.loads(json.dumps(to_dict(cfg)))  # as read back from a run's summary.json
    assert config_changes(saved, cfg) == []  # tuples read back as lists are the same
    saved["optim"]["lr"] = 2e-5
    del saved["weights"]["text2sql"]
    saved["old_key"] = 1
    assert config_changes(saved, cfg) == ["old_key: 1 -> <absent>", "optim.lr: 2e-05 -> 1e-05",
                                          "weights.text2sql: <absent> -> 0.5"]
    assert config_changes(saved, cfg, ignore=("optim.lr", "old_key")) == ["weights.text2sql: <absent> -> 0.5"]
    assert config_changes({}, Cfg(weights={}))[-1] == "weights: <absent> -> {}"
    assert config_changes({}, Cfg(limit=3))[0] == "limit: <absent> -> 3"


def test_config_changes_accepts_a_field_added_later_at_its_default():
    """A run saved before a field existed matches a config that leaves the field at its default;
    the field set to anything else, or a missing dict entry, is still a change."""
    saved = to_dict(Cfg())
    del saved["limit"], saved["optim"]["steps"]
    assert config_changes(saved, Cfg()) == []
    assert config_changes(saved, Cfg(limit=4, optim=Optim(steps=3))) == ["limit: <absent> -> 4",
                                                                         "optim.steps: <absent> -> 3"]
    mixed = Cfg(weights={"critic": 0.5, "text2sql": 0.5})
    saved = to_dict(mixed)
    del saved["weights"]["text2sql"]
    assert config_changes(saved, mixed) == ["weights.text2sql: <absent> -> 0.5"]


@dataclass(frozen=True)
class Inner:
    name: str = "x"


@dataclass(frozen=True)
class Renamed:
    inner: Inner = field(default_factory=Inner)
    steps: int = 1


rename_keys(Renamed, {"name": "inner.name", "n_steps": "steps"})


def test_a_renamed_key_is_an_error_naming_the_key_to_write_instead():
    with pytest.raises(ConfigError) as info:
        load_config(Renamed, None, ["name=y"])
    assert "name was renamed: write inner.name instead" in str(info.value)
    with pytest.raises(ConfigError, match="n_steps was renamed: write steps instead"):
        load_config(Renamed, None, ["n_steps=2"])
    assert load_config(Renamed, None, ["inner.name=y"]) == Renamed(Inner("y"))
    with pytest.raises(ValueError, match="still a field"):
        rename_keys(Renamed, {"steps": "inner.name"})
    with pytest.raises(ValueError, match="is not one"):
        rename_keys(Renamed, {"old": "nope.name"})
